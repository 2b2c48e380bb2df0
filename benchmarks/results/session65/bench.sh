#!/usr/bin/env bash
# Session 65: import + first call of the ops session 64 made lean (@triton.heuristics, launch flags, kernel files
# imported by their project names), lean against cold handles (FORGE_NO_LEAN=1) and the full path (FORGE_NO_COLD=1).
# Wheels from dist/ (built on the CPU machine). REPEATS rounds, contenders rotated within each round.
set -u
OUT=${OUT:-bench}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
R=${REPEATS:-3}
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
timeout 200 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats "$R" \
  --ops even_scale,sh_to_color,cross_entropy_loss,fused_recurrent_gla,layer_norm \
  lean=dist/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold full=dist/forge_leanlib-*.whl:full \
  --json "$OUT/lean_library.json" > "$OUT/bench_lean_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_lean_library.txt"
timeout 150 python3 benchmarks/bench_cold_library.py --package forge_fla --repeats "$R" \
  lean=dist/forge_fla-*.whl cold=dist/forge_fla-*.whl:cold full=dist/forge_fla-*.whl:full \
  --json "$OUT/fla.json" > "$OUT/bench_fla.txt" 2>&1
grep -v "loaded:" "$OUT/bench_fla.txt"
timeout 150 python3 benchmarks/bench_cold_library.py --repeats "$R" --ops sh_to_color,cross_entropy_loss,chunk_local_cumsum,add \
  lean=dist/forge_coldlib-*.whl cold=dist/forge_coldlib-*.whl:cold full=dist/forge_coldlib-*.whl:full \
  --json "$OUT/routed_library.json" > "$OUT/bench_routed_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_routed_library.txt"
