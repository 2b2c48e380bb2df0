"""Import + first call of a wheel's op in fresh processes on a machine without a GPU: the runtime's own work,
measured against the test suite's fake driver (``tests/fixtures/fake_cuda/fake_cuda.c``, compiled and put first on
``LD_LIBRARY_PATH`` as ``libcuda.so.1``; CPU tensors answer as tensors of GPU 0). The fake launches nothing, so
this is the Python and driver-call cost a fresh process pays before its first kernel runs, without the real
driver's own time (module load, launch). ``cpu_import_first`` is the process's CPU time over import + first call:
steadier than the wall clock on a shared machine. Several installs (``pip install --target DIR``) are interleaved,
run by run: a change's effect measured in one run on the CPU machine, before a device round confirms it.

    python scripts/probe_first_call_fake.py --runs 15 old=/tmp/old_target new=/tmp/new_target [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.Tensor.get_device = lambda self: 0            # CPU tensors answer as tensors of GPU 0
    torch._C._cuda_getCurrentRawStream = lambda d: 0x5EED0 + d
    x = torch.randn(1 << 20, dtype=torch.float16)
    y = torch.randn(1 << 20, dtype=torch.float16)
    clk, cpu = time.perf_counter, time.process_time
    t0, c0 = clk(), cpu()
    import forge_kernels
    t1, c1 = clk(), cpu()
    forge_kernels.vector_add(x, y)
    t2, c2 = clk(), cpu()
    print(json.dumps({"import": t1 - t0, "first_call": t2 - t1, "import_first": t2 - t0,
                      "cpu_import_first": c2 - c0}))
""")


def fake_driver(scratch: Path) -> Path:
    """The fake libcuda compiled as ``scratch/libcuda.so.1``; returns its directory."""
    out = scratch / "libcuda.so.1"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O1", "-fPIC", "-shared", "-o", str(out), str(REPO / "tests/fixtures/fake_cuda/fake_cuda.c")],
                   check=True)
    return scratch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("installs", nargs="+", help="NAME=DIR: a wheel installed with pip install --target DIR")
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    installs = dict(item.split("=", 1) for item in args.installs)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in installs}
    with tempfile.TemporaryDirectory() as tmp:
        lib_dir = fake_driver(Path(tmp))
        for target in installs.values():  # a first process writes the runtime's bytecode bundle
            env = {**os.environ, "PYTHONPATH": target, "LD_LIBRARY_PATH": str(lib_dir)}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, capture_output=True)
        for _ in range(args.runs):
            for name, target in installs.items():
                env = {**os.environ, "PYTHONPATH": target, "LD_LIBRARY_PATH": str(lib_dir)}
                out = subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, capture_output=True,
                                     text=True).stdout
                for key, value in json.loads(out.strip().splitlines()[-1]).items():
                    results[name].setdefault(key, []).append(value * 1e3)
    print(f"{'install':<12} {'stage':<14} {'median ms':>10} {'min':>8} {'max':>8}   ({args.runs} fresh processes each)")
    summary = {}
    for name, stages in results.items():
        for stage, values in stages.items():
            med = statistics.median(values)
            summary.setdefault(name, {})[stage] = {"median_ms": med, "min_ms": min(values), "max_ms": max(values)}
            print(f"{name:<12} {stage:<14} {med:>10.2f} {min(values):>8.2f} {max(values):>8.2f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "installs": installs, "results": summary}, indent=1))


if __name__ == "__main__":
    main()
