"""Would one file of the runtime's bytecode import faster than its modules one by one? In fresh processes after
torch and the CUDA context, interleaved: the runtime's modules imported as usual, against the same code objects
read from one marshal file (written from the installed .pyc files by a first process) and run into modules.

    python scripts/probe_runtime_bundle.py forge_kernels [--runs 5]      (prints µs per process and medians)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Dependency order: each module's relative imports find the ones before it in sys.modules.
MODULES = ("errors", "host_triton", "packing", "tables", "drivers", "cuda", "fastpath", "kernel", "launch",
           "host_modules")

WRITE = r"""
import importlib.util, marshal, sys
pkg, out = sys.argv[1], sys.argv[2]
codes = []
for m in MODULES:
    spec = importlib.util.find_spec(f"{pkg}._runtime.{m}")
    with open(importlib.util.cache_from_source(spec.origin), "rb") as f:
        codes.append((m, spec.origin, marshal.loads(f.read()[16:])))
with open(out, "wb") as f:
    f.write(marshal.dumps(codes))
"""

CHILD = r"""
import importlib, json, marshal, sys, time, types
import torch
if torch.cuda.is_available():
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
pkg, mode, bundle = sys.argv[1], sys.argv[2], sys.argv[3]
clk = time.perf_counter
t0 = clk()
__import__(pkg)
t1 = clk()
rt = importlib.import_module(f"{pkg}._runtime")
if mode == "modules":
    for m in MODULES:
        importlib.import_module(f"{pkg}._runtime.{m}")
else:
    with open(bundle, "rb") as f:
        codes = marshal.loads(f.read())
    for m, origin, code in codes:
        name = f"{pkg}._runtime.{m}"
        if name in sys.modules:
            continue
        mod = types.ModuleType(name)
        mod.__file__, mod.__package__ = origin, f"{pkg}._runtime"
        sys.modules[name] = mod
        exec(code, mod.__dict__)
        setattr(rt, m, mod)
importlib.import_module(f"{pkg}._runtime._fastlaunch")
t2 = clk()
print(json.dumps({"mode": mode, "package_us": 1e6 * (t1 - t0), "runtime_us": 1e6 * (t2 - t1)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("package", nargs="?", default="forge_kernels")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    prelude = f"MODULES = {MODULES!r}\n"
    with tempfile.TemporaryDirectory() as tmp:
        bundle = str(Path(tmp) / "runtime.marshal")
        subprocess.run([sys.executable, "-c", prelude + WRITE, args.package, bundle], check=True)
        rows: list[dict[str, float | str]] = []
        for _ in range(args.runs):
            for mode in ("modules", "bundle"):
                out = subprocess.run([sys.executable, "-c", prelude + CHILD, args.package, mode, bundle],
                                     capture_output=True, text=True, check=True)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
        size = Path(bundle).stat().st_size
    for mode in ("modules", "bundle"):
        mine = [float(r["runtime_us"]) for r in rows if r["mode"] == mode]
        print(f"{mode:8s} runtime modules: median {statistics.median(mine):7.0f} us  "
              f"({min(mine):.0f} - {max(mine):.0f}), bundle file {size} bytes")


if __name__ == "__main__":
    main()
