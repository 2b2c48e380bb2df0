"""SageAttention 1.0.6 packaged unchanged (session 45's hunt): the wheel (no Triton) against the library's own files
under Triton's JIT and against fp32 SDPA, on fresh inputs with lengths other than the examples' (heads as built)."""
import json
import subprocess
import sys

CHILD = r'''
import json, sys, torch
torch.manual_seed(int(sys.argv[2]))
mode = sys.argv[1]
if mode == "wheel":
    sys.modules["triton"] = None
    import sage_aot as lib
else:
    sys.path.insert(0, "scratch_sage")
    import sageattention.core as lib
import torch.nn.functional as F
out = {}
for dtype in (torch.float16, torch.bfloat16):
    for d in (64, 128, 96):
        for (b, hq, hk, lq, lk, layout, causal) in ((2, 4, 2, 301, 1029, "HND", False),
                                                    (1, 4, 4, 517, 517, "NHD", True),
                                                    (3, 4, 2, 1, 64, "HND", False)):
            shape = (lambda h, l: (b, h, l, d)) if layout == "HND" else (lambda h, l: (b, l, h, d))
            q = torch.randn(*shape(hq, lq), dtype=dtype, device="cuda")
            k = torch.randn(*shape(hk, lk), dtype=dtype, device="cuda")
            v = torch.randn(*shape(hk, lk), dtype=dtype, device="cuda")
            o = lib.sageattn(q, k, v, tensor_layout=layout, is_causal=causal)
            t = (lambda x: x) if layout == "HND" else (lambda x: x.transpose(1, 2))
            kk, vv = t(k).float().repeat_interleave(hq // hk, 1), t(v).float().repeat_interleave(hq // hk, 1)
            ref = F.scaled_dot_product_attention(t(q).float(), kk, vv, is_causal=causal)
            o = t(o).float()
            key = f"{str(dtype)[6:]} d{d} {layout} {b}x{hq}/{hk}x{lq}x{lk}{' causal' if causal else ''}"
            out[key] = {"rel_err_vs_sdpa": ((o - ref).norm() / ref.norm()).item(), "sum": o.double().sum().item(),
                        "nan": bool(torch.isnan(o).any())}
            out[key]["o"] = o.flatten()[:4096].tolist()
print(json.dumps({"triton": "triton" in sys.modules and sys.modules["triton"] is not None, "cases": out}))
'''
rows = {}
for seed in (1, 2):
    res = {m: json.loads(subprocess.run([sys.executable, "-c", CHILD, m, str(seed)], capture_output=True, text=True,
                                        check=True).stdout.strip().splitlines()[-1]) for m in ("wheel", "jit")}
    assert not res["wheel"]["triton"] and res["jit"]["triton"]
    for key, w in res["wheel"]["cases"].items():
        j = res["jit"]["cases"][key]
        diff = max(abs(a - b) for a, b in zip(w["o"], j["o"]))
        rows[f"seed{seed} {key}"] = {"wheel_vs_sdpa": w["rel_err_vs_sdpa"], "jit_vs_sdpa": j["rel_err_vs_sdpa"],
                                     "max_abs_wheel_minus_jit_first4096": diff, "nan": w["nan"] or j["nan"]}
        print(f"{f'seed{seed} ' + key:50s} wheel/sdpa {w['rel_err_vs_sdpa']:.4f}  jit/sdpa {j['rel_err_vs_sdpa']:.4f}"
              f"  |wheel-jit| {diff:.3g}")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        print(json.dumps(rows), file=f)
else:
    print(json.dumps(rows), file=sys.stderr)
