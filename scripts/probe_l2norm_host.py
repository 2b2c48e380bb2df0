"""Host time per call of the FLA-style L2 norm (tests/fixtures/realworld/kernels/l2norm.py): the installed wheel
against the same file under Triton's JIT, in a synchronised loop, with a cProfile of each (where the host time goes:
under Triton, the driver's device properties read on every call). Run on a GPU machine from the repository root.

    python scripts/probe_l2norm_host.py
"""

import cProfile
import importlib.util
import pstats
import sys
import time

import torch

sys.path.insert(0, "tests/fixtures/realworld")  # the file's helper package, as in its project
import forge_realworld as wheel

spec = importlib.util.spec_from_file_location("_jit_l2", "tests/fixtures/realworld/kernels/l2norm.py")
jit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(jit)
x = torch.randn(32768, 128, device="cuda", dtype=torch.float16)
for name, fn in (("wheel", wheel.l2norm), ("jit", jit.l2norm)):
    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(100):
        fn(x)
    torch.cuda.synchronize()
    print(name, "per call us", (time.perf_counter() - t) * 1e4)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        fn(x)
    torch.cuda.synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
