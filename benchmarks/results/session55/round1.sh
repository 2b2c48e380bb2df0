#!/usr/bin/env bash
# Session 55, r1: the driver's host cost per launch by how parameters reach it (kernelParams, extra buffer,
# cuLaunchKernelEx), and a fresh process's import + first call stage by stage (with and without the collector).
set -uo pipefail
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/device.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" >> "$OUT/device.txt"
cc -O2 -o /tmp/plm benchmarks/results/session55/probe_launch_modes.c -ldl
rm -rf /tmp/fl && mkdir /tmp/fl && (cd /tmp/fl && python3 -m zipfile -e "$OLDPWD"/dist/forge_launch-*.whl .)
ADD=$(find /tmp/fl -path "*bin/add/*" -name xxxx.cubin | head -1)
A19=$(find /tmp/fl -path "*bin/args19/*" -name xxxxxxxxxxxxxxx.cubin | head -1)
for rep in 1 2; do
  echo "== add, rep $rep" >> "$OUT/modes.txt"
  /tmp/plm "$ADD" add_kernel pppipp 32000 32 15 >> "$OUT/modes.txt" 2>&1
  echo "== args19, rep $rep" >> "$OUT/modes.txt"
  /tmp/plm "$A19" args19_kernel pppppiffffiiiiiiiiipp 32000 32 15 >> "$OUT/modes.txt" 2>&1
done
cat "$OUT/modes.txt"
for g in gc nogc gc nogc; do
  echo "== $g" >> "$OUT/stages.txt"
  python3 scripts/probe_cold_stages.py dist/forge_kernels-*.whl --runs 9 --gc $g >> "$OUT/stages.txt" 2>&1
done
cat "$OUT/stages.txt"
