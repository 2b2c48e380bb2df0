#!/usr/bin/env bash
# Session 54, r1: the [a-l] half of the GPU suite on this session's wheels (cold handles with @triton.heuristics; host
# files run through host_exec; project modules with the small triton), forge_realworld built here (its wheel comes
# back for r2).
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
mkdir -p "$OUT/wheels" && cp dist/forge_realworld-*.whl "$OUT/wheels/"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=400 TESTS="$(ls tests/test_[a-l]*.py)" \
  PYTEST_ARGS="-n 24 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
