#!/usr/bin/env bash
# Session 61, r1: the runtime package's __init__ without the bytecode bundle's reading (read at the full runtime's
# first need since this session) against session 60's wheel (.device/dist_old), interleaved: (1) stage by stage
# (scripts/probe_import_stages.py OLD NEW), (2) beside the bare probe and the compact package
# (scripts/probe_lean_first_call.py), then (3) the GPU tests of the lean path, the bundle and the runtime's core.
set -u
OUT=${OUT:-r1}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" >> "$OUT/device.txt"
rm -rf /tmp/old /tmp/new
python3 -m pip install -q --no-deps --no-index --target /tmp/old .device/dist_old/forge_kernels-*.whl
python3 -m pip install -q --no-deps --no-index --target /tmp/new dist/forge_kernels-*.whl
(cd scripts && python3 probe_import_stages.py /tmp/old /tmp/new --runs 15 --json "$OUT/stages.json") \
  > "$OUT/stages.txt" 2>&1
cat "$OUT/stages.txt" | head -45
python3 scripts/probe_lean_first_call.py dist/forge_kernels-*.whl --runs 11 --json "$OUT/lean_probe.json" \
  > "$OUT/lean_probe.txt" 2>&1
tail -8 "$OUT/lean_probe.txt"
mkdir -p "$OUT/round"
( time OUT="$OUT/round" STEPS="tests" TESTS_TIMEOUT=300 TESTS="tests/test_lean.py tests/test_cold_kernel.py \
tests/test_c_launch_gpu.py tests/test_vector_add.py tests/test_softmax.py tests/test_matmul.py \
tests/test_preload_integrity_gpu.py tests/test_cold_process_gpu.py tests/test_torch_ops.py tests/test_runtime_bundle.py \
tests/test_lazy_import.py tests/test_first_call_fake_driver.py tests/test_cold_library.py tests/test_fla_simple_gla.py \
tests/test_multi_gpu.py tests/test_pdl_add.py tests/test_grid_sum.py" \
  PYTEST_ARGS="-n 16 --dist loadfile -rfEs" bash scripts/gpu_round.sh ) > "$OUT/round.txt" 2>&1
tail -14 "$OUT/round.txt"
