#!/usr/bin/env bash
# One GPU round on a CUDA machine: install the wheels built on the CPU machine (dist/), run the GPU tests
# through them, then the benchmarks. Logs and JSON go to ${OUT:-gpu-round}.
#   STEPS="tests bench-realworld bench-realworld-graph bench-kernels bench-launch cold-start build"
#   (default: all but build and bench-realworld-graph; STEPS="" installs only)
#   TESTS: the test files of the tests step (default: tests). The whole GPU suite took about 10 minutes on the H100
#   in session 25, more than one device call may run: split it, TESTS="$(ls tests/test_[a-l]*.py)", then [m-z].
#   PYTEST_ARGS: more pytest arguments, e.g. "-n 8 --dist loadfile" with pytest-xdist's wheels in .whl/ (the device
#   has no network; `pip download -d .whl pytest-xdist execnet` here, then carry .whl). Not -q: the step passes it
#   already, and -qq drops pytest's closing count line (session 59's r2 had to count progress dots).
#   BUILD_REALWORLD=1 builds forge_realworld here (2 min on the H200's 16 cores; its 29 MB wheel and the
#   repository together exceed the 64 MiB a device call carries).
set -uo pipefail
OUT=${OUT:-gpu-round}; mkdir -p "$OUT"
STEPS=${STEPS-"tests bench-realworld bench-kernels bench-launch cold-start"}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a "$OUT/device.txt"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# BUILD_REALWORLD=1: build the library-style fixtures' wheel here first (about 2 min on 16 cores): the repository
# and that wheel together exceed what one device call carries.
if [ "${BUILD_REALWORLD:-0}" = 1 ]; then
  ( time python3 -m forge_aot.cli build --manifest tests/fixtures/realworld/kernel_manifest.toml --target sm_90 \
      -j "$(nproc)" -q --out dist ) > "$OUT/build_rw.txt" 2>&1
  tail -4 "$OUT/build_rw.txt"
fi
# BUILD_FLA=1: the same for the flash-linear-attention fixture's wheel (tests/test_fla_simple_gla.py imports forge_fla)
if [ "${BUILD_FLA:-0}" = 1 ]; then
  ( time python3 -m forge_aot.cli build --manifest tests/fixtures/fla060/kernel_manifest.toml --target sm_90 \
      -j "$(nproc)" -q --out dist ) > "$OUT/build_fla.txt" 2>&1
  tail -4 "$OUT/build_fla.txt"
fi
python3 -m pip install -q --no-index --no-deps --force-reinstall dist/forge_*.whl 2>&1 | tail -2
if ls .whl/pytest_xdist-*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -2; fi
# Each wheel's runtime bytecode bundle, as a first call would write it (this host sets PYTHONDONTWRITEBYTECODE):
# the GPU tests and benchmarks then import the runtime as a deployed wheel does after its first process.
for pkg in forge_kernels forge_realworld forge_launch; do
  (cd /tmp && env -u PYTHONPATH python3 -c "
import importlib.util, sys
if importlib.util.find_spec('$pkg') is None:
    sys.exit(print('$pkg: not installed this round'))
import $pkg._runtime as r
print('$pkg bundle written:', r.write_bundle())") | tee -a "$OUT/device.txt"
done
for step in $STEPS; do
  case $step in
    build)  # the build works offline on the GPU machine too; compare with the wheel built on the CPU machine
      python3 -m forge_aot.cli build --out "$OUT/dist-device" --build-dir /tmp/forge-build -q 2>&1 | tail -3 | tee "$OUT/build.txt"
      sha256sum dist/*.whl "$OUT"/dist-device/*.whl | tee -a "$OUT/build.txt" ;;
    tests) timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider ${PYTEST_ARGS:-} ${TESTS:-tests} 2>&1 \
        | tee "$OUT/pytest_gpu.txt" | tail -25 ;;
    bench-realworld) python3 benchmarks/bench_realworld.py --only "${ONLY:-}" --rounds ${ROUNDS:-5} --json "$OUT/realworld.json" 2>&1 | tee "$OUT/bench_realworld.txt" ;;
    bench-realworld-graph) python3 benchmarks/bench_realworld.py --mode graph --only "${ONLY:-}" --rounds ${ROUNDS:-5} \
        --json "$OUT/realworld_graph.json" 2>&1 | tee "$OUT/bench_realworld_graph.txt" ;;
    bench-kernels) python3 benchmarks/bench_kernels.py --json "$OUT/kernels.json" 2>&1 | tee "$OUT/bench_kernels.txt" ;;
    bench-launch) python3 benchmarks/bench_launch.py --json "$OUT/launch.json" 2>&1 | tee "$OUT/bench_launch.txt" ;;
    import-diag)  # where a fresh process's import + first call goes: -X importtime, bytecode caches, finders
      (cd /tmp && env -u PYTHONPATH python3 -X importtime -c "import torch; x = torch.randn(1 << 20, device='cuda', \
dtype=torch.float16); torch.cuda.synchronize(); import forge_kernels; forge_kernels.vector_add(x, x); \
torch.cuda.synchronize()") 2> "$OUT/importtime.txt"
      (cd /tmp && env -u PYTHONPATH python3 -c "import sys, os, forge_kernels; r = os.path.dirname(forge_kernels.__file__); \
print(sys.meta_path); print(sys.path); print(sys.flags); [print(d, sorted(os.listdir(d))) for d, _, f in \
os.walk(r) if d.endswith('__pycache__')]") > "$OUT/import_env.txt" 2>&1
      for op in vector_add matmul; do
        (cd /tmp && env -u PYTHONPATH python3 -c "
import cProfile, pstats, torch
n = 4096 if '$op' == 'matmul' else 1 << 20
x = torch.randn(n, n, device='cuda', dtype=torch.float16) if n == 4096 else torch.randn(n, device='cuda', dtype=torch.float16)
torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
import forge_kernels
getattr(forge_kernels, '$op')(x, x); torch.cuda.synchronize()
pr.disable(); pstats.Stats(pr).sort_stats('tottime').print_stats(45); pstats.Stats(pr).sort_stats('cumtime').print_stats(60)
") > "$OUT/first_call_cprofile_$op.txt" 2>&1
      done ;;
    cold-start) python3 benchmarks/bench_cold_start.py --size 4096 --repeats 3 --json "$OUT/cold_start.json" --profile "$OUT/cold_start_profile.txt" 2>&1 | tee "$OUT/bench_cold_start.txt" ;;
  esac
done
# One file comes back: every log and JSON of the round.
(cd "$OUT" && tar czf /tmp/gpu-round.tgz --exclude gpu-round.tgz . && mv /tmp/gpu-round.tgz . && \
  find . -maxdepth 1 -type f ! -name gpu-round.tgz -delete)
