#!/usr/bin/env bash
# Session 55, r3: library-style ops' import + first call, cold handles against the full binding
# (benchmarks/bench_cold_library.py), then vector_add's against session 53's wheel (.hunt/base53, session 52's
# cold_ab.py).
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
OUT="$OUT/round" STEPS="" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
W=$(ls dist/forge_coldlib-*.whl)
timeout 330 python3 benchmarks/bench_cold_library.py cold="$W" full="$W:full" --repeats 7 \
  --json "$OUT/cold_library.json" > "$OUT/cold_library.txt" 2>&1
cat "$OUT/cold_library.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/base53 .hunt/base53/forge_kernels-*.whl
PYTHONPATH=$PWD timeout 150 python3 benchmarks/results/session52/cold_ab.py --baseline /tmp/base53 --repeats 10 \
  --json "$OUT/cold_ab.json" > "$OUT/cold_ab.txt" 2>&1
tail -5 "$OUT/cold_ab.txt"
