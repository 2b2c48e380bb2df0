"""A fresh process's first call of one op, profiled after ``import <package>`` (cProfile; the ranking, not
the absolute times, since the profiler slows Python code more than C).

    python scripts/first_call_profile.py forge_kernels vector_add [--no-c]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

package, op = sys.argv[1], sys.argv[2]
if "--no-c" in sys.argv:
    os.environ["FORGE_NO_C_LAUNCH"] = "1"
import torch  # noqa: E402

shape = {"vector_add": (1 << 20,), "matmul": (1000, 1000), "softmax": (1000, 777)}[op]
x = torch.randn(*shape, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t0 = time.perf_counter()
pkg = __import__(package)
t1 = time.perf_counter()
profile = cProfile.Profile()
profile.enable()
getattr(pkg, op)(*((x,) if op == "softmax" else (x, x)))
torch.cuda.synchronize()
profile.disable()
t2 = time.perf_counter()
print(f"import {1e3 * (t1 - t0):.3f} ms, first call (profiled) {1e3 * (t2 - t1):.3f} ms")
stats = pstats.Stats(profile)
stats.sort_stats("tottime").print_stats(30)
stats.sort_stats("cumtime").print_stats(45)
