#!/usr/bin/env bash
# Session 59, r2 (the final runtime code: _runtime/__init__ cut to the bundle's reading and serving, names.py,
# <package>._ops made without running its empty file): the cold start stage by stage (scripts/probe_import_stages.py:
# this wheel beside the previous commit's, dist/base/, 738dac5, interleaved; with and without their bytecode
# bundles), then the whole single-GPU test suite over this wheel and the library-style fixtures' wheels
# (forge_realworld, forge_fla, built on the CPU machine with this runtime).
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
rm -rf /tmp/new /tmp/base
python3 -m pip install -q --no-index --no-deps --target /tmp/new dist/forge_kernels-*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/base dist/base/forge_kernels-*.whl
(cd scripts && timeout 130 python3 probe_import_stages.py /tmp/base /tmp/new --runs 21 --json "$OUT/stages.json" \
  > "$OUT/stages.txt" 2>&1; timeout 80 python3 probe_import_stages.py /tmp/base /tmp/new --runs 11 --no-bundle \
  --json "$OUT/stages_no_bundle.json" > "$OUT/stages_no_bundle.txt" 2>&1)
cat "$OUT/stages.txt" "$OUT/stages_no_bundle.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=400 TESTS="tests/" \
  PYTEST_ARGS="-n 16 --dist loadfile -q -rfE" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -12 "$OUT/round.txt"
