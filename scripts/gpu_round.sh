#!/usr/bin/env bash
# One GPU round on a CUDA machine: build offline there, install the wheel built on the CPU machine, run the
# GPU tests through it, then the benchmarks. Logs and JSON go to ${OUT:-gpu-round}.
set -uo pipefail
OUT=${OUT:-gpu-round}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a "$OUT/device.txt"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# 1. the build works offline on the GPU machine too; compare with the wheel built on the CPU machine
python3 -m forge_aot.cli build --out "$OUT/dist-device" --build-dir /tmp/forge-build -q 2>&1 | tail -3 | tee "$OUT/build.txt"
sha256sum dist/*.whl "$OUT"/dist-device/*.whl | tee -a "$OUT/build.txt"
# 2. install the CPU-built wheel and test through it
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_kernels-*.whl 2>&1 | tail -2
python3 -m pytest -m gpu -q -x -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15
# 3. benchmarks
python3 benchmarks/bench_kernels.py --json "$OUT/kernels.json" 2>&1 | tee "$OUT/bench_kernels.txt"
python3 benchmarks/bench_cold_start.py --size 4096 --repeats 3 --json "$OUT/cold_start.json" 2>&1 | tee "$OUT/bench_cold_start.txt"
