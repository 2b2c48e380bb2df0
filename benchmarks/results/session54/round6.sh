#!/usr/bin/env bash
# Session 54, r6: the read-through's mend (260afa1: binary choice and heuristics written once in rules): the GPU tests
# of cold handles, heuristics, tensor descriptors + pre-hooks (tables.choose_binary's descriptor filter), preload;
# forge_realworld built here.
set -u
OUT=${OUT:-r6}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" BUILD_REALWORLD=1 TESTS_TIMEOUT=300 PYTEST_ARGS="-n 16 --dist loadfile -rfEs" \
  TESTS="tests/test_cold_library.py tests/test_cold_kernel.py tests/test_rebound_heuristics.py tests/test_settled_heuristics.py tests/test_c_launch_gpu.py tests/test_heuristic_num_ctas.py tests/test_preload_integrity_gpu.py tests/test_matmul_tma_host.py tests/test_attention_tutorial.py tests/test_rotary.py tests/test_realworld.py" \
  bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -10 "$OUT/round.txt"
