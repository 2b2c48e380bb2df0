"""Which of the runtime's functions an import + first call runs, and how much of the runtime's bytecode that is.

A fresh process per op (after torch and the CUDA context): ``sys.setprofile`` records every runtime code object
called during ``import <package>`` and the op's first call. Per runtime module: the marshalled size of its code
objects that ran against all of them (the unmarshal and module-body cost of importing it is in proportion to the
whole), so the share a first call could leave unloaded is read off the table.

    python scripts/probe_first_call_coverage.py [--package forge_kernels] [--op vector_add]
"""

from __future__ import annotations

import argparse
import glob
import json
import marshal
import subprocess
import sys
import textwrap
import types

CHILD = textwrap.dedent("""
    import json, sys, torch
    package, op, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if op == "matmul":
        args = [torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2)]
    elif op == "softmax":
        args = [torch.randn(n, 1000, device="cuda", dtype=torch.float16)]
    else:
        args = [torch.randn(n, device="cuda", dtype=torch.float16) for _ in range(2)]
    torch.cuda.synchronize()
    seen = set()
    def prof(frame, event, arg):
        if event == "call" and "/_runtime/" in frame.f_code.co_filename:
            seen.add((frame.f_code.co_filename, frame.f_code.co_firstlineno, frame.f_code.co_name))
    sys.setprofile(prof)
    mod = __import__(package)
    getattr(mod, op)(*args)
    torch.cuda.synchronize()
    sys.setprofile(None)
    print(json.dumps({"root": mod.__path__[0], "seen": sorted(seen)}))
""")


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    out = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out += _code_objects(const)
    return out


def own(code: types.CodeType) -> int:
    """A code object's marshalled size without the code objects nested in it (counted on their own)."""
    return len(marshal.dumps(code)) - sum(len(marshal.dumps(k)) for k in code.co_consts
                                          if isinstance(k, types.CodeType))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package", default="forge_kernels")
    ap.add_argument("--op", action="append")
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args()
    for op in args.op or ["vector_add"]:
        out = subprocess.run([sys.executable, "-c", CHILD, args.package, op, str(args.size)], check=True,
                             capture_output=True, text=True, cwd="/")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        seen = {(f, line) for f, line, _ in res["seen"]}
        files = sorted(glob.glob(f"{res['root']}/_runtime/*.py"))
        print(f"{args.package}.{op}: runtime code objects run by import + first call")
        print(f"{'module':16s} {'functions run':>14s} {'bytes run':>10s} {'bytes all':>10s} {'share':>6s}")
        total_run = total_all = 0
        for path in files:
            with open(path, encoding="utf-8") as f:
                module = compile(f.read(), path, "exec")
            codes = _code_objects(module)[1:]  # the module body itself always runs
            ran = [c for c in codes if (path, c.co_firstlineno) in seen]
            size_all = sum(own(c) for c in codes)
            size_run = sum(own(c) for c in ran)
            total_run += size_run
            total_all += size_all
            name = path.rsplit("/", 1)[1]
            print(f"{name:16s} {len(ran):6d} / {len(codes):<6d} {size_run:10d} {size_all:10d} "
                  f"{(size_run / size_all if size_all else 0):6.0%}")
        print(f"{'all':16s} {'':14s} {total_run:10d} {total_all:10d} {total_run / total_all:6.0%}")


if __name__ == "__main__":
    main()
