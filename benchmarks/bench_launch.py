"""Host time per launch: torch eager, Triton's JIT, forge-aot's kernel handle and op, and the C floor.

For a 4-argument kernel (vector add) and a 19-argument one (benchmarks/launch/launch_kernels.py), on tiny
inputs so that the host, not the GPU, sets the pace. Each contender is timed over --calls calls, --rounds
rounds, contenders interleaved in rotating order; reported: the median µs per call and the spread over rounds.
The C floor is `cuLaunchKernel` in a C loop on the very cubin the wheel ships (benchmarks/launch/launch_floor.c,
compiled here with `cc`). Needs the forge_launch wheel installed:

    forge-aot build --manifest benchmarks/launch/kernel_manifest.toml --out dist
    pip install --no-index --no-deps dist/forge_launch-*.whl
    python benchmarks/bench_launch.py --json launch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def per_call_us(fn, calls: int) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def c_floor(cubin: Path, function: str, nargs: int, calls: int) -> float | None:
    exe = Path("/tmp/forge_launch_floor")
    src = REPO / "benchmarks" / "launch" / "launch_floor.c"
    try:
        subprocess.run(["cc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True, capture_output=True)
        out = subprocess.run([str(exe), str(cubin), function, str(nargs), str(calls)], check=True,
                             capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"C floor unavailable: {exc}", file=sys.stderr)
        return None
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import forge_launch
    import torch
    import triton

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks" / "launch"))
    from launch_kernels import args19_kernel as jit_args19

    from kernels.vector_add import add_kernel as jit_add

    n = 4096
    x, y, z, w = (torch.randn(n, device="cuda") for _ in range(4))
    o = torch.empty_like(x)
    add = sys.modules["forge_launch._ops.vector_add"].add_kernel
    a19 = sys.modules["forge_launch._ops.launch_kernels"].args19_kernel
    grid = (triton.cdiv(n, 1024),)
    a19_args = (o, x, y, z, w, n, 1.0, 2.0, 3.0, 4.0, 1, 1, 1, 1, 0, 0, 0, 0, 0)
    cases = {
        "4 args": {
            "torch.add(x, y, out=o)": lambda: torch.add(x, y, out=o),
            "torch x + y (allocates)": lambda: x + y,
            "triton-jit kernel[grid](...)": lambda: jit_add[grid](x, y, o, n, BLOCK_SIZE=1024),
            "forge-aot kernel[grid](...)": lambda: add[grid](x, y, o, n),
            "forge-aot op (allocates)": lambda: forge_launch.vector_add(x, y),
        },
        "19 args": {
            "triton-jit kernel[grid](...)": lambda: jit_args19[grid](*a19_args, BLOCK=1024),
            "forge-aot kernel[grid](...)": lambda: a19[grid](*a19_args, BLOCK=1024),
            "forge-aot op (allocates)": lambda: forge_launch.args19(x, y, z, w),
        },
    }
    for fns in cases.values():  # warm up: module loads, JIT compiles, caches
        for fn in fns.values():
            for _ in range(200):
                fn()
    torch.cuda.synchronize()
    root = Path(forge_launch.__file__).parent / "_forge" / "bin"
    floors = {"4 args": c_floor(next((root / "add").rglob("xxxx.cubin")), "add_kernel", 4, args.calls),
              "19 args": c_floor(next((root / "args19").rglob("x" * 15 + ".cubin")), "args19_kernel", 19,
                                 args.calls)}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for case, fns in cases.items():
        names = list(fns)
        samples: dict[str, list[float]] = {k: [] for k in names}
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                samples[k].append(per_call_us(fns[k], args.calls))
        results[case] = {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
                         for k, v in samples.items()}
        if floors[case] is not None:
            results[case]["C cuLaunchKernel floor"] = {"median_us": floors[case], "min_us": floors[case],
                                                       "max_us": floors[case]}
    print(f"host time per launch on {torch.cuda.get_device_name()} ({args.rounds} rounds x {args.calls} calls)")
    for case, rows in results.items():
        print(f"\n{case}")
        for k, v in rows.items():
            print(f"  {k:32s} {v['median_us']:8.2f} us   ({v['min_us']:.2f} - {v['max_us']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
