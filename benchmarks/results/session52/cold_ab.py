"""Session 52: vector_add import + first call, this session's wheel (installed: cold handles) against session 51's
(``--baseline DIR``, pip --target), both with their bytecode bundles, interleaved fresh processes (bench_cold_start's
own child and helpers), more repeats than bench_cold_start's five-mode table fits in one device call. Also names the
driver class the new wheel's first call used, the class of the handle that served it and the runtime modules it
loaded."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bench_cold_start as bcs

DRIVER = """
import json, torch
x = torch.ones(8, device="cuda", dtype=torch.float16)
import forge_kernels
forge_kernels.vector_add(x, x)
import sys
from forge_kernels._runtime import drivers
print(json.dumps({"driver": type(drivers._driver).__name__,
                  "handle": type(sys.modules["forge_kernels._ops.vector_add"].add_kernel).__name__,
                  "runtime": sorted(m.rsplit(".", 1)[1] for m in sys.modules
                                    if m.startswith("forge_kernels._runtime."))}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base_env = dict(os.environ)
    base_env.pop("PYTHONPATH", None)
    envs = {"new": base_env, "baseline": dict(base_env, PYTHONPATH=str(args.baseline.resolve()))}
    for env in envs.values():
        bcs._write_bundle(env)
    probe = bcs._run(DRIVER, [], base_env)
    driver = f"{probe['driver']}, handle {probe['handle']}, runtime modules {probe['runtime']}"
    runs: dict[str, list[dict]] = {name: [] for name in envs}
    for i in range(args.repeats):
        for name, env in envs.items():
            runs[name].append(bcs._run(bcs.CHILD_OP, [str(1 << 20)], dict(env, PYTHONDONTWRITEBYTECODE="1")))
        # each repeat as it ends (a device call's time limit still leaves what ran)
        print(f"repeat {i}: " + ", ".join(f"{n} {rs[-1]['import_and_first_call'] * 1e3:.3f} ms (import "
                                          f"{rs[-1]['import_pkg'] * 1e3:.3f})" for n, rs in runs.items()), flush=True)
    print(f"vector_add fp16 2^20, fresh processes interleaved, {args.repeats} each; new wheel driver: {driver}")
    print(f"{'wheel':10s} {'import (ms)':>12s} {'first call (ms)':>16s} {'import+first (ms)':>18s} {'range':>16s}")
    out = {"driver": driver, "repeats": args.repeats}
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) * 1e3 for k in ("import_pkg", "first_call",
                                                                        "import_and_first_call")}
        both = [r["import_and_first_call"] * 1e3 for r in rs]
        out[name] = {**med, "min": min(both), "max": max(both), "runs": both}
        print(f"{name:10s} {med['import_pkg']:12.3f} {med['first_call']:16.3f} {med['import_and_first_call']:18.3f} "
              f"{min(both):7.3f} - {max(both):6.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
