"""GPTQModel 7.7.0's Triton quant matmul (kernels.py as released, its own custom_autotune) against the forge_gptq wheel
built from the same file (manifest m42.toml: the library's autotuner looked through, the manifest's two configs),
on the GPU: relative max error of the wheel against the library's JIT, fresh random inputs, misaligned activations."""
import json
import sys

import torch

sys.path[:0] = [".hunt/gptq", ".hunt/site"]
import forge_gptq  # noqa: E402
from gptqmodel.nn_modules.triton_utils import kernels as K  # noqa: E402

torch.manual_seed(0)
rows = []
for bits in (4, 8, 2):
    maxq = 2 ** bits - 1
    for M, KK, N in ((1, 4096, 4096), (16, 1024, 2048), (37, 4096, 11008), (128, 4096, 4096)):
        G = KK // 128
        x = torch.randn(M * KK + 1, device="cuda", dtype=torch.float16)[1:].view(M, KK)  # misaligned by 2 bytes
        qweight = torch.randint(-2**31, 2**31 - 1, (KK * bits // 32, N), device="cuda", dtype=torch.int32)
        scales = torch.rand(G, N, device="cuda", dtype=torch.float16) * 0.02
        qzeros = torch.randint(-2**31, 2**31 - 1, (G, N * bits // 32), device="cuda", dtype=torch.int32)
        g_idx = torch.arange(KK, device="cuda", dtype=torch.int32) // 128
        for op in ("quant_matmul_248", "quant_matmul_inference_only_248"):
            jit = getattr(K, op)(x, qweight, scales, qzeros, g_idx, bits, maxq).double()
            whl = getattr(forge_gptq, op)(x, qweight, scales, qzeros, g_idx, bits, maxq).double()
            rows.append({"op": op, "bits": bits, "M": M, "K": KK, "N": N,
                         "rel_err": ((whl - jit).abs().max() / jit.abs().max()).item()})
        grad = torch.randn(M, N, device="cuda", dtype=torch.float16)
        # The library's custom_autotune fails on Triton 3.6 for this kernel (min() over do_bench's list and its own
        # inf tuple): the reference is grad @ W.T with W the dequantized weight, from the library's JIT quant_matmul
        # of the identity (exact: W's fp16 values, summed once each in fp32).
        eye = torch.eye(KK, device="cuda", dtype=torch.float16)
        w = K.quant_matmul_248(eye, qweight, scales, qzeros, g_idx, bits, maxq).double()
        jit = grad.double() @ w.T
        whl = forge_gptq.transpose_quant_matmul_248(grad, qweight, scales, qzeros, g_idx, bits, maxq).double()
        rows.append({"op": "transpose_quant_matmul_248", "bits": bits, "M": M, "K": KK, "N": N,
                     "rel_err": ((whl - jit).abs().max() / jit.abs().max()).item()})
for r in rows:
    print(f"{r['op']:34s} bits={r['bits']} M={r['M']:4d} K={r['K']:5d} N={r['N']:5d} rel_err={r['rel_err']:.2e}")
print(json.dumps({"max_rel_err": max(r["rel_err"] for r in rows), "n": len(rows)}))
