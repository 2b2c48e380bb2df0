"""Which of the runtime's functions a fresh process's import + first call runs (a profile hook, no timing).

    python scripts/first_call_trace.py forge_kernels vector_add matmul softmax > trace.json

Prints JSON: for each op, the (file, qualified name, first line) of every runtime function called from
``import <package>`` to the op's first result, each op in its own fresh process. ``scripts/first_call_weight.py``
(local) sets them against the modules' bytecode: what a first call loads and never runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import json, sys, torch
op = sys.argv[2]
shape = {"vector_add": (1 << 20,), "matmul": (1000, 1000), "softmax": (1000, 777)}[op]
x = torch.randn(*shape, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
seen = {}
def hook(frame, event, arg):
    if event == "call":
        code = frame.f_code
        if "_runtime" in code.co_filename:
            seen[(code.co_filename, code.co_qualname, code.co_firstlineno)] = 1
sys.setprofile(hook)
pkg = __import__(sys.argv[1])
getattr(pkg, op)(x, x) if op != "softmax" else pkg.softmax(x)
torch.cuda.synchronize()
sys.setprofile(None)
print(json.dumps(sorted(seen)))
"""


def main() -> None:
    package, ops = sys.argv[1], sys.argv[2:]
    out = {}
    for op in ops:
        proc = subprocess.run([sys.executable, "-c", CHILD, package, op], capture_output=True, text=True, cwd="/")
        out[op] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-2000:]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
