#!/usr/bin/env bash
# Session 63: the whole single-GPU suite in two halves on this session's code (lean first calls for host modules
# importing project modules and for packages routing ops by name), the other wheels built on the CPU machine (dist/).
# forge_realworld is built on the device once and kept in .device/rw (ignored, not carried: a warm machine keeps it
# for the next call; a fresh one builds it again).
#   OUT=$OUT/r1 HALF='[a-l]' TIMEOUT=380 LAUNCH=1 bash benchmarks/results/session63/round1.sh
#   OUT=$OUT/r2 HALF='[m-z]' TIMEOUT=300 LEAN=1 bash benchmarks/results/session63/round1.sh
set -u
OUT=${OUT:-suite}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p .device/rw
if ls .device/rw/forge_realworld-*.whl >/dev/null 2>&1; then
  cp .device/rw/forge_realworld-*.whl dist/ && echo "forge_realworld: kept from the previous call"
  BUILD=0
else
  BUILD=1
fi
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=$BUILD bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
cp dist/forge_realworld-*.whl .device/rw/ 2>/dev/null
tail -4 "$OUT/install.txt"
# shellcheck disable=SC2086  # (HALF is a glob)
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT="${TIMEOUT:-380}" TESTS="$(ls tests/test_${HALF:-[a-z]}*.py) ${EXTRA:-}" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
if [ "${LAUNCH:-0}" = 1 ]; then
  timeout 100 python3 benchmarks/bench_launch.py --rounds 2 --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
  tail -30 "$OUT/bench_launch.txt"
fi
if [ "${LEAN:-0}" = 1 ]; then
  # import + first call: lean (this session) against cold handles (FORGE_NO_LEAN=1), the library-style ops
  timeout 200 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats 3 \
    lean=dist/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold \
    --json "$OUT/lean_library.json" > "$OUT/bench_lean_library.txt" 2>&1
  cat "$OUT/bench_lean_library.txt"
fi
if [ "${ROUTED:-0}" = 1 ]; then
  # the routed package (forge_coldlib): lean where a module has a lean plan, against cold handles and the full path
  timeout 200 python3 benchmarks/bench_cold_library.py --repeats 3 \
    lean=dist/forge_coldlib-*.whl cold=dist/forge_coldlib-*.whl:cold full=dist/forge_coldlib-*.whl:full \
    --json "$OUT/routed_library.json" > "$OUT/bench_routed_library.txt" 2>&1
  cat "$OUT/bench_routed_library.txt"
fi
