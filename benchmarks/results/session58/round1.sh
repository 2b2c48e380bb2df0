#!/usr/bin/env bash
# Session 58, r1: the lean first calls (runtime/lean.py) on one GPU: the GPU tests of lean, cold and full handles and
# forge_kernels' ops, then import + first call of vector_add: the wheel (lean) against the wheel with the lean path
# off (FORGE_NO_LEAN=1: cold handles, as before) and session 57's probe bound, interleaved fresh processes.
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 TESTS="tests/test_lean.py tests/test_cold_kernel.py \
tests/test_c_launch_gpu.py tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py \
tests/test_preload_integrity_gpu.py tests/test_cold_process_gpu.py tests/test_torch_ops.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
timeout 240 python3 scripts/probe_lean_first_call.py dist/forge_kernels-*.whl --runs 15 --json "$OUT/lean.json" \
  > "$OUT/lean.txt" 2>&1
cat "$OUT/lean.txt"
