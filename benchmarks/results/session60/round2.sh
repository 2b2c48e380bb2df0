#!/usr/bin/env bash
# Session 60, r2: the [m-z] half of the whole GPU suite on session 59's final code (7b39f40: the bundle's review mend,
# never GPU-run; the suite had not run whole since session 57), forge_realworld built here, forge_fla and
# forge_kernels on the CPU machine (dist/).
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=400 TESTS="$(ls tests/test_[m-z]*.py)" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
