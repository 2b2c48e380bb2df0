#!/usr/bin/env bash
# Session 52, r5 (one H200; b1bdb8b, the final runtime): the runtime's GPU tests (cold handles bit for bit against
# full ones, the cold process, the C path), then the cold start against session 51's wheel once more.
set -u
OUT=${OUT:-r5}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=120 TESTS="tests/test_cold_kernel.py tests/test_cold_process_gpu.py \
  tests/test_c_launch_gpu.py" PYTEST_ARGS="-n 4 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -5 "$OUT/round.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/base52 .hunt/base52/forge_kernels-*.whl 2>/dev/null
PYTHONPATH=$PWD timeout 130 python3 benchmarks/results/session52/cold_ab.py --baseline /tmp/base52 --repeats 10 \
  --json "$OUT/cold_ab.json" > "$OUT/cold_ab.txt" 2>&1
tail -14 "$OUT/cold_ab.txt"
