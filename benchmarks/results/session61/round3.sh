#!/usr/bin/env bash
# Session 61, r3: the [m-z] half of the whole GPU suite on this session's code (the runtime package's __init__ without
# the bundle's reading), forge_realworld built here, forge_kernels, forge_fla, forge_launch and forge_coldlib on the
# CPU machine (dist/).
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 TESTS="$(ls tests/test_[m-z]*.py)" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
