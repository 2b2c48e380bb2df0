#!/usr/bin/env bash
# Session 65, r5: lean handles serving config pre-hooks (the autotuned sum of forge_coldlib; the tutorial attention
# hands over on Hopper, its host descriptors being the full path's) and the runtime split (host_values, selection,
# basics.fast_kernel). forge_realworld built here (the tutorial attention's C-path test needs it); the GPU tests of the
# lean, cold, FLA, C-path and attention files; then import + first call of sh_to_color / even_scale lean / cold / full.
set -u
OUT=${OUT:-r5}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
R=${REPEATS:-2}
OUT="$OUT/round" STEPS="" BUILD_REALWORLD=1 bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -3 "$OUT/install.txt"
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=200 \
  TESTS="tests/test_cold_library.py tests/test_lean_library.py tests/test_lean.py tests/test_fla_simple_gla.py tests/test_c_launch_gpu.py tests/test_attention_tutorial.py" \
  PYTEST_ARGS="-n 12 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/tests.txt" 2>&1
tail -8 "$OUT/tests.txt"
timeout 90 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats "$R" --ops sh_to_color,even_scale \
  lean=dist/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold full=dist/forge_leanlib-*.whl:full \
  --json "$OUT/lean_library.json" > "$OUT/bench_lean_library.txt" 2>&1
cat "$OUT/bench_lean_library.txt"
