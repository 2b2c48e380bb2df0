#!/usr/bin/env bash
# Session 52, r1: the cold start of vector_add (cold handles) against session 51's wheel (.hunt/base52, pip --target,
# interleaved), bench_launch (the hot path, unchanged), then the GPU tests of the runtime's own files (cold handles,
# the cold process, preload and integrity, the C launch path). Run from the repository root on the device with OUT set.
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
export PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --target /tmp/base52 .hunt/base52/forge_kernels-*.whl
timeout 200 python3 benchmarks/results/session52/cold_ab.py --baseline /tmp/base52 --repeats 25 \
  --json "$OUT/cold_ab.json" > "$OUT/cold_ab.txt" 2>&1
cat "$OUT/cold_ab.txt" | tail -5
timeout 100 python3 benchmarks/bench_launch.py --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
tail -14 "$OUT/bench_launch.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 TESTS="tests/test_cold_kernel.py tests/test_cold_process_gpu.py \
  tests/test_preload_integrity_gpu.py tests/test_c_launch_gpu.py" \
  PYTEST_ARGS="-n 8 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -4 "$OUT/round.txt"
