#!/usr/bin/env bash
# Session 54, r4: the final code's GPU tests of cold handles, heuristics and project modules (wheels rebuilt at
# 3345f29; test_cold_library builds forge_coldlib here).
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 PYTEST_ARGS="-n 16 --dist loadfile -rfEs" \
  TESTS="tests/test_cold_library.py tests/test_cold_kernel.py tests/test_rebound_heuristics.py tests/test_settled_heuristics.py tests/test_local_imports.py tests/test_localmods.py tests/test_rotary.py tests/test_preload_integrity_gpu.py" \
  bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -10 "$OUT/round.txt"
