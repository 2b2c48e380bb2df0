"""Where a fresh process's import of the packaged runtime goes: the import machinery, unmarshalling, module code.

Run in a fresh process with the wheel installed (``python scripts/probe_import_cost.py [package]``); prints JSON.
For each runtime module of the installed package, in the order a first call imports them: the wall time of its
import, and for the same module's cached bytecode the time to read + unmarshal it and to run its code again in a
scratch namespace (outside the import system). Beside them: ten empty modules imported from a temporary
package, which is the import system's own cost per file on this host (finders on sys.meta_path, stats, reads).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import marshal
import os
import sys
import tempfile
import time

ORDER = ("errors", "host_triton", "packing", "tables", "fastpath", "kernel", "drivers", "cuda", "launch",
         "host_modules")


def main() -> None:
    package = sys.argv[1] if len(sys.argv) > 1 else "forge_kernels"
    import torch  # noqa: F401  (what every user process has imported before)

    clock = time.perf_counter
    out: dict[str, object] = {"python": sys.version.split()[0], "meta_path": [type(f).__name__ for f in sys.meta_path]}
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "probe_empty"))
        for i in range(11):
            name = "__init__" if i == 10 else f"m{i}"
            with open(os.path.join(tmp, "probe_empty", f"{name}.py"), "w") as f:
                f.write("x = 1\n")
        sys.path.insert(0, tmp)
        importlib.import_module("probe_empty")
        import py_compile

        for i in range(10):  # bytecode caches written first, as pip does for installed files
            py_compile.compile(os.path.join(tmp, "probe_empty", f"m{i}.py"))
        t = clock()
        for i in range(10):
            importlib.import_module(f"probe_empty.m{i}")
        out["empty module import (us, mean of 10)"] = (clock() - t) / 10 * 1e6
    t = clock()
    importlib.import_module(package)
    out["import package (us)"] = (clock() - t) * 1e6
    rows = {}
    for mod in ORDER:
        name = f"{package}._runtime.{mod}"
        t = clock()
        module = importlib.import_module(name)
        imported = clock() - t
        cached = importlib.util.cache_from_source(module.__file__)
        t = clock()
        with open(cached, "rb") as f:
            data = f.read()
        code = marshal.loads(data[16:])
        unmarshal = clock() - t
        t = clock()
        exec(code, {"__name__": name, "__package__": f"{package}._runtime", "__file__": module.__file__})
        rerun = clock() - t
        rows[mod] = {"import_us": imported * 1e6, "read_unmarshal_us": unmarshal * 1e6, "rerun_code_us": rerun * 1e6,
                     "pyc_bytes": len(data)}
    out["modules"] = rows
    out["total import (us)"] = sum(r["import_us"] for r in rows.values())
    out["total read+unmarshal (us)"] = sum(r["read_unmarshal_us"] for r in rows.values())
    out["total rerun code (us)"] = sum(r["rerun_code_us"] for r in rows.values())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
