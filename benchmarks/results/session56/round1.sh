#!/usr/bin/env bash
# Session 56, r1: GPU tests of the cold handles (flash-attn's rotary: integers to pointer parameters), the C launch
# path (extension loaded from its file), the runtime bundle (mapped, without columns); then vector_add's import +
# first call against session 55's final wheel (.hunt/base55, session 52's cold_ab.py), interleaved.
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 PYTEST_ARGS="-n 16 --dist loadfile -rfEs" \
  TESTS="tests/test_cold_library.py tests/test_cold_kernel.py tests/test_c_launch_gpu.py tests/test_localmods.py \
tests/test_fused_softmax.py tests/test_preload_integrity_gpu.py" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -6 "$OUT/round.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/base55 .hunt/base55/forge_kernels-*.whl
PYTHONPATH=$PWD timeout 200 python3 benchmarks/results/session52/cold_ab.py --baseline /tmp/base55 --repeats 15 \
  --json "$OUT/cold_ab.json" > "$OUT/cold_ab.txt" 2>&1
tail -4 "$OUT/cold_ab.txt"
