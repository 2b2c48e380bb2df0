#!/usr/bin/env bash
# Session 56, r2 (warm machine after r1): the cold start's stages (scripts/probe_cold_stages.py, vector_add), session
# 55's final wheel (.hunt/base55) and this session's (dist/), alternated twice, 9 fresh processes each.
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for round in 1 2; do
  for w in .hunt/base55 dist; do
    echo "== $w (round $round)" | tee -a "$OUT/stages.txt"
    timeout 100 python3 scripts/probe_cold_stages.py $w/forge_kernels-*.whl --runs 9 >> "$OUT/stages.txt" 2>&1
  done
done
grep -E "^==|^import|first call|read bundle|exec fastpath|unmarshal rules|sum" "$OUT/stages.txt"
