"""Session 53: where a library-style op's first call goes (forge_realworld installed): cProfile of import + first
call in a fresh process, the inputs made and the CUDA context up before; ``FORGE_NO_COLD=1`` for the full binding."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch

op = sys.argv[1]
if op == "liger_cross_entropy":
    x = torch.randn(8, 32000, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 32000, (8,), device="cuda")
    args: tuple = (x, t)
    kwargs: dict = {}
else:
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    args, kwargs = (x, w), {"offset": 1.0, "casting_mode": "gemma"}
torch.cuda.synchronize()
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
import forge_realworld as lib  # noqa: E402

getattr(lib, op)(*args, **kwargs)
torch.cuda.synchronize()
pr.disable()
print(f"{op}: import + first call {1e3 * (time.perf_counter() - t0):.2f} ms (under cProfile)")
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(45)
print(s.getvalue())
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue())
