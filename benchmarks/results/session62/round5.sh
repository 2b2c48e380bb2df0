#!/usr/bin/env bash
# Session 62, r5: the last commit's code (the call binding shared by lean and cold handles, lean_launch.bind_call):
# the GPU tests of the lean, cold and call-site paths through forge_kernels, forge_coldlib and forge_leanlib built on
# the CPU machine from it.
set -u
OUT=${OUT:-r5}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=150 TESTS="tests/test_lean_library.py tests/test_lean.py \
tests/test_cold_kernel.py tests/test_cold_library.py tests/test_cold_process_gpu.py tests/test_callsite.py \
tests/test_c_launch_gpu.py tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
