#!/usr/bin/env bash
# Session 57, r5: after the review's mend (fastpath.reading, cold_launch.block_of: the first call's FastKernel and
# Launcher arguments built through them), the GPU tests of cold handles, the C path and forge_kernels' ops.
set -u
OUT=${OUT:-r5}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 TESTS="tests/test_cold_kernel.py tests/test_c_launch_gpu.py \
tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py tests/test_preload_integrity_gpu.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -6 "$OUT/round.txt"
