#!/usr/bin/env bash
# Session 57, r1: the [a-l] half of the whole GPU suite on session 56's final code (the suite had not run whole since
# session 54; sessions 55 and 56 changed both launchers' argument account, the bundle and the extension's loading),
# forge_realworld built here.
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=420 TESTS="$(ls tests/test_[a-l]*.py)" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
