"""Where a fresh process's ``import <package>`` + first ``vector_add`` go, stage by stage, for installed copies of a
wheel: a measurement of the runtime's cold start, not product.

Each DIR is a ``pip install --target`` of a forge_kernels wheel. The probe copies it, puts clock reads between the
statements of the copy's generated ``__init__.py`` (the runtime package's and ``lean``'s import, ``load_package``),
writes the copy's bytecode bundle (or removes it: ``--no-bundle``; since session 61 it serves the full runtime only,
read at a hand-over), and runs fresh processes, interleaved across the copies: after ``import torch`` and the CUDA
context (or the test suite's fake driver, compiled and put first on the library path: ``--fake``), it times the
import and then the first call: the import of its modules (``lean_kernel``, ``lean_launch``, ``basics``), then the
call, whose parts it reads by wrapping the lean binding's functions (``bind``, the extension's and the driver's
loading, the index reads, the launch's table, binary load and config choice).

    python scripts/probe_import_stages.py DIR[:no-bundle] [DIR ...] [--runs 21] [--fake] [--no-bundle] [--json out.json]

``DIR:no-bundle`` runs that copy without its bundle (as ``--no-bundle`` runs every copy), so one run compares a wheel
with and without it, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from probe_children import DEVICE

CHILD = DEVICE + textwrap.dedent("""
    import functools, json
    n = 4099  # not a table row: the nearest row is ranked
    x = torch.randn(n + 1, device=dev, dtype=torch.float16)[1:]  # misaligned by one element
    y = torch.randn(n, device=dev, dtype=torch.float16)
    t0 = clk()
    import forge_kernels
    t1 = clk()
    marks = forge_kernels._STAGES
    stages = {"find package": marks[0] - t0}
    for name, a, b in zip(forge_kernels._STAGE_NAMES, marks, marks[1:]):
        stages[name] = b - a
    stages["rest of __init__"] = t1 - marks[-1]
    t1b = clk()
    import forge_kernels._runtime.lean_kernel as lk  # (what the first call imports first)
    try:  # (since session 62 a lean call's resolution is lean_launch's)
        import forge_kernels._runtime.lean_launch as ll
    except ImportError:
        ll = lk
    parts = {"first call: modules (lean_kernel, basics)": clk() - t1b}

    def wrap(owner, name, label):
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a, **k):
            t = clk()
            try:
                return f(*a, **k)
            finally:
                parts[label] = parts.get(label, 0.0) + clk() - t
        setattr(owner, name, timed)

    lean = getattr(ll, "Lean", None) or lk._Lean
    if lk is not None:
        for owner, name in ((lk, "bind"), (lk, "extension"), (lk, "c_driver"), (lk, "ops_package"),
                            (lk.json, "load"), (lean, "launch"), (lean, "_table"), (lean, "_load"),
                            (ll, "pick_config")):
            wrap(owner, name, f"first call: {'json.load' if owner is lk.json else name}")
    t2 = clk()
    out = forge_kernels.vector_add(x, y)
    if dev == "cuda":
        torch.cuda.synchronize()
    t3 = clk()
    ok = dev != "cuda" or torch.allclose(out.float(), x.float() + y.float(), atol=1e-2)  # (fake: nothing runs)
    stages.update(parts)
    first = t3 - t2 + parts["first call: modules (lean_kernel, basics)"]
    print(json.dumps({"import": t1 - t0, "first": first, "ok": bool(ok), "stages": stages}))
""")

LAYOUTS = (
    # (since session 61) the package entry imports _runtime.lean alone
    ({"runtime + lean import": "from ._runtime.lean import load_package as _load_package\n",
      "load_package": "_exported, preload = _load_package("}),
    # (sessions 56 - 60) use_bundle ran the lean modules from the bytecode bundle first
    ({"runtime import": "from ._runtime import use_bundle as _use_bundle\n",
      "use_bundle": "_use_bundle(",
      "lean import": "from ._runtime.lean import load_package as _load_package  # noqa: E402\n",
      "load_package": "_exported, preload = _load_package("}),
)
"""Per layout of the generated ``__init__``: each stage's name and the line that starts it (a clock read goes before
each, and one after the last stage's line)."""


def _instrumented(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    init = dest / "forge_kernels" / "__init__.py"
    text = init.read_text()
    layout = next((stages for stages in LAYOUTS if all(a in text for a in stages.values())), None)
    if layout is None:
        sys.exit(f"{init}: not a layout of the generated __init__ this probe knows")
    head = f"import time as _time\n_STAGES = []\n_STAGE_NAMES = {list(layout)!r}\n"
    for anchor in layout.values():  # (each a statement on one line)
        at = text.index(anchor)
        text = text[:at] + "_STAGES.append(_time.perf_counter())\n" + text[at:]
    end = text.index("\n", text.index(list(layout.values())[-1])) + 1
    text = text[:end] + "_STAGES.append(_time.perf_counter())\n" + text[end:]
    text = text.replace('"""\n\n', '"""\n\n' + head, 1)
    init.write_text(text)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--no-bundle", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    mode = "fake" if a.fake else "cuda"
    work = Path(tempfile.mkdtemp(prefix="forge_stages_"))
    plain = {str(d): Path(str(d).removesuffix(":no-bundle")) for d in a.dirs}
    unbundled = {name for name in plain if a.no_bundle or name.endswith(":no-bundle")}
    copies = {name: _instrumented(d, work / f"copy{i}") for i, (name, d) in enumerate(plain.items())}
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    if a.fake:  # the test suite's fake driver, compiled here, first on the library path (as probe_first_call_fake)
        from probe_first_call_fake import fake_driver

        lib = fake_driver(work)
        base["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (str(lib), base.get("LD_LIBRARY_PATH"))))
    for name, copy in copies.items():
        env = base | {"PYTHONPATH": str(copy)}
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(copy)], check=True, env=env)
        if name in unbundled:
            for f in (copy / "forge_kernels" / "_runtime" / "__pycache__").glob("_bundle.*"):
                f.unlink()
        else:
            subprocess.run([sys.executable, "-c", "import torch, forge_kernels._runtime as r, forge_kernels; "
                            "assert r.write_bundle()"], env=env, check=True, cwd="/")
    runs: dict[str, list[dict]] = {name: [] for name in copies}
    for i in range(a.runs + 1):
        for name in (list(copies) if i % 2 else list(copies)[::-1]):
            env = base | {"PYTHONPATH": str(copies[name])}
            if name in unbundled:
                env["PYTHONDONTWRITEBYTECODE"] = "1"  # (the first call would write it)
            out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, cwd="/", capture_output=True, text=True)
            if out.returncode:
                sys.exit(out.stderr)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            if not got["ok"]:
                sys.exit(f"{name}: wrong result")
            if i:  # (the first round: page cache, bytecode written)
                runs[name].append(got)
    print(f"import + first vector_add ({mode}, without the bundle: {', '.join(sorted(unbundled)) or 'none'}; "
          f"{a.runs} interleaved fresh processes; ms, median (q1 - q3))")
    table = {}
    for name, rs in runs.items():
        def med(values: list[float]) -> str:
            q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
            return f"{1e3 * statistics.median(values):.3f} ({1e3 * q[0]:.3f} - {1e3 * q[2]:.3f})"
        total = [r["import"] + r["first"] for r in rs]
        print(f"{name}\n  total {med(total)}  import {med([r['import'] for r in rs])}  "
              f"first call {med([r['first'] for r in rs])}")
        stages = {s for r in rs for s in r["stages"]}
        for s in sorted(stages, key=lambda s: (s.startswith("first call"), s)):
            print(f"    {s:32s} {med([r['stages'].get(s, 0.0) for r in rs])}")
        table[name] = {"total_ms": 1e3 * statistics.median(total), "runs": rs}
    if a.json:
        a.json.write_text(json.dumps({"mode": mode, "unbundled": sorted(unbundled), "copies": table}, indent=1))


if __name__ == "__main__":
    main()
