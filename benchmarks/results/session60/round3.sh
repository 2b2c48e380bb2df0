#!/usr/bin/env bash
# Session 60, r3: measurements on session 59's final code. (1) The lean path's import + first vector_add with and
# without the runtime's bytecode bundle, interleaved in one run (scripts/probe_import_stages.py DIR DIR:no-bundle);
# (2) the library-style ops' import + first call (benchmarks/bench_cold_library.py: cold handles against the full
# binding), last measured in session 54, before the lean path and the bundle's later formats; (3) session 57's lean
# probe with an empty package's import in front (scripts/probe_lean_first_call.py): what the bare minimum of Python
# costs, package entry included, beside the wheel in the same run; (4) benchmarks/bench_launch.py (host time per
# call: kernel[grid], the op, torch eager, Triton's JIT, the C floor), last run in session 57.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" >> "$OUT/device.txt"
rm -rf /tmp/k && python3 -m pip install -q --no-deps --no-index --target /tmp/k dist/forge_kernels-*.whl
(cd scripts && python3 probe_import_stages.py /tmp/k /tmp/k:no-bundle --runs 9 --json "$OUT/stages.json") \
  > "$OUT/stages.txt" 2>&1
head -3 "$OUT/stages.txt"; grep -A1 "^/tmp" "$OUT/stages.txt"
python3 scripts/probe_lean_first_call.py dist/forge_kernels-*.whl --runs 9 --json "$OUT/lean_probe.json" \
  > "$OUT/lean_probe.txt" 2>&1
tail -6 "$OUT/lean_probe.txt"
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_launch-*.whl 2>&1 | tail -2
python3 benchmarks/bench_launch.py --rounds 3 --json "$OUT/launch.json" > "$OUT/bench_launch.txt" 2>&1
head -40 "$OUT/bench_launch.txt"
timeout 170 python3 benchmarks/bench_cold_library.py cold=dist/forge_coldlib-*.whl full=dist/forge_coldlib-*.whl:full --repeats 2 \
  --json "$OUT/cold_library.json" > "$OUT/cold_library.txt" 2>&1
tail -30 "$OUT/cold_library.txt"
