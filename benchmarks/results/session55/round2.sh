#!/usr/bin/env bash
# Session 55, r2: GPU tests of what changed (cold handles with launch attributes, call heuristics and heuristic
# launch options; kernel files inside packages named in their package), forge_realworld built here.
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" BUILD_REALWORLD=1 TESTS_TIMEOUT=400 \
  TESTS="tests/test_cold_library.py tests/test_cold_kernel.py tests/test_localmods.py tests/test_c_launch_gpu.py \
tests/test_cross_entropy.py tests/test_pdl_add.py tests/test_unsloth_rope.py tests/test_grid_sum.py \
tests/test_sh_to_color.py tests/test_rotary.py tests/test_flash_rotary.py tests/test_unsloth_rms_layernorm.py \
tests/test_liger_cross_entropy.py tests/test_preload_integrity_gpu.py tests/test_rebound_heuristics.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -15 "$OUT/round.txt"
