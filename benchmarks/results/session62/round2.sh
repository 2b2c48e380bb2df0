#!/usr/bin/env bash
# Session 62, r2 and r3: the whole single-GPU suite in two halves on this session's code (forge_realworld built on the
# device; the other wheels on the CPU machine, dist/); with LAUNCH=1 host time per call (bench_launch.py), with
# LEAN=1 round1.sh's import + first call of forge_leanlib's ops (lean, old, cold) again (r1's "old" had installed
# this session's wheel: the benchmark installed both wheels, of one file name, in one directory; fixed).
#   OUT=$OUT/r2 HALF='[a-l]' TIMEOUT=400 LAUNCH=1 bash benchmarks/results/session62/round2.sh
#   OUT=$OUT/r3 HALF='[m-z]' TIMEOUT=300 LEAN=1 bash benchmarks/results/session62/round2.sh
set -u
OUT=${OUT:-suite}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
# shellcheck disable=SC2086  # (HALF is a glob)
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT="${TIMEOUT:-440}" TESTS="$(ls tests/test_${HALF:-[a-z]}*.py)" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
if [ "${LAUNCH:-0}" = 1 ]; then
  timeout 120 python3 benchmarks/bench_launch.py --rounds 2 --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
  tail -30 "$OUT/bench_launch.txt"
fi
if [ "${LEAN:-0}" = 1 ]; then
  timeout 280 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats 4 \
    lean=dist/forge_leanlib-*.whl old=.device/dist_old/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold \
    --json "$OUT/cold_library.json" > "$OUT/bench_cold_library.txt" 2>&1
  cat "$OUT/bench_cold_library.txt"
fi
