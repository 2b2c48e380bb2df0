"""Cold start: fresh process, import → first matmul result, forge-aot wheel vs Triton JIT + autotune.

Modes, each in its own fresh Python process, repeated and reported as medians:
  forge-aot         the installed wheel (forge_kernels.matmul): no Triton, binaries loaded on first call
  jit-cold          @triton.autotune over the 8 configs, empty TRITON_CACHE_DIR (compile + benchmark)
  jit-warm          same, warm TRITON_CACHE_DIR (no compile; autotune benchmarks again)
  jit-cache-results same with autotune(cache_results=True), warm (no compile, no benchmark)
"first call" runs from inputs allocated (CUDA context up) to the result synchronised (for the wheel: the
runtime, the op's host module and index slice, the driver, the module load and the kernel); "import+first" is
the package import (after torch) plus that first call; "total" from the process's first line (torch import
included). Prints a table and writes JSON (--json).

A second table puts the wheel's import + first call of a small op (vector_add, fp16, 1M elements; CUDA context up
and inputs allocated before the clock starts) beside its floor: a process that does only what any first launch
of that binary must do, with no runtime at all (the output's torch.empty, reading the cubin, cuModuleLoadData,
cuModuleGetFunction, cuLaunchKernel through ctypes, the synchronize) on the very binary the wheel chose, and
"floor + host code": that floor plus loading the wheel's C extension and running the op's host module and host
function (a stand-in kernel handle launching the same binary), the least any runtime that keeps the op's host code
Python must spend (a launch plan executed by the C extension included). The wheel runs with its runtime's bytecode
bundle (written after a first call, or by ``write_bundle()``) and without (a fresh install's first process),
interleaved; the matmul table and the stages run with it. ``--baseline DIR``
adds another build of the package (installed with ``pip install --target DIR``, for example the previous commit's
wheel) to that table, with its own bundle, interleaved: a change's effect measured in one run.

    python benchmarks/bench_cold_start.py --size 4096 --repeats 3 --json cold_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD_FORGE = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    t_torch = time.perf_counter()
    import forge_kernels
    t_import = time.perf_counter()
    n = int(sys.argv[1])
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t_alloc = time.perf_counter()
    c = forge_kernels.matmul(a, b)
    torch.cuda.synchronize()
    t_first = time.perf_counter()
    ref = a.float() @ b.float()
    print(json.dumps({"import_torch": t_torch - t0, "import_pkg": t_import - t_torch,
                      "first_call": t_first - t_alloc, "total": t_first - t0,
                      "rel_err": ((c.float() - ref).norm() / ref.norm()).item(),
                      "triton_imported": "triton" in sys.modules}))
""")

CHILD_BREAKDOWN = textwrap.dedent("""
    # Wall-clock stages of import + first call: the runtime's own functions wrapped with timers (no profiler).
    import importlib, json, sys, time
    import torch
    n = int(sys.argv[1])
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    clock = time.perf_counter
    stages = {}

    def timed(owner, name, label):
        fn = getattr(owner, name)
        def wrapper(*args, **kwargs):
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                stages[label] = stages.get(label, 0.0) + clock() - t
        setattr(owner, name, wrapper)

    timed(torch.library.Library, "__init__", "  import package: torch.library.Library()")
    timed(torch.library.Library, "define", "  import package: Library.define (custom ops)")
    timed(torch.library.Library, "impl", "  import package: Library.impl (real, Meta)")
    t0 = clock()
    import forge_kernels
    stages["import package"] = clock() - t0
    rt = "forge_kernels._runtime."
    t = clock()
    for m in ("errors", "host_triton", "packing", "tables", "_fastlaunch", "fastpath", "kernel", "drivers", "cuda",
              "launch", "host_modules"):  # what a first call needs (expressions: only for a key between table rows)
        tm = clock()
        try:
            importlib.import_module(rt + m)
        except ImportError:  # a wheel without the C launch path
            pass
        stages["  import " + m] = clock() - tm
    stages["import runtime modules"] = clock() - t
    hm, launch, kernel = (sys.modules[rt + m] for m in ("host_modules", "launch", "kernel"))
    timed(hm, "load_index", "index json (host module part)")
    if hasattr(hm, "LazyJson"):
        timed(hm.LazyJson, "_get", "index json (lazy parts: target entry, config binaries)")
    timed(hm, "exec_host_module", "host module exec")
    timed(kernel.Kernel, "__init__", "kernel handles")
    timed(launch, "driver", "driver()")
    timed(launch.BinaryBackend, "device", "device attributes")
    timed(launch.BinaryBackend, "resolve", "resolve table (incl. device attributes)")
    timed(launch, "_BinaryLauncher", "binary load (read, sha256, cuModuleLoadData)")
    timed(torch, "empty", "torch.empty (output)")
    t1 = clock()
    c = forge_kernels.matmul(a, a)
    t2 = clock()
    torch.cuda.synchronize()
    t3 = clock()
    c = forge_kernels.matmul(a, a)
    torch.cuda.synchronize()
    t4 = clock()
    stages["first call (host, to return)"] = t2 - t1
    stages["first call sync wait"] = t3 - t2
    stages["second call incl. kernel"] = t4 - t3
    stages["import + first call"] = t3 - t0
    print(json.dumps(stages))
""")

CHILD_OP = textwrap.dedent("""
    # Import + first call of vector_add after torch and the CUDA context; reports the binary it launched.
    import json, re, sys, time
    import torch
    n = int(sys.argv[1])
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = torch.randn(n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    import forge_kernels
    t_import = time.perf_counter()
    out = forge_kernels.vector_add(x, y)
    torch.cuda.synchronize()
    t_first = time.perf_counter()
    import forge_kernels._ops.vector_add as host
    # (after the clock) the binary it launched, as the full handle resolves it: a cold handle (runtime/cold.py) is
    # promoted by the first read of the full handle's state, and the call made again resolves it there
    if not getattr(host.add_kernel, "_states", None):
        forge_kernels.vector_add(x, y)
    (state,) = host.add_kernel._states.values()
    ((config, *_), launcher), = state.launchers.items()
    config = getattr(config, "id", config)
    block_size = int(re.search(r"BLOCK_SIZE(\\d+)", str(config)).group(1))
    binary = {"path": launcher.path, "function": launcher.symbol, "block": launcher.block,
              "shared": launcher.shared, "grid": (n + block_size - 1) // block_size, "kept": launcher.kept,
              "config": str(config), "scratch": [launcher.global_scratch, launcher.profile_scratch]}
    err = (out.double() - (x.double() + y.double())).abs().max().item()
    print(json.dumps({"import_pkg": t_import - t0, "first_call": t_first - t_import, "import_and_first_call":
                      t_first - t0, "max_abs_err": err, "binary": binary}))
""")

CHILD_FLOOR = textwrap.dedent("""
    # The floor of a first launch of the same binary: torch.empty, read, load, get function, launch, sync.
    import ctypes, json, sys, time
    import torch
    n = int(sys.argv[1])
    binary = json.loads(sys.argv[2])
    assert binary["scratch"] == [0, 0], "the floor passes null scratch pointers: a binary that needs none"
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = torch.randn(n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")  # torch has loaded it already: this is a handle lookup

    def check(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUresult {r}")

    t0 = time.perf_counter()
    out = torch.empty_like(x)
    with open(binary["path"], "rb") as f:
        image = f.read()
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
    check(cu.cuModuleGetFunction(ctypes.byref(function), module, binary["function"].encode()), "cuModuleGetFunction")
    values = [ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(y.data_ptr()), ctypes.c_uint64(out.data_ptr()),
              ctypes.c_int32(n)]
    values = [values[i] for i in binary["kept"]] + [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    check(cu.cuLaunchKernel(function, binary["grid"], 1, 1, binary["block"], 1, 1, binary["shared"], stream, params,
                            None), "cuLaunchKernel")
    torch.cuda.synchronize()
    t_first = time.perf_counter()
    err = (out.double() - (x.double() + y.double())).abs().max().item()
    print(json.dumps({"import_pkg": 0.0, "first_call": t_first - t0, "import_and_first_call": t_first - t0,
                      "max_abs_err": err}))
""")

CHILD_HOST_FLOOR = textwrap.dedent("""
    # A lower bound for any runtime that keeps the op's host code Python (the build's launch plan run by the C
    # extension included): the floor's work, plus loading the wheel's C extension (its dlopen) and running the
    # op's host module file (its cached bytecode, as an import reads it) and host function, whose kernel handle
    # is a stand-in that launches the binary the wheel chose through ctypes. No package import, no index, no
    # table, no binding: only what such a runtime could not leave out.
    import ctypes, importlib.util, json, sys, time, types
    import torch
    n = int(sys.argv[1])
    binary = json.loads(sys.argv[2])
    host_file, ext_file, block_size = sys.argv[3], sys.argv[4], int(sys.argv[5])
    assert binary["scratch"] == [0, 0], "the floor passes null scratch pointers: a binary that needs none"
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = torch.randn(n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")

    def check(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUresult {r}")

    class Launch:
        def __init__(self, grid):
            self.grid = grid

        def __call__(self, *args):
            grid = self.grid({"BLOCK_SIZE": block_size}) if callable(self.grid) else self.grid
            with open(binary["path"], "rb") as f:
                image = f.read()
            module, function = ctypes.c_void_p(), ctypes.c_void_p()
            check(cu.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
            check(cu.cuModuleGetFunction(ctypes.byref(function), module, binary["function"].encode()),
                  "cuModuleGetFunction")
            values = [ctypes.c_uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int32(a)
                      for a in args]
            values = [values[i] for i in binary["kept"]] + [ctypes.c_uint64(0), ctypes.c_uint64(0)]
            params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            check(cu.cuLaunchKernel(function, grid[0], 1, 1, binary["block"], 1, 1, binary["shared"], stream, params,
                                    None), "cuLaunchKernel")

    class Handle:
        def __getitem__(self, grid):
            return Launch(grid)

    t0 = time.perf_counter()
    if ext_file:
        spec = importlib.util.spec_from_file_location("_fastlaunch", ext_file)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    spec = importlib.util.spec_from_file_location("forge_host_floor", host_file)
    host = importlib.util.module_from_spec(spec)
    host.__dict__.update(triton=types.SimpleNamespace(cdiv=lambda a, b: (a + b - 1) // b),
                         __forge_kernel_side__=lambda name, module: Handle())
    spec.loader.exec_module(host)
    out = host.vector_add(x, y)
    torch.cuda.synchronize()
    t_first = time.perf_counter()
    err = (out.double() - (x.double() + y.double())).abs().max().item()
    print(json.dumps({"import_pkg": 0.0, "first_call": t_first - t0, "import_and_first_call": t_first - t0,
                      "max_abs_err": err}))
""")

HOST_FILES = ("import json, glob, os, forge_kernels as p; d = os.path.dirname(p.__file__); "
              "print(json.dumps({'host': os.path.join(d, '_ops', 'vector_add.py'), "
              "'ext': (glob.glob(os.path.join(d, '_runtime', '_fastlaunch*.so')) + [''])[0]}))")

CHILD_JIT = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    t_torch = time.perf_counter()
    import triton
    sys.path.insert(0, sys.argv[3])
    from kernels.matmul import matmul_kernel
    t_import = time.perf_counter()
    CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
               for bm, bn, bk, w, s in [(128, 256, 64, 8, 3), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4),
                                        (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 32, 32, 4, 4),
                                        (64, 32, 32, 2, 5), (32, 64, 32, 2, 5)]]
    kernel = triton.autotune(configs=CONFIGS, key=["M", "N", "K"], cache_results=sys.argv[2] == "1")(matmul_kernel)
    n = int(sys.argv[1])
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t_alloc = time.perf_counter()
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    kernel[grid](a, b, c, n, n, n, a.stride(0), b.stride(0), c.stride(0))
    torch.cuda.synchronize()
    t_first = time.perf_counter()
    ref = a.float() @ b.float()
    print(json.dumps({"import_torch": t_torch - t0, "import_pkg": t_import - t_torch,
                      "first_call": t_first - t_alloc, "total": t_first - t0,
                      "rel_err": ((c.float() - ref).norm() / ref.norm()).item(), "best": str(kernel.best_config)}))
""")


BUNDLE_PATH = "import json, forge_kernels._runtime as r; print(json.dumps({'path': r.bundle_path()}))"
WRITE_BUNDLE = "import json, forge_kernels._runtime as r; print(json.dumps({'wrote': r.write_bundle()}))"


def _write_bundle(env: dict[str, str]) -> bool:
    """The runtime's bytecode bundle written now, in a process of its own (as ``write_bundle()`` at image build)."""
    return bool(_run(WRITE_BUNDLE, [], env)["wrote"])


def _run(code: str, args: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tempfile.gettempdir())  # not the repository: "-c" puts the cwd on sys.path
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--op-size", type=int, default=1 << 20, help="elements of the vector_add floor comparison")
    ap.add_argument("--op-only", action="store_true", help="only the vector_add table (no matmul, no JIT)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a directory holding another build of forge_kernels (pip install --target DIR): the "
                         "vector_add table times it too, with its bundle, interleaved with the installed one")
    ap.add_argument("--profile", type=Path, default=None,
                    help="also write the wall-clock stages of import + first call (--repeats fresh processes, "
                         "the runtime's functions wrapped with timers) to this file")
    args = ap.parse_args()
    n = str(args.size)
    # The children import the installed wheel: the repository on PYTHONPATH would add its directory to every
    # top-level import's search, which a deployed process does not have (the JIT child adds it itself).
    base_env = dict(os.environ)
    path = [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    base_env.pop("PYTHONPATH", None)
    if path:
        base_env["PYTHONPATH"] = os.pathsep.join(path)
    bundle_path = _run(BUNDLE_PATH, [], base_env)["path"]
    has_bundle = _write_bundle(base_env)  # the steady state of a deployed wheel, unless stated otherwise below
    print(f"runtime bytecode bundle: {bundle_path if has_bundle else 'not available (no .pyc files to gather)'}")
    runs: dict[str, list[dict]] = {}
    summary: dict[str, dict] = {}
    if not args.op_only:
        runs = {m: [] for m in ("forge-aot", "jit-cold", "jit-warm", "jit-cache-results")}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):
                runs["forge-aot"].append(_run(CHILD_FORGE, [n], base_env))
                cold = dict(base_env, TRITON_CACHE_DIR=os.path.join(tmp, f"cold{i}"))
                runs["jit-cold"].append(_run(CHILD_JIT, [n, "0", str(REPO)], cold))
            warm = dict(base_env, TRITON_CACHE_DIR=os.path.join(tmp, "cold0"))
            for _ in range(args.repeats):
                runs["jit-warm"].append(_run(CHILD_JIT, [n, "0", str(REPO)], warm))
            cached = dict(base_env, TRITON_CACHE_DIR=os.path.join(tmp, "cached"))
            _run(CHILD_JIT, [n, "1", str(REPO)], cached)  # fills the compile cache and the autotune results
            for _ in range(args.repeats):
                runs["jit-cache-results"].append(_run(CHILD_JIT, [n, "1", str(REPO)], cached))
        for mode, rs in runs.items():
            for r in rs:
                r["import_and_first_call"] = r["import_pkg"] + r["first_call"]
            summary[mode] = {k: statistics.median(r[k] for r in rs)
                             for k in ("import_pkg", "first_call", "import_and_first_call", "total")}
            summary[mode]["first_call_all"] = [r["first_call"] for r in rs]
            summary[mode]["max_rel_err"] = max(r["rel_err"] for r in rs)
        aot = summary["forge-aot"]["first_call"]
        print(f"matmul fp16 {n}^3, fresh process per run, median of {args.repeats}")
        print(f"{'mode':20s} {'import pkg (s)':>15s} {'first call (s)':>15s} {'import+first (s)':>17s} "
              f"{'total (s)':>10s} {'first call / forge-aot':>24s}")
        for mode, s in summary.items():
            print(f"{mode:20s} {s['import_pkg']:15.4f} {s['first_call']:15.4f} {s['import_and_first_call']:17.4f} "
                  f"{s['total']:10.3f} {s['first_call'] / aot:23.0f}x")
        print(f"forge-aot imported triton: {any(r['triton_imported'] for r in runs['forge-aot'])}")
    modes = ["forge-aot (bundle)", "forge-aot (no bundle)"] if has_bundle else ["forge-aot (no bundle)"]
    baseline_env = None
    if args.baseline is not None:  # ahead of the installed package on the path, with a bundle of its own
        baseline_env = dict(base_env, PYTHONPATH=os.pathsep.join([str(args.baseline.resolve()),
                                                                  *filter(None, [base_env.get("PYTHONPATH")])]))
        if _write_bundle(baseline_env):
            modes.append("baseline (bundle)")
    op_runs: dict[str, list[dict]] = {m: [] for m in [*modes, "floor (ctypes)", "floor + host code"]}
    host_files = _run(HOST_FILES, [], base_env)
    # The first process on a fresh install runs without the bundle (and writes it where Python writes bytecode).
    no_bundle = dict(base_env, PYTHONDONTWRITEBYTECODE="1")
    for _ in range(args.repeats):  # interleaved: the host's speed drifts between rounds
        for mode in modes:
            if mode == "baseline (bundle)":
                baseline_run = dict(baseline_env or {}, PYTHONDONTWRITEBYTECODE="1")
                op_runs[mode].append(_run(CHILD_OP, [str(args.op_size)], baseline_run))
                continue
            if mode == "forge-aot (bundle)":
                _write_bundle(base_env)
            else:
                Path(bundle_path).unlink(missing_ok=True)
            op_runs[mode].append(_run(CHILD_OP, [str(args.op_size)], no_bundle))
        binary = op_runs[modes[0]][-1]["binary"]
        op_runs["floor (ctypes)"].append(_run(CHILD_FLOOR, [str(args.op_size), json.dumps(binary)], base_env))
        block_size = re.search(r"BLOCK_SIZE(\d+)", binary["config"])
        op_runs["floor + host code"].append(_run(CHILD_HOST_FLOOR, [
            str(args.op_size), json.dumps(binary), host_files["host"], host_files["ext"],
            block_size.group(1) if block_size else "0"], base_env))
    if has_bundle:
        _write_bundle(base_env)
    op_summary = {}
    for mode, rs in op_runs.items():
        op_summary[mode] = {k: statistics.median(r[k] for r in rs)
                            for k in ("import_pkg", "first_call", "import_and_first_call")}
        op_summary[mode]["import_and_first_call_all"] = [r["import_and_first_call"] for r in rs]
        op_summary[mode]["max_abs_err"] = max(r["max_abs_err"] for r in rs)
    floor = op_summary["floor (ctypes)"]["import_and_first_call"]
    print(f"\nvector_add fp16 {args.op_size} elements after torch + CUDA context, fresh process per run, median of "
          f"{args.repeats} (binary {op_runs[modes[0]][0]['binary']['config']})")
    print(f"{'mode':20s} {'import pkg (ms)':>16s} {'first call (ms)':>16s} {'import+first (ms)':>18s} "
          f"{'range (ms)':>16s} {'/ floor':>8s}")
    for mode, s in op_summary.items():
        spread = s["import_and_first_call_all"]
        print(f"{mode:20s} {s['import_pkg'] * 1e3:16.3f} {s['first_call'] * 1e3:16.3f} "
              f"{s['import_and_first_call'] * 1e3:18.3f} {min(spread) * 1e3:7.3f} - {max(spread) * 1e3:6.3f} "
              f"{s['import_and_first_call'] / floor:7.1f}x")
    if args.profile:
        breakdowns = [_run(CHILD_BREAKDOWN, [n], base_env) for _ in range(args.repeats)]
        lines = [f"{k:55s} " + "  ".join(f"{b.get(k, 0.0) * 1e3:7.3f}" for b in breakdowns) + " ms"
                 for k in breakdowns[0]]
        args.profile.write_text("stages of import + first call (fresh processes, ms):\n" + "\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"size": args.size, "repeats": args.repeats, "summary": summary,
                                         "runs": runs, "op_size": args.op_size, "op_summary": op_summary,
                                         "op_runs": op_runs}, indent=1))


if __name__ == "__main__":
    main()
