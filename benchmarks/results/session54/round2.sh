#!/usr/bin/env bash
# Session 54, r2: library-style ops' import + first call (cold_ab_lib.py: session 53's forge_coldlib against this
# session's, cold handles against the full binding), then the [m-z] half of the GPU suite and FLA's GPU tests
# (forge_fla built here; forge_realworld carried from r1).
set -u
OUT=${OUT:-r2}; mkdir -p "$OUT/round"
export PYTHONUNBUFFERED=1
RW=1; if ls dist/forge_realworld-*.whl >/dev/null 2>&1; then RW=0; fi  # (r1 built it where the machine stayed warm)
OUT="$OUT/round" STEPS="" BUILD_FLA=1 BUILD_REALWORLD=$RW bash scripts/gpu_round.sh > "$OUT/install.txt" 2>&1
tail -4 "$OUT/install.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/old54 .hunt/old54/forge_coldlib-*.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/new54 dist/forge_coldlib-*.whl
timeout 200 python3 benchmarks/results/session54/cold_ab_lib.py --repeats 5 \
  --ops rms_norm,liger_fused_add_rms_norm,chunk_local_cumsum,scale_rows --json "$OUT/cold_ab_lib.json" \
  old=/tmp/old54 new=/tmp/new54 new-full=/tmp/new54:nocold > "$OUT/cold_ab_lib.txt" 2>&1
cat "$OUT/cold_ab_lib.txt"
OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=240 TESTS="$(ls tests/test_[m-z]*.py) tests/test_fla_simple_gla.py" \
  PYTEST_ARGS="-n 24 --dist loadfile -rfEs" bash scripts/gpu_round.sh > "$OUT/round.txt" 2>&1
tail -12 "$OUT/round.txt"
