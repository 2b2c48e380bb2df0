#!/usr/bin/env bash
# Session 51, r2: the second half of the GPU suite on the session's wheels (the C driver, ABI 13), then the cold start
# of vector_add against session 50's wheel (.hunt/base51, installed with pip --target: the baseline, interleaved)
# and bench_launch. Run from the repository root on the device with OUT set.
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" BUILD_REALWORLD=1 TESTS_TIMEOUT=300 TESTS="$(ls tests/test_[m-z]*.py)" \
  PYTEST_ARGS="-n 24 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -3 "$OUT/round.txt"
export PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --target /tmp/base51 .hunt/base51/forge_kernels-*.whl
timeout 150 python3 benchmarks/bench_cold_start.py --op-only --repeats 9 --baseline /tmp/base51 \
  --json "$OUT/cold_start.json" > "$OUT/cold_start.txt" 2>&1
tail -12 "$OUT/cold_start.txt"
timeout 100 python3 benchmarks/bench_launch.py --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
tail -14 "$OUT/bench_launch.txt"
