"""Session 53: import + first call of library-style ops (forge_realworld, installed), cold handles against the full
binding (``FORGE_NO_COLD=1``), interleaved fresh processes, both with the wheel's bytecode bundle. Each child has
torch imported, the CUDA context up and its inputs allocated before the clock starts, as bench_cold_start's do;
it reports the classes of the handles that served the first call and the runtime modules it loaded."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SETUP = {
    # Liger-style RMSNorm (autograd Function in host code, a custom op with a backward: the package routes ops)
    "rms_norm": ("x = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                 "w = torch.randn(4096, device='cuda', dtype=torch.bfloat16)",
                 "lib.rms_norm(x, w, offset=1.0, casting_mode='gemma')"),  # (bf16 built in Gemma's casting)
    # Liger's fused add + RMSNorm (a project module imported, casting mode from tl.constexpr globals)
    "liger_fused_add_rms_norm": ("x = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                                 "r = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16)\n"
                                 "w = torch.randn(4096, device='cuda', dtype=torch.bfloat16)",
                                 "lib.liger_fused_add_rms_norm(x, r, w, 1e-6, 0.0, 'llama')"),
    # Liger's cross entropy (every argument by keyword, a string constexpr, None to a float, num_warps=32)
    "liger_cross_entropy": ("x = torch.randn(8, 32000, device='cuda', dtype=torch.bfloat16)\n"
                            "t = torch.randint(0, 32000, (8,), device='cuda')",
                            "lib.liger_cross_entropy(x, t)"),
}

CHILD = """
import json, sys, time
import torch
{setup}
torch.cuda.synchronize()
t0 = time.perf_counter()
import forge_realworld as lib
t1 = time.perf_counter()
{call}
torch.cuda.synchronize()
t2 = time.perf_counter()
kinds = sorted({{type(h).__name__ for m, mod in list(sys.modules.items()) if m.startswith("forge_realworld._ops.")
                for h in vars(mod).values() if type(h).__name__ in ("ColdKernel", "Kernel")}})
runtime = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("forge_realworld._runtime."))
print(json.dumps({{"import": t1 - t0, "first": t2 - t1, "total": t2 - t0, "kinds": kinds, "runtime": runtime}}))
"""


def run(op: str, env: dict[str, str]) -> dict:
    setup, call = SETUP[op]
    proc = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, call=call)], capture_output=True, text=True,
                          env=env, cwd="/tmp", timeout=120)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--ops", default=",".join(SETUP))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORGE_NO_COLD")}
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    envs = {"cold": base, "full": dict(base, FORGE_NO_COLD="1")}
    out: dict = {"repeats": args.repeats}
    print(f"{'op':26s} {'handles':8s} {'import':>8s} {'first':>8s} {'total':>8s} {'range':>16s}  (ms, medians)")
    for op in args.ops.split(","):
        runs: dict[str, list[dict]] = {name: [] for name in envs}
        for _ in range(args.repeats):
            for name, env in envs.items():
                runs[name].append(run(op, env))
        out[op] = {}
        for name, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) * 1e3 for k in ("import", "first", "total")}
            totals = [r["total"] * 1e3 for r in rs]
            out[op][name] = {**med, "runs": totals, "kinds": rs[-1]["kinds"], "runtime": rs[-1]["runtime"]}
            print(f"{op:26s} {name:8s} {med['import']:8.3f} {med['first']:8.3f} {med['total']:8.3f} "
                  f"{min(totals):7.3f} - {max(totals):6.3f}  {','.join(rs[-1]['kinds'])}", flush=True)
        print(f"{'':26s} cold/full total {out[op]['cold']['total'] / out[op]['full']['total']:.3f}; cold runtime: "
              f"{' '.join(out[op]['cold']['runtime'])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
