#!/usr/bin/env bash
# Session 64, r3: import + first call of ops without a lean plan in a package with _LEAN (their first call hands
# over at once) against cold handles and the full path: forge_coldlib's routed ops and forge_leanlib's softmax,
# which r2 showed at 14.7 (lean package) against 9.8 ms (cold handles) in 3 rounds. Wheels from dist/ only.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
timeout 110 python3 benchmarks/bench_cold_library.py --package forge_leanlib --repeats 7 --ops softmax,layer_norm \
  lean=dist/forge_leanlib-*.whl cold=dist/forge_leanlib-*.whl:cold \
  --json "$OUT/lean_library.json" > "$OUT/bench_lean_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_lean_library.txt"
timeout 120 python3 benchmarks/bench_cold_library.py --repeats 3 --ops rms_norm,add,sh_to_color \
  lean=dist/forge_coldlib-*.whl cold=dist/forge_coldlib-*.whl:cold full=dist/forge_coldlib-*.whl:full \
  --json "$OUT/routed_library.json" > "$OUT/bench_routed_library.txt" 2>&1
grep -v "loaded:" "$OUT/bench_routed_library.txt"
