"""Session 54: import + first call of library-style ops in fresh processes, several installs of the cold-handle
fixture's wheel (``tests/fixtures/realworld/cold_manifest.toml``, ``forge_coldlib``) interleaved run by run, each with
its bytecode bundle written: session 53's wheel against this session's, cold handles against the full binding
(``FORGE_NO_COLD=1``). Each child has torch imported, the CUDA context up and its inputs allocated before the clock
starts; it reports the handles that served the first call and the runtime modules loaded.

    python cold_ab_lib.py --repeats 9 old=/tmp/old new=/tmp/new new-full=/tmp/new:nocold [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SETUP = {
    # Liger-style RMSNorm: autograd Function in host code, a custom op with a backward (the package routes ops), a
    # project module imported (ligerlike.ops.utils)
    "rms_norm": ("x = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                 "w = torch.randn(4096, device='cuda', dtype=torch.bfloat16)",
                 "lib.rms_norm(x, w, offset=1.0, casting_mode='gemma')"),
    "liger_fused_add_rms_norm": ("x = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                                 "r = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                                 "w = torch.randn(4096, device='cuda', dtype=torch.bfloat16)",
                                 "lib.liger_fused_add_rms_norm(x, r, w, 1e-6, 0.0, 'llama')"),
    "liger_cross_entropy": ("x = torch.randn(8, 32000, device='cuda', dtype=torch.bfloat16)\n"
                            "t = torch.randint(0, 32000, (8,), device='cuda')",
                            "lib.liger_cross_entropy(x, t)"),
    # FLA: @triton.heuristics on None arguments, every argument by keyword, project modules (flalike)
    "chunk_local_cumsum": ("g = torch.randn(2, 1000, 4, device='cuda', dtype=torch.bfloat16)",
                           "lib.chunk_local_cumsum(g, 64, scale=0.5)"),
    # torchao: wrap_triton(kernel)[grid](...) inside a @triton_op
    "scale_rows": ("x = torch.randn(4, 4096, device='cuda', dtype=torch.float16)\n"
                   "s = torch.rand(4, device='cuda')",
                   "lib.scale_rows(x, s)"),
}

CHILD = """
import json, sys, time
import torch
{setup}
torch.cuda.synchronize()
t0 = time.perf_counter()
import forge_coldlib as lib
t1 = time.perf_counter()
{call}
torch.cuda.synchronize()
t2 = time.perf_counter()
kinds = sorted({{type(h).__name__ for m, mod in list(sys.modules.items()) if m.startswith("forge_coldlib._ops.")
                for h in vars(mod).values() if type(h).__name__ in ("ColdKernel", "Kernel")}})
runtime = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_coldlib._runtime."))
print(json.dumps({{"import": t1 - t0, "first": t2 - t1, "total": t2 - t0, "kinds": kinds, "runtime": runtime}}))
"""


def run(op: str, env: dict[str, str]) -> dict | None:
    setup, call = SETUP[op]
    proc = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, call=call)], capture_output=True, text=True,
                          env=env, cwd="/tmp", timeout=120)
    if proc.returncode:
        if "has no attribute" in proc.stderr:  # an op the older wheel does not have
            return None
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("installs", nargs="+", help="NAME=DIR[:nocold] (pip install --target DIR)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--ops", default=",".join(SETUP))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORGE_NO_COLD")}
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    envs = {}
    for item in args.installs:
        name, spec = item.split("=", 1)
        target, _, mode = spec.partition(":")
        envs[name] = dict(base, PYTHONPATH=target, **({"FORGE_NO_COLD": "1"} if mode == "nocold" else {}))
        subprocess.run([sys.executable, "-c", "import forge_coldlib._runtime as r; r.write_bundle()"], check=True,
                       env=envs[name], cwd="/tmp")
    out: dict = {"repeats": args.repeats}
    print(f"{'op':26s} {'install':10s} {'import':>8s} {'first':>8s} {'total':>8s} {'range':>17s}  (ms, medians)")
    for op in args.ops.split(","):
        runs: dict[str, list[dict]] = {name: [] for name in envs}
        for _ in range(args.repeats):
            for name, env in envs.items():
                r = run(op, env)
                if r is not None:
                    runs[name].append(r)
        out[op] = {}
        for name, rs in runs.items():
            if not rs:
                continue
            med = {k: statistics.median(r[k] for r in rs) * 1e3 for k in ("import", "first", "total")}
            totals = [r["total"] * 1e3 for r in rs]
            out[op][name] = {**med, "runs": totals, "kinds": rs[-1]["kinds"], "runtime": rs[-1]["runtime"]}
            print(f"{op:26s} {name:10s} {med['import']:8.3f} {med['first']:8.3f} {med['total']:8.3f} "
                  f"{min(totals):7.3f} - {max(totals):7.3f}  {','.join(rs[-1]['kinds'])}", flush=True)
        for name, r in out[op].items():
            print(f"{'':26s} {name}: {' '.join(r['runtime'])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
