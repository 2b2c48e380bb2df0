#!/usr/bin/env bash
# Session 53, r1: the [a-l] half of the GPU suite on this session's wheels (cold handles for library-style kernels:
# call-site values, keywords, routed packages, project modules), forge_realworld built here.
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" BUILD_REALWORLD=1 TESTS_TIMEOUT=420 TESTS="$(ls tests/test_[a-l]*.py)" \
  PYTEST_ARGS="-n 24 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
