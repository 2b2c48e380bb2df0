#!/usr/bin/env bash
# Session 51, r3 (one H200): the final wheels' GPU tests of the [a-l] files that need no forge_realworld (r1 ran all
# of [a-l] on the C driver before the cuda split and the host-triton change), then the cold start of vector_add
# against session 50's wheel (.hunt/base51, the baseline, interleaved; r2's run of it hit its 150 s limit).
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
STEPS="" OUT="$OUT/round" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
export PYTHONPATH=$PWD
timeout 220 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 --dist loadfile -rfEs tests/test_cold_process_gpu.py \
  tests/test_computed_defaults.py tests/test_cuda_only_ops.py tests/test_declared_custom_ops.py \
  tests/test_examples_elsewhere.py tests/test_helper_decorators.py tests/test_heuristic_num_ctas.py \
  tests/test_library_patterns.py tests/test_localmods.py > "$OUT/pytest_al.txt" 2>&1
tail -3 "$OUT/pytest_al.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/base51 .hunt/base51/forge_kernels-*.whl
timeout 300 python3 benchmarks/bench_cold_start.py --op-only --repeats 7 --baseline /tmp/base51 \
  --json "$OUT/cold_start.json" > "$OUT/cold_start.txt" 2>&1
tail -16 "$OUT/cold_start.txt"
