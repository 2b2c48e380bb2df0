"""What a first call loads and never runs: ``first_call_trace.py``'s output set against the runtime's bytecode.

    python scripts/first_call_weight.py trace.json [--top 40]

For each runtime module a first call imports: its marshalled bytecode, the part in functions that ran, the part in
functions that did not (the largest named), per op and for the union of the ops.
"""

from __future__ import annotations

import argparse
import json
import marshal
import types
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent / "forge_aot" / "runtime"


def functions(code: types.CodeType, prefix: str = "") -> list[tuple[str, int, int]]:
    """(qualified name, first line, marshalled size) of the code objects directly under ``code``."""
    out = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out.append((const.co_qualname, const.co_firstlineno, len(marshal.dumps(const))))
            out.extend(functions(const))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    trace = json.loads(args.trace.read_text())
    ran = {(Path(f).stem, q, line) for calls in trace.values() for f, q, line in calls}
    modules = sorted({m for m, _, _ in ran})
    unrun_all = []
    total = run_total = 0
    for mod in modules:
        src = RUNTIME / f"{mod}.py"
        code = compile(src.read_text(), str(src), "exec")
        size = len(marshal.dumps(code))
        fns = functions(code)
        # top-level functions and methods only (a nested one is inside its parent's size)
        named = [(q, line, n) for q, line, n in fns if "<locals>" not in q and q not in ("<lambda>",)
                 and not q.startswith("<")]
        classes = {q for q, _, _ in named if any(o.startswith(q + ".") for o, _, _ in named)}
        leaves = [(q, line, n) for q, line, n in named if q not in classes]
        unrun = [(q, line, n) for q, line, n in leaves if (mod, q, line) not in ran]
        unrun_size = sum(n for _, _, n in unrun)
        total += size
        run_total += size - unrun_size
        print(f"{mod:16s} {size:7d} B  unrun functions {unrun_size:7d} B ({100 * unrun_size / size:4.1f}%)")
        unrun_all.extend((n, f"{mod}.{q}") for q, _, n in unrun)
    print(f"{'total':16s} {total:7d} B  unrun {total - run_total:7d} B")
    for n, name in sorted(unrun_all, reverse=True)[:args.top]:
        print(f"  {n:6d}  {name}")


if __name__ == "__main__":
    main()
