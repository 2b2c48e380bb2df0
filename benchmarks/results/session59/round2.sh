#!/usr/bin/env bash
# Session 59, r2 (the final runtime code: _runtime/__init__ cut to the bundle's reading and serving, names.py,
# <package>._ops made without running its empty file): the cold start stage by stage (scripts/probe_import_stages.py:
# this wheel beside the previous commit's, dist/base/, 738dac5, interleaved; with and without their bytecode
# bundles), then the whole single-GPU test suite over this wheel and the library-style fixtures' wheels
# (forge_realworld built here by gpu_round.sh: with it the carried tree would exceed 64 MiB; forge_fla built on the
# CPU machine), the files of the tests that use those two wheels.
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
rm -rf /tmp/new /tmp/base
python3 -m pip install -q --no-index --no-deps --target /tmp/new dist/forge_kernels-*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/base dist/base/forge_kernels-*.whl
(cd scripts && timeout 110 python3 probe_import_stages.py /tmp/base /tmp/new --runs 15 --json "$OUT/stages.json" \
  > "$OUT/stages.txt" 2>&1)
cat "$OUT/stages.txt"
BUILD_REALWORLD=1 OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=330 TESTS="tests/test_add_norm.py tests/test_attention_tutorial.py tests/test_block_fp8_matmul.py tests/test_c_launch_gpu.py tests/test_callsite.py tests/test_chunk_bmm_bwd.py tests/test_chunk_cumsum.py tests/test_chunk_local_cumsum.py tests/test_deepspeed_triton_ops.py tests/test_fla_simple_gla.py tests/test_flash_rotary.py tests/test_fp8_quant.py tests/test_fused_moe.py tests/test_fused_softmax.py tests/test_giou.py tests/test_guarded_gather.py tests/test_l2norm.py tests/test_liger_cross_entropy.py tests/test_liger_fused_add_rms_norm.py tests/test_liger_rope.py tests/test_linear_scan.py tests/test_matmul_persistent.py tests/test_matmul_tma_host.py tests/test_multi_gpu.py tests/test_realworld.py tests/test_rotary.py tests/test_silu_and_mul.py tests/test_torch_ops.py tests/test_unsloth_rms_layernorm.py tests/test_unsloth_rope.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -q -rfE" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -12 "$OUT/round.txt"
