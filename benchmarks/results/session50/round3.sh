#!/usr/bin/env bash
# Session 50, r3: the session's final wheels (rebuilt on the CPU machine), the GPU tests of the files the session
# touched, the Cut Cross-Entropy hunt wheel and the flashinfer / lightning-attention hunt wheels. Run from the
# repository root on the device with OUT set; .hunt/g50 carries the hunt wheels and the libraries' sources.
set -u
OUT=${OUT:-r3}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
STEPS="" BUILD_REALWORLD=1 OUT="$OUT/round" bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
export PYTHONPATH=$PWD
timeout 210 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 --dist loadfile -rfEs tests/test_chunk_bmm_bwd.py \
  tests/test_declared_custom_ops.py tests/test_callsite.py tests/test_library_patterns.py tests/test_torch_ops.py \
  tests/test_localmods.py > "$OUT/pytest_gpu.txt" 2>&1
tail -3 "$OUT/pytest_gpu.txt"
python3 -m pip install -q --no-index --no-deps --force-reinstall .hunt/g50/*.whl > "$OUT/hunt_install.txt" 2>&1
CCE_SRC=.hunt/g50/cce_src timeout 120 python3 benchmarks/results/session50/hunts/gpu_cce.py --json "$OUT/cce.json" \
  > "$OUT/cce.txt" 2>&1
tail -5 "$OUT/cce.txt"
timeout 150 python3 benchmarks/results/session50/hunts/gpu_hunts50.py --src-fi .hunt/g50/fi_src \
  --src-la .hunt/g50/la_src --json "$OUT/hunts.json" > "$OUT/hunts.txt" 2>&1
tail -30 "$OUT/hunts.txt"
