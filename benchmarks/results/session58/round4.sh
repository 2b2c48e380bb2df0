#!/usr/bin/env bash
# Session 58, r4: the issue's own cold-start benchmark on the final code (a3fb2ca), the small-op table only:
# vector_add's import + first call (the wheel, now lean; with and without its bytecode bundle) beside its floor.
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_kernels-*.whl 2>&1 | tail -2
timeout 400 python3 benchmarks/bench_cold_start.py --op-only --repeats 7 --json "$OUT/cold_start.json" \
  > "$OUT/bench_cold_start.txt" 2>&1
tail -30 "$OUT/bench_cold_start.txt"
