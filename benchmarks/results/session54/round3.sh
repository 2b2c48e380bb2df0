#!/usr/bin/env bash
# Session 54, r3: vector_add's import + first call against session 53's wheel (built from 6ed54ab, .hunt/base53;
# session 52's cold_ab.py: interleaved fresh processes, both with their bundles), then bench_launch.py.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/base53 .hunt/base53/forge_kernels-*.whl
PYTHONPATH=$PWD timeout 150 python3 benchmarks/results/session52/cold_ab.py --baseline /tmp/base53 --repeats 10 \
  --json "$OUT/cold_ab.json" > "$OUT/cold_ab.txt" 2>&1
tail -5 "$OUT/cold_ab.txt"
timeout 200 python3 benchmarks/bench_launch.py --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
tail -25 "$OUT/bench_launch.txt"
