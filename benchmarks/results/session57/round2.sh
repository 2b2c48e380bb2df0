#!/usr/bin/env bash
# Session 57, r2: the [m-z] half of the whole GPU suite and FLA's GPU tests on session 56's final code (forge_fla
# built here; forge_realworld from r1 where the machine stayed warm, else built again).
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
RW=1; if ls dist/forge_realworld-*.whl >/dev/null 2>&1; then RW=0; fi
OUT="$OUT/round" STEPS="" BUILD_FLA=1 BUILD_REALWORLD=$RW bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=330 TESTS="$(ls tests/test_[m-z]*.py) tests/test_fla_simple_gla.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -12 "$OUT/round.txt"
