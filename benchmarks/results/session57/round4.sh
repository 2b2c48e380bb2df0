#!/usr/bin/env bash
# Session 57, r4 (r3 again, a second sample on another machine or hour): the lean first-call probe on one H200 (scripts/probe_lean_first_call.py): import + first call of
# vector_add with the resolution in Python but no runtime module, against the wheel as it is, interleaved.
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
timeout 280 python3 scripts/probe_lean_first_call.py dist/forge_kernels-*.whl --runs 15 --json "$OUT/lean.json" \
  > "$OUT/lean.txt" 2>&1
cat "$OUT/lean.txt"
