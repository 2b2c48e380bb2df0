#!/usr/bin/env bash
# Session 53, r2: library-style ops' import + first call, cold handles against the full binding (cold_lib.py), and
# vector_add's against session 51's wheel (session 52's cold_ab.py); then the [m-z] half of the GPU suite,
# forge_realworld built here.
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
timeout 200 python3 benchmarks/results/session53/cold_lib.py --repeats 7 --json "$OUT/cold_lib.json" \
  > "$OUT/cold_lib.txt" 2>&1
cat "$OUT/cold_lib.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/base52 .hunt/base52/forge_kernels-*.whl
PYTHONPATH=$PWD timeout 80 python3 benchmarks/results/session52/cold_ab.py --baseline /tmp/base52 --repeats 6 \
  --json "$OUT/cold_ab.json" > "$OUT/cold_ab.txt" 2>&1
tail -4 "$OUT/cold_ab.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 TESTS="$(ls tests/test_[m-z]*.py)" \
  PYTEST_ARGS="-n 24 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -12 "$OUT/round.txt"
