"""Where a fresh process's import + first call of a wheel's op goes, stage by stage, with the runtime's bytecode
bundle: the bundle's read, and per first-call module its unmarshal and its module body, then the first call.

The wheel is installed with ``pip install --target`` into a scratch directory whose ``_runtime/__init__.py`` (not a
bundled module, so the bundle stays valid) is patched to time each ``_load_bundled``; fresh processes after torch
and the CUDA context (or the test suite's fake driver, ``--fake``: CPU tensors answer as GPU 0's). Medians.

    python scripts/probe_cold_stages.py dist/forge_kernels-*.whl [--runs 9] [--fake]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from probe_children import DEVICE

PATCHES = [
    ("""    module = importlib.util.module_from_spec(spec)
    sys.modules[fullname] = module
    try:
        spec.loader.exec_module(module)""",
     """    import time as _t
    t0 = _t.perf_counter()
    code = spec.loader.get_code(fullname)
    t1 = _t.perf_counter()
    spec.loader.get_code = lambda n, c=code: c
    module = importlib.util.module_from_spec(spec)
    sys.modules[fullname] = module
    try:
        spec.loader.exec_module(module)
        STAGES.append(("unmarshal " + name, t1 - t0))
        STAGES.append(("exec " + name, _t.perf_counter() - t1))"""),
    ("""    codes = _read_bundle(path, fingerprint)""",
     """    import time as _t
    t0 = _t.perf_counter()
    codes = _read_bundle(path, fingerprint)
    STAGES.append(("read bundle", _t.perf_counter() - t0))"""),
    ("BUNDLE_WANTED = False\n", "BUNDLE_WANTED = False\nSTAGES = []\n"),
]

CHILD = DEVICE + textwrap.dedent("""
    import json
    x = torch.randn(4096, device=dev, dtype=torch.float16); y = torch.randn(4096, device=dev, dtype=torch.float16)
    import gc
    if sys.argv[2] == "nogc":
        gc.disable()
    gc_counts = []
    gc.callbacks.append(lambda phase, info: phase == "start" and gc_counts.append(info["generation"]))
    t0 = clk()
    import forge_kernels
    t1 = clk()
    forge_kernels.vector_add(x, y)
    if dev == "cuda":
        torch.cuda.synchronize()
    t2 = clk()
    import forge_kernels._runtime as r
    out = {"collections": len(gc_counts), "gen2": gc_counts.count(2), "import": t1 - t0, "first call": t2 - t1,
           "import + first call": t2 - t0}
    out.update(r.STAGES)
    print(json.dumps(out))
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--gc", default="gc", choices=["gc", "nogc"], help="nogc: the collector off in the children")
    a = ap.parse_args()
    target = Path(tempfile.mkdtemp(prefix="forge_stages_"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target),
                    a.wheel], check=True)
    init = next(target.glob("*/_runtime/__init__.py"))
    src = init.read_text()
    for old, new in PATCHES:
        assert old in src, old
        src = src.replace(old, new, 1)
    init.write_text(src)
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    import os
    env = {**os.environ, **env}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    pkg = init.parent.parent.name
    subprocess.run([sys.executable, "-c", f"import torch, {pkg}._runtime as r, {pkg}; r.write_bundle()"], env=env,
                   check=True, cwd="/")
    mode = "fake" if a.fake else "cuda"
    runs = []
    for _ in range(a.runs + 1):
        out = subprocess.run([sys.executable, "-c", CHILD, mode, a.gc], env=env, capture_output=True, text=True,
                             cwd="/")
        if out.returncode:
            sys.exit(out.stderr)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    runs = runs[1:]  # the first process wrote the patched __init__'s .pyc
    keys = list(runs[0])
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    for k in keys:
        low, high = 1e6 * min(r[k] for r in runs), 1e6 * max(r[k] for r in runs)
        print(f"{k:28s} {med[k]:8.1f}" if k in ("collections", "gen2")
              else f"{k:28s} {1e6 * med[k]:8.0f} us  ({low:.0f} - {high:.0f})")
    print(f"{'sum unmarshal':28s} {1e6 * sum(v for k, v in med.items() if k.startswith('unmarshal')):8.0f} us")
    print(f"{'sum exec':28s} {1e6 * sum(v for k, v in med.items() if k.startswith('exec')):8.0f} us")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "medians": med}, indent=1))


if __name__ == "__main__":
    main()
