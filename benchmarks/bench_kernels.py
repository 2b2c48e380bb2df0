"""Per-op speed and host launch overhead: forge-aot wheel vs the same op through Triton JIT vs torch.

Device time: triton.testing.do_bench medians (CUDA events), on fresh random inputs rotated among several
buffers so the sizes that fit L2 are not measured from cache. Host overhead: wall time per call of a tiny
launch (4096-element add) over 5 × 5000 calls, median, the anchors' method.

    python benchmarks/bench_kernels.py --json kernels.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def host_us_per_call(fn, calls: int = 5000, rounds: int = 5) -> float:
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import sys

    import forge_kernels
    import torch
    import triton
    from triton.testing import do_bench

    from forge_aot.dev import load_dev_ops

    sys.path.insert(0, str(REPO))
    from kernels.vector_add import add_kernel as jit_add

    dev = load_dev_ops(REPO / "kernel_manifest.toml")
    dt = torch.float16
    cases = {
        "vector_add 16M": (lambda: [torch.randn(1 << 24, device="cuda", dtype=dt) for _ in range(2)],
                           "vector_add", lambda x, y: x + y, lambda x, y: 3 * x.numel() * x.element_size(), None),
        "softmax 4096x4096": (lambda: [torch.randn(4096, 4096, device="cuda", dtype=dt)], "softmax",
                              lambda x: torch.softmax(x, -1), lambda x: 2 * x.numel() * x.element_size(), None),
        "softmax 8192x1000": (lambda: [torch.randn(8192, 1000, device="cuda", dtype=dt)], "softmax",
                              lambda x: torch.softmax(x, -1), lambda x: 2 * x.numel() * x.element_size(), None),
        "matmul 4096^3": (lambda: [torch.randn(4096, 4096, device="cuda", dtype=dt) for _ in range(2)], "matmul",
                          lambda a, b: a @ b, None, lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1]),
        "matmul 1000^3": (lambda: [torch.randn(1000, 1000, device="cuda", dtype=dt) for _ in range(2)], "matmul",
                          lambda a, b: a @ b, None, lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1]),
    }
    results = {}
    print(f"{'case':20s} {'forge-aot ms':>13s} {'triton-jit ms':>14s} {'torch ms':>9s} {'jit/aot':>8s} "
          f"{'torch/aot':>9s} {'aot rate':>14s}")
    for name, (make, op, ref, nbytes, flops) in cases.items():
        inputs = [make() for _ in range(4)]
        row = {}
        for label, fn in (("forge-aot", getattr(forge_kernels, op)), ("triton-jit", dev[op]), ("torch", ref)):
            it = iter(range(10**9))

            def call(fn=fn, it=it, inputs=inputs):
                return fn(*inputs[next(it) % len(inputs)])

            row[label] = do_bench(call, warmup=50, rep=300, return_mode="median")
        rate = (f"{nbytes(*inputs[0]) / row['forge-aot'] / 1e9:.2f} TB/s" if nbytes
                else f"{flops(*inputs[0]) / row['forge-aot'] / 1e9:.0f} TFLOP/s")
        row["aot_rate"] = rate
        results[name] = row
        print(f"{name:20s} {row['forge-aot']:13.4f} {row['triton-jit']:14.4f} {row['torch']:9.4f} "
              f"{row['triton-jit'] / row['forge-aot']:8.2f} {row['torch'] / row['forge-aot']:9.2f} {rate:>14s}")

    n = 4096
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    o = torch.empty_like(x)
    aot_handle = importlib.import_module("forge_kernels._ops.vector_add").add_kernel
    grid = (triton.cdiv(n, 1024),)
    overhead = {
        "forge-aot kernel[grid](...)": host_us_per_call(lambda: aot_handle[grid](x, y, o, n)),
        "forge-aot op (allocates out)": host_us_per_call(lambda: forge_kernels.vector_add(x, y)),
        "triton-jit kernel[grid](...)": host_us_per_call(lambda: jit_add[grid](x, y, o, n, BLOCK_SIZE=1024)),
        "torch.add(out=)": host_us_per_call(lambda: torch.add(x, y, out=o)),
    }
    print("\nhost time per launch, 4096-element fp32 add (median of 5 x 5000 calls)")
    for k, v in overhead.items():
        print(f"  {k:32s} {v:7.2f} us")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "kernels_ms": results,
                                         "host_overhead_us": overhead}, indent=1))


if __name__ == "__main__":
    main()
