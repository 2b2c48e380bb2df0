#!/usr/bin/env bash
# Session 52, r3: the cold start of vector_add (cold handles) against session 51's wheel (.hunt/base52, interleaved),
# then the [m-z] half of the GPU suite on this session's wheels, forge_realworld built here.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/base52 .hunt/base52/forge_kernels-*.whl
PYTHONPATH=$PWD timeout 150 python3 benchmarks/results/session52/cold_ab.py --baseline /tmp/base52 --repeats 12 \
  --json "$OUT/cold_ab.json" > "$OUT/cold_ab.txt" 2>&1
tail -4 "$OUT/cold_ab.txt"
OUT="$OUT/round" STEPS="tests" BUILD_REALWORLD=1 TESTS_TIMEOUT=260 TESTS="$(ls tests/test_[m-z]*.py)" \
  PYTEST_ARGS="-n 24 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -12 "$OUT/round.txt"
