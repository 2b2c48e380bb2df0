"""Whether the compile workers that a warm ``forge-aot tune`` starts ahead of time (every binary cached, so none
is used) slow its boot: the bench_tuning.py project tuned cold once, then warm (--force) with ``-j`` values
interleaved, a few runs each; per run the whole command's wall time and its boot stages.

    python scripts/probe_warm_tune.py --jobs 16 1 --runs 3 --out DIR      (on a GPU machine)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_tuning as bt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    proj = bt.project(work / "p48", bt.small_space(), bt.SHAPES, "exhaustive")
    build = work / "forge-build"
    cold = bt.forge_tune(proj, build, "-j", str(max(args.jobs)))
    print(f"cold: {cold['wall']:.2f} s")
    runs: dict[int, list[dict]] = {j: [] for j in args.jobs}
    for r in range(args.runs):
        for j in args.jobs if r % 2 == 0 else reversed(args.jobs):
            out = bt.forge_tune(proj, build, "--force", "-j", str(j))
            runs[j].append(out)
            stages = {k: round(v, 2) for k, v in out["boot_stages"].items()}
            print(f"-j {j:2d}: wall {out['wall']:.2f} s, boot {out['boot_wall']}, first row {out['first_row_at']}, "
                  f"benchmark {out['benchmark_wall']:.2f} s, stages {stages}", flush=True)
    summary = {j: {"wall_median": statistics.median(o["wall"] for o in v),
                   "walls": [o["wall"] for o in v]} for j, v in runs.items()}
    for j, s in summary.items():
        print(f"-j {j:2d}: median {s['wall_median']:.2f} s  ({', '.join(f'{w:.2f}' for w in s['walls'])})")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        def slim(run: dict) -> dict:  # the database lines are the bench_tuning project's, not this probe's
            return {k: v for k, v in run.items() if k != "records"}

        (args.out / "probe_warm_tune.json").write_text(json.dumps(
            {"cold": slim(cold), "runs": {j: [slim(o) for o in v] for j, v in runs.items()}}, default=str))


if __name__ == "__main__":
    main()
