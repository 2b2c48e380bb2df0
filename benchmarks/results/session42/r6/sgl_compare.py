"""SGLang 0.5.2's layers/elementwise.py (as released, an examples function appended) against the forge_sgl_elementwise
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
        calls = {
            "fused_softcap": lambda m, t: m.fused_softcap(x, 30.0, autotune=t),
            "fused_dual_residual_rmsnorm": lambda m, t: m.fused_dual_residual_rmsnorm(x, r, w1, w2, 1e-5, autotune=t),
            "fused_rmsnorm": lambda m, t: m.fused_rmsnorm(x, w1, 1e-5),
            "experts_combine_triton": lambda m, t: m.experts_combine_triton(moe, x),
            "gelu_and_mul_triton": lambda m, t: m.gelu_and_mul_triton(gu),
            "silu_and_mul_triton": lambda m, t: m.silu_and_mul_triton(gu),
        }
        for name, call in calls.items():
            for tuned in ((False, True) if name in ("fused_softcap", "fused_dual_residual_rmsnorm") else (False,)):
                rows.append({"op": name, "autotune": tuned, "dtype": str(dtype)[6:], "shape": [bs, hidden],
                             "wheel_vs_jit": diff(call(W, tuned), call(S, tuned))})
        compiled = torch.compile(lambda a: W.fused_softcap(a, 30.0, autotune=True), fullgraph=True)
        rows.append({"op": "fused_softcap under torch.compile", "autotune": True, "dtype": str(dtype)[6:],
                     "shape": [bs, hidden], "wheel_vs_jit": diff(compiled(x), S.fused_softcap(x, 30.0, autotune=True))})
for r in rows:
    print(f"{r['op']:36s} autotune={r['autotune']!s:5s} {r['dtype']:8s} {r['shape']} wheel_vs_jit={r['wheel_vs_jit']:.3g}")
print(json.dumps({"max": max(r["wheel_vs_jit"] for r in rows), "n": len(rows)}))
