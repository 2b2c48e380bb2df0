"""Where a fresh process's import of a wheel's runtime goes, module by module, from its bytecode bundle: the cold
unmarshal and the module body of each first-call module, and the C extension's dlopen, after torch and the CUDA
context (medians of fresh processes). Beside them, the same unmarshal repeated in a warm process: the gap is the
cost of a fresh process's first touch (memory, interned strings), not of the bytecode's size alone.

    python scripts/probe_cold_modules.py [--package forge_kernels] [--runs 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import ctypes, importlib.util, json, marshal, os, sys, time, types
    import torch
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    clk = time.perf_counter
    pkg = sys.argv[1]
    root = os.path.dirname(importlib.util.find_spec(pkg).origin)
    rt_dir = os.path.join(root, "_runtime")
    bundle = importlib.util.cache_from_source(os.path.join(rt_dir, "_bundle.py"))
    data = open(bundle, "rb").read()
    start = data.index(importlib.util.MAGIC_NUMBER) + len(importlib.util.MAGIC_NUMBER)
    size = int.from_bytes(data[start:start + 4], "little")
    _, table = marshal.loads(data[start + 4:start + 4 + size])
    blob = memoryview(data)[start + 4 + size:]
    codes = {name: bytes(blob[off:off + ln]) for name, _, _, off, ln in table}
    so = [f for f in os.listdir(rt_dir) if f.startswith("_fastlaunch") and f.endswith(".so")]
    out = {}
    if so:
        t = clk(); ctypes.CDLL(os.path.join(rt_dir, so[0]), mode=os.RTLD_NOW); out["dlopen _fastlaunch"] = clk() - t
    package = types.ModuleType(pkg); package.__path__ = [root]; sys.modules[pkg] = package
    runtime = types.ModuleType(pkg + "._runtime"); runtime.__path__ = [rt_dir]; sys.modules[pkg + "._runtime"] = runtime
    runtime.__package__ = pkg + "._runtime"
    for name in ("errors", "host_triton", "packing", "tables", "drivers", "fastpath", "kernel", "cuda", "launch",
                 "host_modules", "entry"):
        t0 = clk(); code = marshal.loads(codes[name]); t1 = clk()
        mod = types.ModuleType(f"{pkg}._runtime.{name}"); mod.__package__ = pkg + "._runtime"
        mod.__file__ = os.path.join(rt_dir, name + ".py"); sys.modules[mod.__name__] = mod
        exec(code, mod.__dict__); t2 = clk(); setattr(runtime, name, mod)
        out["unmarshal " + name] = t1 - t0
        out["exec " + name] = t2 - t1
    t = clk()
    for _ in range(5):
        for name in codes:
            marshal.loads(codes[name])
    out["warm unmarshal of the whole bundle"] = (clk() - t) / 5
    out["cold unmarshal of the first-call modules"] = sum(v for k, v in out.items() if k.startswith("unmarshal "))
    out["bundle bytes"] = len(data)
    print(json.dumps(out))
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package", default="forge_kernels")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD, a.package], capture_output=True, text=True,
                                      check=True, cwd="/").stdout.strip().splitlines()[-1]) for _ in range(a.runs)]
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    for k, v in medians.items():
        print(f"{k:45s} {v:10.0f} B" if k == "bundle bytes" else f"{k:45s} {1e6 * v:8.0f} us "
              f"({1e6 * min(r[k] for r in runs):.0f} - {1e6 * max(r[k] for r in runs):.0f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"package": a.package, "runs": runs, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main()
