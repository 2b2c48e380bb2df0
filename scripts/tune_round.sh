#!/usr/bin/env bash
# One tuning round on a GPU machine: tune the repository's manifest and the library-style fixtures into their
# committed databases, run the tuner's GPU tests, benchmark the tuner. What comes back in ${OUT}: logs, the
# databases, each run's run.json and report (never binaries).
#   STEPS="repo realworld tests bench-tuning" (default: repo realworld tests)
set -uo pipefail
OUT=${OUT:-tune-round}; mkdir -p "$OUT"
STEPS=${STEPS:-"repo realworld tests"}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
J=$(nproc)
for step in $STEPS; do
  case $step in
    repo) timeout "${TUNE_TIMEOUT:-420}" python3 -m forge_aot.cli tune -j "$J" 2>&1 | tee "$OUT/tune_repo.txt" | tail -4 ;;
    realworld) timeout "${TUNE_TIMEOUT:-420}" python3 -m forge_aot.cli tune -j "$J" \
        --manifest tests/fixtures/realworld/kernel_manifest.toml 2>&1 | tee "$OUT/tune_realworld.txt" | tail -4 ;;
    tests) timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_tune_gpu.py \
        2>&1 | tee "$OUT/pytest_tune_gpu.txt" | tail -15 ;;
    bench-tuning) timeout "${BENCH_TIMEOUT:-560}" python3 benchmarks/bench_tuning.py -j "$J" \
        --json "$OUT/bench_tuning.json" 2>&1 | tee "$OUT/bench_tuning.txt" ;;
  esac
done
keep=(tuning tests/fixtures/realworld/tuning)
for d in build/forge-aot/tune tests/fixtures/realworld/build/forge-aot/tune; do
  [ -f "$d/run.json" ] && keep+=("$d/run.json" "$d/report")
done
tar czf "$OUT/tuning.tgz" "${keep[@]}"
ls -la "$OUT"
