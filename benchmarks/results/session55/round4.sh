#!/usr/bin/env bash
# Session 55, r4 (the machine of r3, warm): bench_cold_library.py for the ops cold handles newly serve (Unsloth's
# cross entropy, the PDL tutorial's add, the cooperative grid sum, gsplat's sh_to_color), cold against full.
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
W=$(ls dist/forge_coldlib-*.whl)
timeout 280 python3 benchmarks/bench_cold_library.py cold="$W" full="$W:full" --repeats 7 \
  --ops cross_entropy_loss,add,grid_sum,sh_to_color --json "$OUT/cold_library.json" > "$OUT/cold_library.txt" 2>&1
cat "$OUT/cold_library.txt"
