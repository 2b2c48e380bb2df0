"""Where a tuning benchmark worker's start goes (``forge_aot.tune.bench_worker``: import torch, CUDA init, the
device's ceilings, import Triton), in fresh processes, with and without the CUDA driver initialised through
ctypes in a thread while torch imports (``thread``), and the primary context retained there too (``thread-ctx``).

    python scripts/probe_worker_boot.py [--runs 3]      (on a GPU machine; prints one JSON line per process)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, sys, threading, time
t0 = time.perf_counter()
stages = {}
pre = None
from forge_aot.runtime.drivers import driver  # as the worker: imported before torch
if sys.argv[1] in ("thread", "thread-ctx"):
    def init():
        drv = driver()
        drv.describe(0)
        if sys.argv[1] == "thread-ctx":
            drv.primary_context(0)
    pre = threading.Thread(target=init, daemon=True)
    pre.start()
import torch
stages["import torch"] = time.perf_counter() - t0
t = time.perf_counter()
if pre is not None:
    pre.join()
stages["join driver thread"] = time.perf_counter() - t
t = time.perf_counter()
torch.cuda.init()
torch.zeros(1, device="cuda")
stages["torch.cuda.init + first tensor"] = time.perf_counter() - t
t = time.perf_counter()
from forge_aot.tune.bench_worker import Worker
w = Worker(open("/dev/null", "w"))
stages["Worker()"] = time.perf_counter() - t
t = time.perf_counter()
d = w.device()
torch.cuda.synchronize()
stages["device() (ceilings)"] = time.perf_counter() - t
t = time.perf_counter()
import triton
stages["import triton"] = time.perf_counter() - t
stages["total"] = time.perf_counter() - t0
print(json.dumps({"mode": sys.argv[1], **{k: round(v, 4) for k, v in stages.items()}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    for _ in range(args.runs):
        for mode in ("plain", "thread", "thread-ctx"):
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["process"] = round(time.perf_counter() - start, 4)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
