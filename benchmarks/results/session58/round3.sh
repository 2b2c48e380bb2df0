#!/usr/bin/env bash
# Session 58, r3: round2.sh again on the final code (the bundle checks every module at import, as before r2).
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 TESTS="tests/test_lean.py tests/test_cold_kernel.py \
tests/test_c_launch_gpu.py tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py \
tests/test_preload_integrity_gpu.py tests/test_cold_process_gpu.py tests/test_torch_ops.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
timeout 240 python3 scripts/probe_lean_first_call.py dist/forge_kernels-*.whl --runs 15 --json "$OUT/lean.json" \
  > "$OUT/lean.txt" 2>&1
cat "$OUT/lean.txt"
for i in 1 2 3 4 5; do
  (cd /tmp && python3 -X importtime -c "import torch; torch.zeros(1, device='cuda'); import forge_kernels" 2>&1 \
    | grep -E "forge_kernels" | tr -s ' ')
done > "$OUT/importtime.txt"
cat "$OUT/importtime.txt"
