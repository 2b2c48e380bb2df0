#!/usr/bin/env bash
# Session 63, r3: the final code (the build names the host modules with a lean plan in the package's __init__,
# _LEAN: another module's first call hands over at once; a package with none runs the full runtime from import):
# the GPU tests of the lean path, forge_leanlib's, forge_coldlib's, forge_fla's (no lean plan) and the custom ops'
# (no forge_realworld: r1/r2 ran the whole suite on the code before), then import + first call of the routed
# package's ops (lean / cold handles / full binding), with LEAN=1 forge_leanlib's (lean / cold), interleaved.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=110 TESTS="tests/test_lean_library.py \
tests/test_cold_library.py tests/test_fla_simple_gla.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -8 "$OUT/round.txt"
timeout 50 python3 benchmarks/bench_cold_library.py --repeats 2 --ops rms_norm,add,sh_to_color \
  lean=dist/forge_coldlib-*.whl cold=dist/forge_coldlib-*.whl:cold full=dist/forge_coldlib-*.whl:full \
  --json "$OUT/routed_library.json" > "$OUT/bench_routed_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_routed_library.txt"
[ "${LEAN:-0}" = 1 ] && timeout 170 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats 3 \
  --ops layer_norm,row_absmax,liger_fused_add_rms_norm,geglu,mean_dim,quantize_rowwise,softmax \
  lean=dist/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold \
  --json "$OUT/lean_library.json" > "$OUT/bench_lean_library.txt" 2>&1
[ "${LEAN:-0}" = 1 ] && grep -v "loaded:" "$OUT/bench_lean_library.txt"
