#!/usr/bin/env bash
# Session 62, r1: lean first calls for library-style kernels (call-site constexprs and launch options; launch options
# at their defaults read as not passed, by the C path too). (1) Install the wheels built on the CPU machine (dist/),
# (2) the GPU tests of the lean, cold and C paths and the library-style fixture's (forge_leanlib), (3) import + first
# call of forge_leanlib's ops in fresh processes: this session's wheel (lean), the same ops built with session 61's
# runtime (.device/dist_old: their modules had no lean plan, so a first call handed the package over to the full
# runtime and its cold handles), and this wheel with FORGE_NO_LEAN=1 (cold handles after the full runtime's import).
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/round"
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -3 "$OUT/install.txt"
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 TESTS="tests/test_lean_library.py tests/test_lean.py \
tests/test_cold_kernel.py tests/test_c_launch_gpu.py tests/test_cold_process_gpu.py tests/test_cold_library.py \
tests/test_callsite.py tests/test_runtime_bundle.py tests/test_lazy_import.py tests/test_first_call_fake_driver.py \
tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py tests/test_preload_integrity_gpu.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
timeout 300 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats 4 \
  lean=dist/forge_leanlib-*.whl old=.device/dist_old/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold \
  --json "$OUT/cold_library.json" > "$OUT/bench_cold_library.txt" 2>&1
cat "$OUT/bench_cold_library.txt"
