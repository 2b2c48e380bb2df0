#!/usr/bin/env bash
# Session 59, r4: after the second review mend (7b39f40: one helper runs bundled modules; the bundle rewritten where
# its file check finds a change; test_lean as before), the GPU tests of lean, cold and full handles and of forge_kernels' ops again (r1's set).
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 TESTS="tests/test_lean.py tests/test_cold_kernel.py \
tests/test_c_launch_gpu.py tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py \
tests/test_preload_integrity_gpu.py tests/test_cold_process_gpu.py tests/test_torch_ops.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -10 "$OUT/round.txt"
