#!/usr/bin/env bash
# Session 61, r4: the issue's own benchmarks on this session's final code: the cold-start table of the small op with
# session 60's wheel (.device/dist_old) as --baseline, interleaved; host time per call (bench_launch.py, forge_launch
# built on the CPU machine); the lean probe beside the compact package.
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" >> "$OUT/device.txt"
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_kernels-*.whl dist/forge_launch-*.whl 2>&1 | tail -2
rm -rf /tmp/base && python3 -m pip install -q --no-index --no-deps --target /tmp/base .device/dist_old/forge_kernels-*.whl
timeout 240 python3 benchmarks/bench_cold_start.py --op-only --repeats 9 --baseline /tmp/base \
  --json "$OUT/cold_start.json" > "$OUT/bench_cold_start.txt" 2>&1
tail -22 "$OUT/bench_cold_start.txt"
timeout 180 python3 benchmarks/bench_launch.py --rounds 3 --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
tail -30 "$OUT/bench_launch.txt"
timeout 90 python3 scripts/probe_lean_first_call.py dist/forge_kernels-*.whl --runs 11 --json "$OUT/lean_probe.json" \
  > "$OUT/lean_probe.txt" 2>&1
tail -8 "$OUT/lean_probe.txt"
