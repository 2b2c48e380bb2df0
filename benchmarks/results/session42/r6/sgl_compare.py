"""(As run in r6, restated ruff-clean: the ops bound per call, not per loop.)
SGLang 0.5.2's layers/elementwise.py (as released, an examples function appended) against the forge_sgl_elementwise
wheel built from it (manifest km42.toml: the autotuned second handles fused_softcap_kernel_autotuned and
fused_dual_residual_rmsnorm_kernel_autotune listed as kernels of their own), on the GPU, the shapes its examples
traced, fresh random inputs: max abs difference of the wheel against SGLang's own JIT (autotune=True: Triton's
autotuner against the wheel's untuned first config), and the wheel's custom op under torch.compile(fullgraph=True)."""
import json
import sys

import torch

sys.path[:0] = [".hunt/sgl_ew", ".hunt/site_sgl"]
import forge_sgl_elementwise as W  # noqa: E402
from sglang.srt.layers import elementwise as S  # noqa: E402

torch.manual_seed(0)
rows = []


def diff(a, b):
    if isinstance(a, (tuple, list)):
        return max(diff(x, y) for x, y in zip(a, b) if x is not None)
    return (a.double() - b.double()).abs().max().item()


for dtype in (torch.float16, torch.bfloat16):
    for bs, hidden in ((4, 4096), (3, 6144)):
        x = torch.randn(bs, hidden, device="cuda", dtype=dtype) * 40
        r = torch.randn(bs, hidden, device="cuda", dtype=dtype)
        w1 = torch.randn(hidden, device="cuda", dtype=dtype)
        w2 = torch.randn(hidden, device="cuda", dtype=dtype)
        moe = torch.randn(bs, 2, hidden, device="cuda", dtype=dtype)
        gu = torch.randn(bs, 2 * hidden, device="cuda", dtype=dtype)
        def calls(m, t, x=x, r=r, w1=w1, w2=w2, moe=moe, gu=gu):  # (the ops, called on the wheel or on SGLang)
            return {
                "fused_softcap": lambda: m.fused_softcap(x, 30.0, autotune=t),
                "fused_dual_residual_rmsnorm": lambda: m.fused_dual_residual_rmsnorm(x, r, w1, w2, 1e-5, autotune=t),
                "fused_rmsnorm": lambda: m.fused_rmsnorm(x, w1, 1e-5),
                "experts_combine_triton": lambda: m.experts_combine_triton(moe, x),
                "gelu_and_mul_triton": lambda: m.gelu_and_mul_triton(gu),
                "silu_and_mul_triton": lambda: m.silu_and_mul_triton(gu),
            }

        for name in calls(W, False):
            for tuned in ((False, True) if name in ("fused_softcap", "fused_dual_residual_rmsnorm") else (False,)):
                rows.append({"op": name, "autotune": tuned, "dtype": str(dtype)[6:], "shape": [bs, hidden],
                             "wheel_vs_jit": diff(calls(W, tuned)[name](), calls(S, tuned)[name]())})
        compiled = torch.compile(lambda a: W.fused_softcap(a, 30.0, autotune=True), fullgraph=True)
        rows.append({"op": "fused_softcap under torch.compile", "autotune": True, "dtype": str(dtype)[6:],
                     "shape": [bs, hidden], "wheel_vs_jit": diff(compiled(x), S.fused_softcap(x, 30.0, autotune=True))})
for row in rows:
    print(f"{row['op']:36s} autotune={row['autotune']!s:5s} {row['dtype']:8s} {row['shape']} "
          f"wheel_vs_jit={row['wheel_vs_jit']:.3g}")
print(json.dumps({"max": max(r["wheel_vs_jit"] for r in rows), "n": len(rows)}))
