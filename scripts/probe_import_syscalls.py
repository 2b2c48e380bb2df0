"""What one import costs on this machine, piece by piece: syscalls (stat, open+read), the import system's finders,
unmarshal and exec, for an installed package's runtime modules. Prints µs medians over repeats.

    python scripts/probe_import_syscalls.py forge_kernels
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import statistics
import sys
import tempfile
import time


def per_call_us(fn, n: int = 2000) -> float:
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(samples)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main() -> None:
    package = sys.argv[1] if len(sys.argv) > 1 else "forge_kernels"
    spec = importlib.util.find_spec(package)
    root = os.path.dirname(spec.origin)
    rt = os.path.join(root, "_runtime")
    small = os.path.join(rt, "errors.py")
    with tempfile.TemporaryDirectory() as tmp:
        tiny = [os.path.join(tmp, f"tiny_{i}.py") for i in range(200)]
        for p in tiny:
            with open(p, "w") as f:
                f.write("X = 1\n")
        sys.path.insert(0, tmp)
        import py_compile

        for p in tiny:
            py_compile.compile(p)
        rows = {
            "os.stat(file)": per_call_us(lambda: os.stat(small)),
            "os.listdir(runtime dir)": per_call_us(lambda: os.listdir(rt), 500),
            "open+read+close (small file)": per_call_us(lambda: read_file(small)),
            "getpid (a cheap syscall)": per_call_us(os.getpid),
        }
        t = time.perf_counter()
        for i in range(200):
            importlib.import_module(f"tiny_{i}")
        rows["import a one-line module (fresh, pyc cached)"] = (time.perf_counter() - t) / 200 * 1e6
        sys.path.remove(tmp)
    for name in sorted(os.listdir(os.path.join(rt, "__pycache__"))):
        data = read_file(os.path.join(rt, "__pycache__", name))
        rows[f"marshal.loads {name} ({len(data)} B)"] = per_call_us(lambda d=data: marshal.loads(d[16:]), 200)
    print("sys.meta_path:", [type(f).__name__ if not isinstance(f, type) else f.__name__ for f in sys.meta_path])
    print("sys.path_hooks:", len(sys.path_hooks), "sys.path:", len(sys.path))
    for k, v in rows.items():
        print(f"  {k:60s} {v:9.2f} us")


if __name__ == "__main__":
    main()
