#!/usr/bin/env bash
# Does the tuner's orchestration scale with workers when the GPU is not the limit? Two benchmark workers on the
# same GPU (--gpus 0,0) against one, on a copy of the repository's project (its database is never touched).
# Writes each run's run.json and a summary (benchmark wall, per-row start/duration per worker) to ${OUT}.
set -uo pipefail
OUT=${OUT:-two-workers}; mkdir -p "$OUT"
P=$(mktemp -d); cp -r kernel_manifest.toml kernels tuning "$P"/
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
i=0
for g in ${GPUS_SEQ:-0 0 0,0 0 0,0}; do
  i=$((i + 1))
  (cd "$P" && timeout 300 python3 -m forge_aot.cli tune -q --no-report --kernel softmax --kernel add --force --gpus "$g" \
    > "$OUT/tune_${i}_${g}.txt" 2>&1)
  cp "$P/build/forge-aot/tune/run.json" "$OUT/run_${i}_${g}.json"
  python3 - "$OUT/run_${i}_${g}.json" "$g" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
items = d.get("items", [])
print(f"--gpus {sys.argv[2]}: benchmark_wall {d['benchmark_wall']:.2f} s, wall {d['wall']:.2f} s, rows {len(items)}, "
      f"row seconds {sum(it.get('seconds') or 0 for it in items):.2f}, gpu idle {d.get('gpu_idle_seconds', 0):.2f} s")
by_worker = {}
for it in items:  # rows that ran: their worker's command seconds (what a non-scaling run waits on)
    w = by_worker.setdefault(it.get("gpu"), {"rows": 0})
    w["rows"] += 1
    for phase, sec in (it.get("phases") or {}).items():
        w[phase] = w.get(phase, 0.0) + sec
for gpu, w in by_worker.items():
    print(f"    worker on GPU {gpu}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in w.items()))
PY
done
