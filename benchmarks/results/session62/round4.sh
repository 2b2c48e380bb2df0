#!/usr/bin/env bash
# Session 62, r4 (run as one device command): vector_add's import + first call, bench_cold_start.py and the lean probe
# beside the compact package and the bare probe, on this session's forge_kernels wheel (dist/, built on the CPU).
set -u
OUT=${OUT:-r4}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_kernels-*.whl dist/forge_launch-*.whl 2>&1 | tail -2
(cd /tmp && python3 -c "import forge_kernels._runtime as r; print(r.write_bundle())")
timeout 200 python3 benchmarks/bench_cold_start.py --op-only --repeats 7 --json "$OUT/cold_start.json" \
  > "$OUT/bench_cold_start.txt" 2>&1
tail -25 "$OUT/bench_cold_start.txt"
timeout 90 python3 scripts/probe_lean_first_call.py dist/forge_kernels-*.whl --runs 9 --json "$OUT/lean_probe.json" \
  > "$OUT/lean_probe.txt" 2>&1
tail -8 "$OUT/lean_probe.txt"
