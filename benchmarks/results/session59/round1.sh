#!/usr/bin/env bash
# Session 59, r1: the runtime's __init__ cut to the bundle's reading (names.py, bundling.py hold the rest; the
# bundle's non-LEAN modules checked when the first of them loads). The cold-start table of the small op with the
# previous commit's wheel (dist/base/, 738dac5) as --baseline, interleaved; the lean probe; -X importtime; then
# the GPU tests of session 58's rounds.
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_kernels-*.whl 2>&1 | tail -2
rm -rf /tmp/base && python3 -m pip install -q --no-index --no-deps --target /tmp/base dist/base/forge_kernels-*.whl
timeout 300 python3 benchmarks/bench_cold_start.py --op-only --repeats 11 --baseline /tmp/base \
  --json "$OUT/cold_start.json" > "$OUT/bench_cold_start.txt" 2>&1
tail -25 "$OUT/bench_cold_start.txt"
for i in 1 2 3 4 5; do
  (cd /tmp && python3 -X importtime -c "import torch; torch.zeros(1, device='cuda'); import forge_kernels" 2>&1 \
    | grep -E "forge_kernels" | tr -s ' ')
done > "$OUT/importtime.txt"
cat "$OUT/importtime.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 TESTS="tests/test_lean.py tests/test_cold_kernel.py \
tests/test_c_launch_gpu.py tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py \
tests/test_preload_integrity_gpu.py tests/test_cold_process_gpu.py tests/test_torch_ops.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
