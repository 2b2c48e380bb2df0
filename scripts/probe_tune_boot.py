"""Where a warm `forge-aot tune` spends its wall time before the GPU benchmarks: the bench_tuning.py project
(matmul, its small space, 5 shapes), tuned cold and then warm (--force, every binary cached) a few times, against
the pieces alone in fresh processes with nothing else running: `import torch`, and the plan (import the kernel
files, trace the tuning inputs on the meta device), with forge-aot's meta shortcuts and with torch's own Python
meta kernels (which import sympy and Dynamo), interleaved.

    python scripts/probe_tune_boot.py --out DIR      (on a GPU machine; prints a table, writes DIR/probe.json)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_tuning as bt  # noqa: E402

PLAN_ALONE = """
import contextlib, sys, time, json
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
if sys.argv[2] == "torch-meta":  # as before the meta shortcuts: torch's Python meta kernels trace the inputs
    import forge_aot.trace
    forge_aot.trace.meta_random_factories = contextlib.nullcontext
plan = make_plan(load_manifest(sys.argv[1]), ["sm_90"])
t2 = time.perf_counter()
print(json.dumps({"mode": sys.argv[2], "import_torch": t1 - t0, "plan_after_torch": t2 - t1,
                  "dynamo": "torch._dynamo" in sys.modules, "sympy": "sympy" in sys.modules}))
"""


def timed(cmd: list[str], **kw: object) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, **kw)  # type: ignore[call-overload]
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("-j", "--jobs", type=str, default=str(os.cpu_count()))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result: dict[str, object] = {}
    result["python_alone_s"] = [timed([sys.executable, "-c", "pass"]) for _ in range(3)]
    result["import_torch_alone_s"] = [timed([sys.executable, "-c", "import torch"]) for _ in range(3)]
    result["import_torch_cuda_alone_s"] = [timed([sys.executable, "-c", "import torch; torch.zeros(1, device='cuda')"])
                                           for _ in range(2)]
    result["import_triton_alone_s"] = [timed([sys.executable, "-c", "import triton"]) for _ in range(2)]
    with tempfile.TemporaryDirectory() as tmp:
        proj = bt.project(Path(tmp) / "proj", bt.small_space(), bt.SHAPES, "exhaustive")
        build = Path(tmp) / "build"
        plans = []
        for _ in range(2):
            for mode in ("shortcuts", "torch-meta"):  # interleaved: the same host state for both
                out = subprocess.run([sys.executable, "-c", PLAN_ALONE, str(proj / "kernel_manifest.toml"), mode],
                                     cwd=proj, env=env, capture_output=True, text=True, check=True)
                plans.append(json.loads(out.stdout.strip().splitlines()[-1]))
        result["plan_alone"] = plans
        runs = []
        for i in range(1 + args.warm_runs):
            extra = ["-j", args.jobs] + (["--force"] if i else [])
            r = bt.forge_tune(proj, build, *extra)
            runs.append({k: r[k] for k in ("wall", "run_wall", "boot_wall", "first_row_at", "benchmark_wall",
                                           "close_seconds", "compile_wall", "boot_stages", "process_to_tune_s")})
            runs[-1]["kind"] = "warm" if i else "cold"
        result["tune_runs"] = runs
    (args.out / "probe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
