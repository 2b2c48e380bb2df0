#!/usr/bin/env bash
# Session 56 (second try), r4 (the machine of r3, warm): bench_launch.py (host time per call beside torch, Triton's
# JIT and the C cuLaunchKernel floor) and the cold start's stages (scripts/probe_cold_stages.py, 9 fresh processes,
# twice) on the final code's wheel.
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_kernels-*.whl dist/forge_launch-*.whl 2>&1 | tail -2
PYTHONPATH=$PWD timeout 240 python3 benchmarks/bench_launch.py --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
tail -30 "$OUT/bench_launch.txt"
for round in 1 2; do
  PYTHONPATH=$PWD timeout 100 python3 scripts/probe_cold_stages.py dist/forge_kernels-*.whl --runs 9 >> "$OUT/stages.txt" 2>&1
done
grep -E "^import|first call|read bundle|exec fastpath|unmarshal|sum" "$OUT/stages.txt"
