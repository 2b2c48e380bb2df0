#!/usr/bin/env bash
# Session 52, r4 (two H200s): the GPU tests that need two GPUs, cold handles on the second device included.
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 TESTS="tests/test_cold_kernel.py tests/test_multi_gpu.py \
  tests/test_c_launch_gpu.py" PYTEST_ARGS="-rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
