#!/usr/bin/env bash
# Session 53, r5: wheels with _forge/modules.json (project modules' imports no longer parse the whole index),
# forge_realworld built here; library-style ops' import + first call, cold handles against the full binding; the GPU
# tests of the files that bind project modules, cold handles and Liger-style kernels.
set -u
OUT=${OUT:-r5}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -3 "$OUT/install.txt"
timeout 200 python3 benchmarks/results/session53/cold_lib.py --repeats 7 --json "$OUT/cold_lib.json" \
  > "$OUT/cold_lib.txt" 2>&1
cat "$OUT/cold_lib.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 PYTEST_ARGS="-n 16 --dist loadfile -rfEs" \
  TESTS="tests/test_cold_library.py tests/test_cold_kernel.py tests/test_localmods.py tests/test_local_imports.py tests/test_liger_cross_entropy.py tests/test_liger_fused_add_rms_norm.py tests/test_realworld.py tests/test_lazy_import.py tests/test_preload_integrity_gpu.py" \
  bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
