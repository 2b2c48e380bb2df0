#!/usr/bin/env bash
# Session 53, r3 (the machine of r2, still warm: forge_realworld built and installed there): library-style ops'
# import + first call, cold handles against the full binding; then bench_launch.py (the launchers now pass NULL
# after the last parameter).
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c "import forge_realworld, forge_kernels; print(forge_realworld.__file__)" || exit 1
timeout 240 python3 benchmarks/results/session53/cold_lib.py --repeats 7 --json "$OUT/cold_lib.json" \
  > "$OUT/cold_lib.txt" 2>&1
cat "$OUT/cold_lib.txt"
PYTHONPATH=$PWD timeout 200 python3 benchmarks/bench_launch.py --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
tail -25 "$OUT/bench_launch.txt"
