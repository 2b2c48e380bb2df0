#!/usr/bin/env bash
# Session 56 (second try), r3: the final code's GPU tests, forge_realworld built on the device: cold handles (rotary),
# the C launch path (extension loaded from its file, binary_params shared by both launchers), the runtime bundle
# (mapped, without columns), the library-style kernels that use them.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" BUILD_REALWORLD=1 STEPS="tests" TESTS_TIMEOUT=330 PYTEST_ARGS="-n 16 --dist loadfile -rfEs" \
  TESTS="tests/test_cold_library.py tests/test_cold_kernel.py tests/test_c_launch_gpu.py tests/test_flash_rotary.py \
tests/test_rotary.py tests/test_realworld.py tests/test_matmul_tma_host.py tests/test_attention_tutorial.py \
tests/test_fused_softmax.py tests/test_preload_integrity_gpu.py tests/test_localmods.py" \
  bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
