#!/usr/bin/env bash
# Session 63, r3: the final code (the build names the host modules with a lean plan in the package's __init__,
# _LEAN: another module's first call hands over at once; a package with none runs the full runtime from import):
# the GPU tests of the lean, cold, call-site and C paths, forge_leanlib's and forge_coldlib's (no forge_realworld:
# r1/r2 ran the whole suite on the code before), then import + first call of the routed package's ops (lean / cold
# handles / full binding) and forge_leanlib's (lean / cold), interleaved fresh processes.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=160 TESTS="tests/test_lean_library.py tests/test_lean.py \
tests/test_cold_kernel.py tests/test_cold_library.py tests/test_cold_process_gpu.py tests/test_callsite.py \
tests/test_c_launch_gpu.py tests/test_lazy_import.py tests/test_fla_simple_gla.py tests/test_vector_add.py \
tests/test_softmax.py tests/test_matmul.py tests/test_torch_ops.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
timeout 120 python3 benchmarks/bench_cold_library.py --repeats 3 --ops rms_norm,add,sh_to_color \
  lean=dist/forge_coldlib-*.whl cold=dist/forge_coldlib-*.whl:cold full=dist/forge_coldlib-*.whl:full \
  --json "$OUT/routed_library.json" > "$OUT/bench_routed_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_routed_library.txt"
[ "${LEAN:-0}" = 1 ] && timeout 170 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats 3 \
  --ops layer_norm,row_absmax,liger_fused_add_rms_norm,geglu,mean_dim,quantize_rowwise,softmax \
  lean=dist/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold \
  --json "$OUT/lean_library.json" > "$OUT/bench_lean_library.txt" 2>&1
[ "${LEAN:-0}" = 1 ] && grep -v "loaded:" "$OUT/bench_lean_library.txt"
