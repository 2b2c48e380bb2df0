"""Host time per launch: torch eager, Triton's JIT, forge-aot's C and pure-Python launch paths, its ops, the C floor.

For a 4-argument kernel (vector add), a 19-argument one (benchmarks/launch/launch_kernels.py, launched with the
call-site constexpr BLOCK=1024), a 4-argument one with a @triton.heuristics value (EVEN: n divisible by
BLOCK) and one taking 3 host tensor descriptors whose block shapes its config's pre-hook sets (the Triton
tutorials' TMA pattern: a tensor map encoded per descriptor, remembered while the buffers are reused), on tiny
inputs so that the host, not the GPU, sets the pace. Contenders, in one process, timed over
--calls calls per round, --rounds rounds, interleaved in rotating order; reported: the median µs per call and the
spread (min - max) over rounds:

  torch.add(x, y, out=o)          torch eager, no allocation (the same rows in both cases, for reference)
  torch x + y (allocates)         torch eager with its output allocation
  triton-jit kernel[grid](...)    Triton 3.6's JIT launcher
  forge-aot kernel[grid] C        the wheel's kernel handle, C launch path (runtime/_fastlaunch.c)
  forge-aot kernel[grid] Python   the same handle, C path turned off (fastpath.use_c_launch(handle, False)):
                                  exactly the pure-Python path a wheel without the extension (or with
                                  FORGE_NO_C_LAUNCH=1) takes
  forge-aot kernel[grid] Python + C launcher   the Python path's binding and table lookup, then the C launcher
                                  packs and launches: what a call the C path leaves to Python gets (a kernel with
                                  config pre-hooks, or a first call)
  forge-aot kernel[lambda grid] C the C path with a grid function, as host code usually writes it
  ... kernel[grid](x_ptr=x, ...)  every argument by keyword, as flash-linear-attention passes them (Triton's JIT and
                                  the C path)
  forge-aot op (allocates) C / Python   the exported op (output allocation, host code, launch), both paths
  forge-aot host function C       the op's host function called directly (the op less its export wrapper)
  forge-aot custom op torch.ops   (4 arguments) ``torch.ops.forge_launch.vector_add``: what a torch.compile'd graph
                                  calls (the dispatcher, the custom op's real implementation under its guard)
  C cuLaunchKernel floor          cuLaunchKernel in a C loop on the very cubin the wheel ships
                                  (benchmarks/launch/launch_floor.c, compiled here with `cc`), back to back: once
                                  the driver's queue fills, the GPU's pace for these tiny kernels
  C cuLaunchKernel, host only     the same, timed in bursts of 32 launches after a synchronize: the host's own
                                  cost of one cuLaunchKernel (the queue never fills)

and, to show where the C path's time goes:

  forge-aot kernel[(0,)](...) C   (4 arguments) the C path with an empty grid: everything (argument reading,
                                  lookup) but the stream query and the driver call

A third table times the pieces the C path and the op call into, one by one (``--no-pieces`` leaves it out),
among them the C ``Launcher`` alone on ready addresses and vector_add's host code up to its launch.

Needs the forge_launch wheel (built with the C launch path, i.e. on a machine with a C compiler and Python.h) and
Triton (for the JIT rows). From the repository root on the GPU machine:

    forge-aot build --manifest benchmarks/launch/kernel_manifest.toml --out dist
    pip install --no-index --no-deps --force-reinstall dist/forge_launch-*.whl
    python benchmarks/bench_launch.py --json launch.json

The JSON holds every round's sample, the medians and spreads, the device, the versions and whether the C path
was loaded and actually served the timed calls.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def c_floor(cubin: Path, function: str, nargs: int, calls: int, batch: int = 0) -> float | None:
    exe = Path("/tmp/forge_launch_floor")
    src = REPO / "benchmarks" / "launch" / "launch_floor.c"
    try:
        subprocess.run(["cc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True, capture_output=True)
        out = subprocess.run([str(exe), str(cubin), function, str(nargs), str(calls), str(batch)], check=True,
                             capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"C floor unavailable: {exc}", file=sys.stderr)
        return None
    return float(out.stdout.strip())


def pieces(torch, package, x, y, n: int) -> dict[str, Contender]:
    """Single calls the C path and the op are made of, each timed alone (same loop as the other rows)."""
    torch_ops = importlib.import_module(f"{package.__name__}._runtime.torch_ops")
    guard = importlib.import_module(f"{package.__name__}._runtime.guard")
    out = torch.empty_like(x)
    host_triton = importlib.import_module(f"{package.__name__}._runtime.host_triton").host_triton
    raw_stream = torch._C._cuda_getCurrentRawStream
    meta = {"BLOCK_SIZE": 1024}
    add = importlib.import_module(f"{package.__name__}._ops.vector_add").add_kernel
    launchers = [lch.c_launcher() for state in add._states.values() for lch in state.launchers.values()]
    c_launcher = next((lch for lch in launchers if lch is not None), None)
    addresses = (x.data_ptr(), y.data_ptr(), x.data_ptr(), n)
    grid = ((n + 1023) // 1024,)

    def body(x: object, y: object) -> object:  # vector_add's host code up to its launch
        if x.shape != y.shape or x.dtype != y.dtype:  # type: ignore[attr-defined]
            raise ValueError
        x, y = x.contiguous(), y.contiguous()  # type: ignore[attr-defined]
        out = torch.empty_like(x)
        n = x.numel()  # type: ignore[attr-defined]
        (lambda meta: (host_triton.cdiv(n, meta["BLOCK_SIZE"]),))
        return out

    rows = {} if c_launcher is None else {
        # the C Launcher alone, arguments already addresses: stream, context check, cuLaunchKernel (writes x)
        "C launcher(grid, addresses)": Contender(lambda: c_launcher(grid, addresses))}
    return {
        **rows,
        "op host code before its launch": Contender(lambda: body(x, y)),
        "empty loop body (lambda: None)": Contender(lambda: None),
        "x.data_ptr()": Contender(lambda: x.data_ptr()),
        "x.get_device()": Contender(lambda: x.get_device()),
        "x.dtype": Contender(lambda: x.dtype),
        "current raw stream": Contender(lambda: raw_stream(0)),
        "torch.compiler.is_compiling()": Contender(lambda: torch.compiler.is_compiling()),
        "grid lambda (cdiv)": Contender(lambda: (lambda m: (host_triton.cdiv(n, m["BLOCK_SIZE"]),))(meta)),
        "torch.empty_like(x)": Contender(lambda: torch.empty_like(x)),
        "op, launches skipped": Contender(lambda: torch_ops.call_without_launches(package.vector_add, x, y)),
        # the custom op's guard (runtime/guard.py) around a host function that does nothing: 2 tensor arguments
        "custom op guard, empty host code": Contender(lambda: guard.guarded(
            "forge_launch.vector_add", ["x", "y"], frozenset(), lambda x, y: out, (x, y), {}, ((x, y), {}))),
    }


class Contender:
    """A timed callable; ``use_c`` sets the forge-aot handles' launch path before it runs: True (the C path),
    False (pure Python), "launcher" (Python binding, the C launcher packing and launching: what calls the C path
    leaves to Python get, heuristics kernels' for one), None (leave as it is)."""

    def __init__(self, fn: Callable[[], object], use_c: bool | str | None = None) -> None:
        self.fn = fn
        self.use_c = use_c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-pieces", action="store_true", help="leave out the table of single pieces")
    args = ap.parse_args()
    import forge_launch
    import torch
    import triton

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks" / "launch"))
    from launch_kernels import add_desc as jit_add_desc_op
    from launch_kernels import add_desc_kernel as jit_add_desc
    from launch_kernels import add_heur_kernel as jit_add_heur
    from launch_kernels import args19_kernel as jit_args19

    from kernels.vector_add import add_kernel as jit_add

    fastpath = importlib.import_module("forge_launch._runtime.fastpath")
    py_base = importlib.import_module("forge_launch._runtime.kernel")._PyKernelBase
    n = 4096
    x, y, z, w = (torch.randn(n, device="cuda") for _ in range(4))
    o = torch.empty_like(x)
    add_module = importlib.import_module("forge_launch._ops.vector_add")
    add, add_host = add_module.add_kernel, getattr(add_module.vector_add, "__forge_host__", add_module.vector_add)
    cdiv = importlib.import_module("forge_launch._runtime.host_triton").cdiv
    launch_module = importlib.import_module("forge_launch._ops.launch_kernels")
    a19, heur, desc = launch_module.args19_kernel, launch_module.add_heur_kernel, launch_module.add_desc_kernel
    handles = (add, a19, heur, desc)
    grid = (triton.cdiv(n, 1024),)
    a19_args = (o, x, y, z, w, n, 1.0, 2.0, 3.0, 4.0, 1, 1, 1, 1, 0, 0, 0, 0, 0)
    x2, y2, o2 = (t.view(64, 64) for t in (x, y, o))
    tensor_descriptor = importlib.import_module("forge_launch._runtime.descriptors").TensorDescriptor
    jit_descriptor = importlib.import_module("triton.tools.tensor_descriptor").TensorDescriptor
    descs = [tensor_descriptor(t, [64, 64], [64, 1], [1, 1]) for t in (x2, y2, o2)]
    jit_descs = [jit_descriptor(t, [64, 64], [64, 1], [1, 1]) for t in (x2, y2, o2)]
    grid2 = (2, 2)

    def set_path(use_c: bool | str | None) -> None:
        if use_c is not None:
            for h in handles:
                fastpath.use_c_launch(h, use_c is True)
                if use_c == "launcher":
                    h._c_launch = True

    torch_rows = {
        "torch.add(x, y, out=o)": Contender(lambda: torch.add(x, y, out=o)),
        "torch x + y (allocates)": Contender(lambda: x + y),
    }
    cases: dict[str, dict[str, Contender]] = {
        "4 args": {
            **torch_rows,
            "triton-jit kernel[grid](...)": Contender(lambda: jit_add[grid](x, y, o, n, BLOCK_SIZE=1024)),
            "forge-aot kernel[grid](...) C": Contender(lambda: add[grid](x, y, o, n), True),
            "forge-aot kernel[(0,)](...) C": Contender(lambda: add[(0,)](x, y, o, n), True),
            "triton-jit kernel[grid](x_ptr=x, ...)": Contender(
                lambda: jit_add[grid](x_ptr=x, y_ptr=y, out_ptr=o, n_elements=n, BLOCK_SIZE=1024)),
            "forge-aot kernel[grid](x_ptr=x, ...) C": Contender(
                lambda: add[grid](x_ptr=x, y_ptr=y, out_ptr=o, n_elements=n), True),
            "forge-aot kernel[lambda grid](...) C": Contender(lambda: add[lambda m: (cdiv(n, m["BLOCK_SIZE"]),)](
                x, y, o, n), True),
            # py_base.__getitem__ is what kernel[grid] is without the extension: the pure-Python path, exactly
            "forge-aot kernel[grid](...) Python": Contender(lambda: py_base.__getitem__(add, grid)(x, y, o, n), False),
            "forge-aot kernel[grid](...) Python + C launcher": Contender(
                lambda: py_base.__getitem__(add, grid)(x, y, o, n), "launcher"),
            "forge-aot op (allocates) C": Contender(lambda: forge_launch.vector_add(x, y), True),
            "forge-aot host function (no export wrapper) C": Contender(lambda: add_host(x, y), True),
            "forge-aot op (allocates) Python": Contender(lambda: forge_launch.vector_add(x, y), False),
            # what a torch.compile'd graph calls: the dispatcher, the custom op's real implementation and its guard
            "forge-aot custom op torch.ops (allocates) C": Contender(
                lambda: torch.ops.forge_launch.vector_add(x, y), True),
        },
        "19 args": {
            **torch_rows,
            "triton-jit kernel[grid](...)": Contender(lambda: jit_args19[grid](*a19_args, BLOCK=1024)),
            "forge-aot kernel[grid](...) C": Contender(lambda: a19[grid](*a19_args, BLOCK=1024), True),
            "forge-aot kernel[grid](...) Python": Contender(
                lambda: py_base.__getitem__(a19, grid)(*a19_args, BLOCK=1024), False),
            "forge-aot kernel[grid](...) Python + C launcher": Contender(
                lambda: py_base.__getitem__(a19, grid)(*a19_args, BLOCK=1024), "launcher"),
            "forge-aot op (allocates) C": Contender(lambda: forge_launch.args19(x, y, z, w), True),
            "forge-aot op (allocates) Python": Contender(lambda: forge_launch.args19(x, y, z, w), False),
        },
        "4 args + @triton.heuristics": {
            **torch_rows,
            "triton-jit kernel[grid](...)": Contender(lambda: jit_add_heur[grid](x, y, o, n, BLOCK=1024)),
            "forge-aot kernel[grid](...) C": Contender(lambda: heur[grid](x, y, o, n, BLOCK=1024), True),
            "forge-aot kernel[grid](...) Python + C launcher": Contender(
                lambda: py_base.__getitem__(heur, grid)(x, y, o, n, BLOCK=1024), "launcher"),
            "forge-aot kernel[grid](...) Python": Contender(
                lambda: py_base.__getitem__(heur, grid)(x, y, o, n, BLOCK=1024), False),
            "forge-aot op (allocates) C": Contender(lambda: forge_launch.add_heur(x, y), True),
        },
        "3 tensor descriptors + pre-hook": {
            **torch_rows,
            "triton-jit kernel[grid](...)": Contender(lambda: jit_add_desc[grid2](*jit_descs, 64, 64)),
            "forge-aot kernel[grid](...) C": Contender(lambda: desc[grid2](*descs, 64, 64), True),
            "forge-aot kernel[grid](...) Python + C launcher": Contender(
                lambda: py_base.__getitem__(desc, grid2)(*descs, 64, 64), "launcher"),
            "forge-aot kernel[grid](...) Python": Contender(
                lambda: py_base.__getitem__(desc, grid2)(*descs, 64, 64), False),
            "triton-jit op (allocates)": Contender(lambda: jit_add_desc_op(x2, y2)),
            "forge-aot op (allocates) C": Contender(lambda: forge_launch.add_desc(x2, y2), True),
            "forge-aot op (allocates) Python": Contender(lambda: forge_launch.add_desc(x2, y2), False),
        },
    }
    c_loaded = fastpath.c is not None
    if not c_loaded:
        print("warning: the C launch path is not loaded (wheel built without it, or FORGE_NO_C_LAUNCH set): the "
              "'C' rows run the Python path", file=sys.stderr)
    for fns in cases.values():  # warm up: module loads, JIT compiles, caches, the C path's remembered launches
        for c in fns.values():
            set_path(c.use_c)
            for _ in range(200):
                c.fn()
    torch.cuda.synchronize()
    set_path(True)
    served = {}
    for name, h in (("4 args", add), ("19 args", a19), ("4 args + @triton.heuristics", heur),
                    ("3 tensor descriptors + pre-hook", desc)):
        for _ in range(3):
            cases[name]["forge-aot kernel[grid](...) C"].fn()
        served[name] = bool(h._fast is not None and h._fast.size() > 0)
    root = Path(forge_launch.__file__).parent / "_forge" / "bin"
    cubins = {"4 args": (next((root / "add").rglob("xxxx.cubin")), "add_kernel", 4),
              "19 args": (next((root / "args19").rglob("x" * 15 + ".cubin")), "args19_kernel", 19)}
    floors = {case: {"C cuLaunchKernel floor": c_floor(*c, args.calls),
                     "C cuLaunchKernel, host only": c_floor(*c, args.calls, 32)} for case, c in cubins.items()}
    results: dict[str, dict[str, dict[str, float]]] = {}
    samples_out: dict[str, dict[str, list[float]]] = {}
    for case, fns in cases.items():
        names = list(fns)
        samples: dict[str, list[float]] = {k: [] for k in names}
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                set_path(fns[k].use_c)
                for _ in range(20):
                    fns[k].fn()  # after a path switch the C path re-learns its launches: not timed
                samples[k].append(per_call_us(fns[k].fn, args.calls))
        set_path(True)
        results[case] = {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
                         for k, v in samples.items()}
        samples_out[case] = samples
        for row, floor in floors.get(case, {}).items():
            if floor is not None:
                results[case][row] = {"median_us": floor, "min_us": floor, "max_us": floor}
    if not args.no_pieces:
        cases["pieces"] = pieces(torch, forge_launch, x, y, n)
        names = list(cases["pieces"])
        samples = {k: [] for k in names}
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                samples[k].append(per_call_us(cases["pieces"][k].fn, args.calls))
        results["pieces"] = {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
                             for k, v in samples.items()}
        samples_out["pieces"] = samples
    device = torch.cuda.get_device_name()
    print(f"host time per launch on {device} ({args.rounds} rounds x {args.calls} calls); C launch path loaded: "
          f"{c_loaded}, serving the C rows: {served}")
    for case, rows in results.items():
        print(f"\n{case}")
        for k, v in rows.items():
            print(f"  {k:38s} {v['median_us']:8.2f} us   ({v['min_us']:.2f} - {v['max_us']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({
            "device": device, "python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__, "c_launch_loaded": c_loaded, "c_launch_serving": served,
            "rounds": args.rounds, "calls": args.calls, "results": results, "samples_us": samples_out}, indent=1))


if __name__ == "__main__":
    main()
