"""Where importing a wheel's runtime goes, module by module, in a fresh process after torch and the CUDA context:
find (the import system's finders), get_code (read the cached bytecode, unmarshal), exec (the module body).

    python scripts/probe_runtime_import.py forge_kernels      (prints µs per module, 3 fresh processes)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import importlib.util, sys, time
    import torch
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    clk = time.perf_counter
    pkg = sys.argv[1]
    t = clk(); import importlib; __import__(pkg); print(f"import {pkg:30s} {1e6 * (clk() - t):7.0f} us")
    for m in ("errors", "host_triton", "packing", "tables", "_fastlaunch", "fastpath", "kernel", "drivers", "cuda",
              "launch", "host_modules"):
        name = f"{pkg}._runtime.{m}"
        if name in sys.modules:
            print(f"{m:14s} already imported"); continue
        t0 = clk(); spec = importlib.util.find_spec(name); t1 = clk()
        if spec is None:
            continue
        code = spec.loader.get_code(name) if hasattr(spec.loader, "get_code") else None; t2 = clk()
        if code is None:
            importlib.import_module(name); t3 = clk()
            print(f"{m:14s} find {1e6*(t1-t0):6.0f}  import (extension) {1e6*(t3-t2):6.0f} us"); continue
        mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod
        exec(code, mod.__dict__); t3 = clk()
        setattr(sys.modules[f"{pkg}._runtime"], m, mod)
        print(f"{m:14s} find {1e6*(t1-t0):6.0f}  get_code {1e6*(t2-t1):6.0f}  exec {1e6*(t3-t2):6.0f} us")
""")


def main() -> None:
    pkg = sys.argv[1] if len(sys.argv) > 1 else "forge_kernels"
    for _ in range(3):
        print(subprocess.run([sys.executable, "-c", CHILD, pkg], capture_output=True, text=True, check=False).stdout)


if __name__ == "__main__":
    main()
