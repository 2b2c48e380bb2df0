#!/usr/bin/env bash
# Session 65, r4: the code after the split (host_values: module-level tl.constexpr / tl.<dtype> without host_triton;
# selection: Config and the binary choice shared by every binding; basics.fast_kernel). GPU tests of the lean, cold
# and FLA paths, then import + first call of the heuristic / module-level-constexpr ops, lean / cold / full, and FLA's
# ops with torch._dynamo imported before the clock (FLA's own torch.compiler.disable imports it: r3 showed 4 s).
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
R=${REPEATS:-3}
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 \
  TESTS="tests/test_lean_library.py tests/test_lean.py tests/test_fla_simple_gla.py tests/test_cold_library.py" \
  PYTEST_ARGS="-n 8 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/tests.txt" 2>&1
tail -8 "$OUT/tests.txt"
timeout 130 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats "$R" \
  --ops "${LEAN_OPS:-sh_to_color,even_scale,fused_recurrent_gla,layer_norm}" \
  lean=dist/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold full=dist/forge_leanlib-*.whl:full \
  --json "$OUT/lean_library.json" > "$OUT/bench_lean_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_lean_library.txt"; grep "sh_to_color\|lean loaded" "$OUT/bench_lean_library.txt" | head -3
timeout 100 python3 benchmarks/bench_cold_library.py --package forge_fla --repeats "$R" --preimport torch._dynamo \
  lean=dist/forge_fla-*.whl cold=dist/forge_fla-*.whl:cold full=dist/forge_fla-*.whl:full \
  --json "$OUT/fla.json" > "$OUT/bench_fla.txt" 2>&1
grep -v "loaded:" "$OUT/bench_fla.txt"
timeout 90 python3 benchmarks/bench_cold_library.py --repeats "$R" --ops "${ROUTED_OPS:-sh_to_color,chunk_local_cumsum}" \
  lean=dist/forge_coldlib-*.whl cold=dist/forge_coldlib-*.whl:cold full=dist/forge_coldlib-*.whl:full \
  --json "$OUT/routed_library.json" > "$OUT/bench_routed_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_routed_library.txt"
