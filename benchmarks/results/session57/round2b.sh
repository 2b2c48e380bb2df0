#!/usr/bin/env bash
# Session 57, r2b: the [m-z] files r2 skipped because that fresh machine had no forge_kernels wheel (dist/ not
# carried there): forge_kernels' matmul, softmax, vector_add, preload and integrity, torch ops.
set -u
OUT=${OUT:-r2b}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 TESTS="tests/test_matmul.py tests/test_softmax.py \
tests/test_vector_add.py tests/test_preload_integrity_gpu.py tests/test_torch_ops.py tests/test_multi_gpu.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
