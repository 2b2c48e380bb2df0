#!/usr/bin/env bash
# Session 61, r2 and r3: the whole single-GPU suite in two halves on this session's code (the runtime package's
# __init__ without the bundle's reading), forge_realworld built here, forge_kernels, forge_fla, forge_launch and
# forge_coldlib on the CPU machine (dist/):
#   OUT=$OUT/r2 HALF='[a-l]' TIMEOUT=440 bash benchmarks/results/session61/round_suite.sh
#   OUT=$OUT/r3 HALF='[m-z]' TIMEOUT=300 bash benchmarks/results/session61/round_suite.sh
set -u
OUT=${OUT:-suite}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
# shellcheck disable=SC2086  # (HALF is a glob)
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT="${TIMEOUT:-440}" TESTS="$(ls tests/test_${HALF:-[a-z]}*.py)" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
