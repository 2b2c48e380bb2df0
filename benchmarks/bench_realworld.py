"""Library-style kernels (tests/fixtures/realworld): the installed wheel against the same file under Triton's JIT.

Contenders, timed interleaved (each round times every contender once, in rotating order), --rounds rounds,
each figure a triton.testing.do_bench median; reported: the median over rounds and the spread (min–max):
  forge-aot   the installed forge_realworld wheel
  jit-same    forge-aot's development mode: the same host code and the wheel's config, through Triton's JIT
              (its host path is forge-aot's Python runtime plus Triton's launcher: for kernels of a few tens
              of µs that overhead shows; compare the device-bound cases)
  jit         the fixture file imported as is (Triton's JIT; @triton.autotune benchmarks its own configs)
  torch       the torch equivalent (F.rms_norm, F.layer_norm, torch.softmax, torch.mm,
              F.scaled_dot_product_attention)
The goal for forge-aot against jit-same is >= 0.98 (same config, so this isolates specialization and launch);
against jit it depends on tuning (the wheel's untuned default is the first config of the space).

--mode events (default): triton.testing.do_bench, one call per timed sample after an L2 flush: what a caller
sees, host time included where the host is slower than the kernel (tens of µs on a busy machine's CPU).
--mode graph: triton.testing.do_bench_cudagraph, the calls captured in a CUDA graph and replayed: device time
only (L2 warm for every contender alike), the comparison of the binaries themselves; a case that cannot be
captured (a backward through autograd) falls back to events and says so.

    python benchmarks/bench_realworld.py --rounds 5 --json realworld.json
    python benchmarks/bench_realworld.py --mode graph --only norm --rounds 7
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "realworld"


def _load(name: str):
    path = FIXTURE / "kernels" / f"{name}.py"
    if not path.is_file():  # Liger's layout: the ops package holds its kernel files
        path = FIXTURE / "ligerlike" / "ops" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_jit_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _torch_rotary(x, cos, sin):
    """Rotary embedding in eager torch, in the input's dtype (the GPT-NeoX halves)."""
    import torch

    half = cos.shape[-1]
    x0, x1 = x[..., :half], x[..., half:2 * half]
    c, s = cos[: x.shape[1], None, :], sin[: x.shape[1], None, :]
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c, x[..., 2 * half:]], dim=-1)


def _torch_rope(q, k, cos, sin):
    """Rotary embedding of (batch, heads, seq, head_dim) q and k in eager torch, in their dtype (rotate_half)."""
    import torch

    c, s = torch.cat([cos, cos], -1)[None, None], torch.cat([sin, sin], -1)[None, None]

    def rotate(x):
        half = x.shape[-1] // 2
        return x * c + torch.cat([-x[..., half:], x[..., :half]], -1) * s

    return rotate(q), rotate(k)


def _torch_group_quant(x, group_size: int):
    """Per-token-group FP8 (e4m3) quantization in eager torch: scales and values."""
    import torch

    groups = x.float().view(*x.shape[:-1], -1, group_size)
    scale = groups.abs().amax(dim=-1).clamp_min(1e-10) / 448.0
    q = (groups / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(x.shape), scale


def _torch_moe(F, fm, x, w1, w2, gating, topk):
    """Eager MoE as model code without fused kernels writes it: each expert's tokens gathered, two matmuls."""
    topk_weights, topk_ids = fm.fused_topk(gating, topk, True)
    out = x.new_zeros(x.shape, dtype=x.dtype)
    for e in range(w1.shape[0]):
        rows, k = (topk_ids == e).nonzero(as_tuple=True)
        gate, up = (x[rows] @ w1[e].T).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[e].T
        out.index_add_(0, rows, (y * topk_weights[rows, k, None]).to(x.dtype))
    return out


def _torch_giou_loss(pred, targets):
    """The post's loss_with_padding in eager torch (its generalized_box_iou on matched boxes), computed in fp32."""
    import torch

    p, g = pred.float(), targets.float()
    area1 = (p[..., 2] - p[..., 0]) * (p[..., 3] - p[..., 1])
    area2 = (g[..., 2] - g[..., 0]) * (g[..., 3] - g[..., 1])
    inter = (torch.minimum(p[..., 2:], g[..., 2:]) - torch.maximum(p[..., :2], g[..., :2])).clamp_min(0).prod(-1)
    union = area1 + area2 - inter
    enclose = (torch.maximum(p[..., 2:], g[..., 2:]) - torch.minimum(p[..., :2], g[..., :2])).clamp_min(0).prod(-1)
    giou = inter / union.clamp_min(1e-5) - (enclose - union) / enclose.clamp_min(1e-5)
    mask = (g[..., 3] > 0).float()
    return (giou * mask).sum() / mask.sum().clamp(1)


def _torch_chunk_cumsum(dt, A, chunk_size, dt_bias):
    """Mamba-2's chunk cumsum in eager torch (fp32): bias, softplus, the chunks' cumulative sums of dt * A."""
    import torch.nn.functional as F

    batch, seqlen, nheads = dt.shape
    nchunks = -(-seqlen // chunk_size)
    x = F.softplus(dt.float() + dt_bias)
    x = F.pad(x, (0, 0, 0, nchunks * chunk_size - seqlen)).view(batch, nchunks, chunk_size, nheads).permute(0, 3, 1, 2)
    return (x * A[None, :, None, None]).cumsum(-1), x


def _cases(torch, F, wheel, dev, jit):
    h = torch.float16
    cases = {}
    for rows, cols in ((8192, 2048), (4096, 8192), (4096, 5120)):
        x = torch.randn(rows, cols, device="cuda", dtype=h)
        w = torch.randn(cols, device="cuda", dtype=h)
        nbytes = 2 * x.numel() * 2
        cases[f"rms_norm fwd {rows}x{cols}"] = (nbytes, "B", {
            "forge-aot": lambda x=x, w=w: wheel.rms_norm(x, w),
            "jit-same": lambda x=x, w=w: dev["rms_norm"](x, w),
            "jit": lambda x=x, w=w: jit["rms_norm"].rms_norm(x, w),
            "torch": lambda x=x, w=w: F.rms_norm(x, (x.shape[-1],), w, 1e-6)})
    for rows, cols in ((4096, 4096), (8192, 1024)):
        x = torch.randn(rows, cols, device="cuda", dtype=h)
        w, b = torch.randn(cols, device="cuda", dtype=h), torch.randn(cols, device="cuda", dtype=h)
        nbytes = 2 * x.numel() * 2
        cases[f"layer_norm fwd {rows}x{cols}"] = (nbytes, "B", {
            "forge-aot": lambda x=x, w=w, b=b: wheel.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
            "jit-same": lambda x=x, w=w, b=b: dev["layer_norm"](x, (x.shape[-1],), w, b, 1e-5),
            "jit": lambda x=x, w=w, b=b: jit["layer_norm"].layer_norm(x, (x.shape[-1],), w, b, 1e-5),
            "torch": lambda x=x, w=w, b=b: F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)})
        xg = x.clone().requires_grad_(True)
        wg, bg = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
        dy = torch.randn_like(x)

        def fb(fn, xg=xg, wg=wg, bg=bg, dy=dy):
            return lambda: fn(xg, (xg.shape[-1],), wg, bg, 1e-5).backward(dy)

        cases[f"layer_norm fwd+bwd {rows}x{cols}"] = (None, None, {
            "forge-aot": fb(wheel.layer_norm), "jit-same": fb(dev["layer_norm"]),
            "jit": fb(jit["layer_norm"].layer_norm), "torch": fb(F.layer_norm)})
    # The tutorial softmax (warmup, occupancy-sized persistent grid). Block sizes differ between the dtypes: the
    # file's cache of compiled kernels is keyed by block size alone, so under the JIT a second dtype with the same
    # block size would launch the first one's binary.
    for rows, cols, dt in ((4096, 4096, h), (32, 32000, h), (4096, 1000, torch.float32), (2048, 8192, torch.float32)):
        x = torch.randn(rows, cols, device="cuda", dtype=dt)
        cases[f"fused_softmax {rows}x{cols} {str(dt)[6:]}"] = (2 * x.numel() * x.element_size(), "B", {
            "forge-aot": lambda x=x: wheel.softmax(x), "jit-same": lambda x=x: dev["softmax"](x),
            "jit": lambda x=x: jit["fused_softmax"].softmax(x), "torch": lambda x=x: torch.softmax(x, -1)})
    # FLA-style L2 norm: tiled rows (head size 128, tile and warps by architecture) and a persistent long-row kernel.
    for rows, cols in ((32768, 128), (4096, 4096)):
        x = torch.randn(rows, cols, device="cuda", dtype=h)
        cases[f"l2norm {rows}x{cols}"] = (2 * x.numel() * 2, "B", {
            "forge-aot": lambda x=x: wheel.l2norm(x), "jit-same": lambda x=x: dev["l2norm"](x),
            "jit": lambda x=x: jit["l2norm"].l2norm(x), "torch": lambda x=x: F.normalize(x, dim=-1)})
    # Rotary embedding through torch.library.wrap_triton (flash-attn) and as a @triton_op (torchao).
    x = torch.randn(8, 4096, 32, 128, device="cuda", dtype=h)
    angle = torch.randn(4096, 64, device="cuda")
    cos, sin = angle.cos().to(h), angle.sin().to(h)
    for op in ("apply_rotary", "rotary"):
        cases[f"{op} 8x4096x32x128"] = (2 * x.numel() * 2, "B", {
            # (x bound now: later cases rebind the name)
            "forge-aot": lambda op=op, x=x: getattr(wheel, op)(x, cos, sin),
            "jit-same": lambda op=op, x=x: dev[op](x, cos, sin),
            "jit": lambda op=op, x=x: getattr(jit["rotary"], op)(x, cos, sin),
            "torch": lambda x=x: _torch_rotary(x, cos, sin)})
    # Liger's GeGLU (libdevice tanh; n_cols a constexpr) forward, and forward + backward (gradients over the inputs).
    for rows, cols in ((4096, 11008), (8192, 4096)):
        a, b = (torch.randn(rows, cols, device="cuda", dtype=h) for _ in range(2))
        cases[f"geglu fwd {rows}x{cols}"] = (3 * a.numel() * 2, "B", {
            "forge-aot": lambda a=a, b=b: wheel.geglu(a, b), "jit-same": lambda a=a, b=b: dev["geglu"](a, b),
            "jit": lambda a=a, b=b: jit["geglu"].geglu(a, b),
            "torch": lambda a=a, b=b: F.gelu(a, approximate="tanh") * b})
        ag, bg, dc = a.clone().requires_grad_(True), b.clone().requires_grad_(True), torch.randn_like(a)

        def geglu_fb(fn, ag=ag, bg=bg, dc=dc):
            return lambda: fn(ag, bg).backward(dc)

        cases[f"geglu fwd+bwd {rows}x{cols}"] = (None, None, {
            "forge-aot": geglu_fb(wheel.geglu), "jit-same": geglu_fb(dev["geglu"]),
            "jit": geglu_fb(jit["geglu"].geglu),
            "torch": geglu_fb(lambda x, y: F.gelu(x, approximate="tanh") * y)})
    # Liger's cross entropy, forward + backward: its forward writes the gradient into the logits in place (after a
    # host sync, .item() on the target mask), its backward has nothing to scale (grad_output 1); torch's
    # F.cross_entropy forward + backward on the same bf16 logits.
    for rows, vocab in ((4096, 32000), (2048, 128256)):
        target = torch.randint(0, vocab, (rows,), device="cuda")
        target[::5] = -100
        logits = {n: torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16).requires_grad_()
                  for n in ("forge-aot", "jit-same", "jit", "torch")}

        def ce_fb(fn, x, target=target):
            def run():
                x.grad = None
                fn(x, target).backward()
            return run

        cases[f"liger ce fwd+bwd {rows}x{vocab}"] = (None, None, {
            "forge-aot": ce_fb(wheel.liger_cross_entropy, logits["forge-aot"]),
            "jit-same": ce_fb(dev["liger_cross_entropy"], logits["jit-same"]),
            "jit": ce_fb(jit["liger_cross_entropy"].liger_cross_entropy, logits["jit"]),
            "torch": ce_fb(F.cross_entropy, logits["torch"])})
    # Liger's fused linear cross entropy, forward + backward (its forward computes both gradients chunk by chunk):
    # torch projects the whole batch and differentiates F.cross_entropy.
    for rows, hidden, vocab in ((4096, 4096, 32000), (2048, 4096, 128256)):
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) * 0.05
        weight = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * 0.05
        target = torch.randint(0, vocab, (rows,), device="cuda")
        xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()

        def flce_fb(fn, xg=xg, wg=wg, target=target):
            def run():
                xg.grad = wg.grad = None
                fn(xg, wg, target).backward()
            return run

        cases[f"liger flce fwd+bwd {rows}x{hidden}x{vocab}"] = (None, None, {
            "forge-aot": flce_fb(wheel.liger_fused_linear_cross_entropy),
            "jit-same": flce_fb(dev["liger_fused_linear_cross_entropy"]),
            "jit": flce_fb(jit["fused_linear_cross_entropy"].liger_fused_linear_cross_entropy),
            "torch": flce_fb(lambda a, w, t: F.cross_entropy(a @ w.t(), t))})
    # FLA-style gated linear-attention recurrence: optional tensors passed as None, every argument by keyword.
    for b, t, hh, d in ((16, 2048, 4, 64), (8, 1024, 2, 128), (1, 64, 4, 64)):  # the built (H, K) pairs
        q, kk, v = (torch.randn(b, t, hh, d, device="cuda", dtype=h) for _ in range(3))
        g = torch.randn(b, t, hh, device="cuda").sigmoid().log()
        cases[f"fused_recurrent gla {b}x{t}x{hh}x{d}"] = (4 * q.numel() * 2 + g.numel() * 4, "B", {
            "forge-aot": lambda q=q, kk=kk, v=v, g=g: wheel.fused_recurrent_gla(q, kk, v, g=g),
            "jit-same": lambda q=q, kk=kk, v=v, g=g: dev["fused_recurrent_gla"](q, kk, v, g=g),
            "jit": lambda q=q, kk=kk, v=v, g=g: jit["fused_recurrent"].fused_recurrent_gla(q, kk, v, g=g)})
    # vLLM's fused MoE (compute_type a Triton element type, **config from the batch size), Mixtral's sizes (8 experts,
    # hidden 4096, intermediate 14336, top-2), decode and prefill batches; torch: the per-expert loop of eager
    # implementations.
    for tokens in (4, 512):
        x, w1, w2, gating = jit["fused_moe"].make_inputs(tokens, 8, 4096, 14336, 2, h, "cuda")
        moe = (x, w1, w2, gating, 2)
        cases[f"fused_moe {tokens}x4096 E8 I14336 top2"] = (6 * tokens * 2 * 4096 * 14336, "F", {
            "forge-aot": lambda moe=moe: wheel.fused_moe(*moe), "jit-same": lambda moe=moe: dev["fused_moe"](*moe),
            "jit": lambda moe=moe: jit["fused_moe"].fused_moe(*moe),
            "torch": lambda moe=moe: _torch_moe(F, jit["fused_moe"], *moe)})
    # vLLM's FP8 quantization (sm_90 builds only): per-token groups of 128 (DeepSeek-V3's hidden size), static scale.
    if torch.cuda.get_device_capability() >= (9, 0):
        for tokens in (4096, 33):
            x = torch.randn(tokens, 7168, device="cuda", dtype=torch.bfloat16)
            cases[f"fp8 group quant {tokens}x7168"] = (x.numel() * 3, "B", {
                "forge-aot": lambda x=x: wheel.per_token_group_quant_fp8(x, 128),
                "jit-same": lambda x=x: dev["per_token_group_quant_fp8"](x, 128),
                "jit": lambda x=x: jit["fp8_quant"].per_token_group_quant_fp8(x, 128),
                "torch": lambda x=x: _torch_group_quant(x, 128)})
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        scale = torch.tensor([0.37], device="cuda")
        cases["fp8 static quant 4096x4096"] = (x.numel() * 3, "B", {
            "forge-aot": lambda: wheel.static_scaled_fp8_quant(x, scale),
            "jit-same": lambda: dev["static_scaled_fp8_quant"](x, scale),
            "jit": lambda: jit["fp8_quant"].static_scaled_fp8_quant(x, scale),
            "torch": lambda: (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)})
        # vLLM's block-FP8 matmul, its config from the shipped JSON file; torch: a bf16 mm of the same shape.
        for m in (4096, 16):
            a8 = torch.randn(m, 7168, device="cuda").to(torch.float8_e4m3fn)
            b8 = torch.randn(1536, 7168, device="cuda").to(torch.float8_e4m3fn)
            a_s, b_s = torch.rand(m, 56, device="cuda"), torch.rand(12, 56, device="cuda")
            a16, b16 = a8.to(torch.bfloat16), b8.to(torch.bfloat16)
            args = (a8, b8, a_s, b_s, [128, 128], torch.bfloat16)
            cases[f"block fp8 matmul {m}x1536x7168"] = (2 * m * 1536 * 7168, "F", {
                "forge-aot": lambda args=args: wheel.w8a8_block_fp8_matmul(*args),
                "jit-same": lambda args=args: dev["w8a8_block_fp8_matmul"](*args),
                "jit": lambda args=args: jit["block_fp8_matmul"].w8a8_block_fp8_matmul(*args),
                "torch": lambda a16=a16, b16=b16: a16 @ b16.T})
    for m, n, k in ((4096, 4096, 4096), (1000, 1000, 1000), (16, 4096, 4096)):
        a = torch.randn(m, k, device="cuda", dtype=h)
        bm = torch.randn(k, n, device="cuda", dtype=h)
        cases[f"matmul {m}x{n}x{k}"] = (2 * m * n * k, "F", {
            "forge-aot": lambda a=a, bm=bm: wheel.matmul(a, bm), "jit-same": lambda a=a, bm=bm: dev["matmul"](a, bm),
            "jit": lambda a=a, bm=bm: jit["matmul_autotune"].matmul(a, bm), "torch": lambda a=a, bm=bm: a @ bm})
    for m, n, k in ((4096, 4096, 4096), (16, 4096, 4096)):  # the tutorial's persistent matmul (NUM_SMS constexpr)
        a = torch.randn(m, k, device="cuda", dtype=h)
        bm = torch.randn(k, n, device="cuda", dtype=h)
        cases[f"matmul_persistent {m}x{n}x{k}"] = (2 * m * n * k, "F", {
            "forge-aot": lambda a=a, bm=bm: wheel.matmul_persistent(a, bm),
            "jit-same": lambda a=a, bm=bm: dev["matmul_persistent"](a, bm),
            "jit": lambda a=a, bm=bm: jit["matmul_persistent"].matmul_persistent(a, bm),
            "torch": lambda a=a, bm=bm: a @ bm})
    # The tutorial's TMA matmul with host-side TensorDescriptors (B stored N x K; pre-hooks set the block shapes)
    for m, n, k in ((4096, 4096, 4096), (1000, 1024, 1000), (512, 512, 512)):
        a = torch.randn(m, k, device="cuda", dtype=h)
        bt = torch.randn(n, k, device="cuda", dtype=h)
        cases[f"matmul_tma_host {m}x{n}x{k}"] = (2 * m * n * k, "F", {
            "forge-aot": lambda a=a, bt=bt: wheel.matmul_tma(a, bt),
            "jit-same": lambda a=a, bt=bt: dev["matmul_tma"](a, bt),
            "jit": lambda a=a, bt=bt: jit["matmul_tma_host"].matmul_tma(a, bt), "torch": lambda a=a, bt=bt: a @ bt.T})
    for z, hh, n_ctx, d in ((4, 32, 4096, 128), (4, 32, 1024, 64)):
        q, kk, v = (torch.randn(z, hh, n_ctx, d, device="cuda", dtype=h) for _ in range(3))
        cases[f"attention {z}x{hh}x{n_ctx}x{d}"] = (4 * z * hh * n_ctx * n_ctx * d, "F", {
            "forge-aot": lambda q=q, kk=kk, v=v: wheel.attention(q, kk, v),
            "jit-same": lambda q=q, kk=kk, v=v: dev["attention"](q, kk, v),
            "jit": lambda q=q, kk=kk, v=v: jit["flash_attention"].attention(q, kk, v),
            "torch": lambda q=q, kk=kk, v=v: F.scaled_dot_product_attention(q, kk, v)})
    # The Triton 3.6 tutorial's attention: host descriptors on Hopper (warp_specialize=False, the only build there)
    for z, hh, n_ctx, d, ws in ((4, 32, 1024, 64, False), (4, 32, 4096, 64, False)):
        q, kk, v = (torch.randn(z, hh, n_ctx, d, device="cuda", dtype=h) for _ in range(3))
        cases[f"attention_tutorial {z}x{hh}x{n_ctx}x{d}{' ws' if ws else ''}"] = (4 * z * hh * n_ctx * n_ctx * d, "F", {
            "forge-aot": lambda q=q, kk=kk, v=v, ws=ws: wheel.tutorial_attention(q, kk, v, False, 0.5, ws),
            "jit-same": lambda q=q, kk=kk, v=v, ws=ws: dev["tutorial_attention"](q, kk, v, False, 0.5, ws),
            "jit": lambda q=q, kk=kk, v=v, ws=ws:
                jit["attention_tutorial"].tutorial_attention(q, kk, v, False, 0.5, ws),
            "torch": lambda q=q, kk=kk, v=v: F.scaled_dot_product_attention(q, kk, v, scale=0.5)})
    # The Triton 3.6 tutorial on programmatic dependent launch (its benchmark: fp32 vectors, graph replay), PDL on
    # and off; and a cooperative-grid sum (launch_cooperative_grid=True, one program per SM).
    for n in (2**20, 2**24):
        x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
        for pdl in (True, False):
            cases[f"pdl_add {n}{' pdl' if pdl else ''}"] = (3 * 4 * n, "B", {
                "forge-aot": lambda x=x, y=y, p=pdl: wheel.add(x, y, p),
                "jit-same": lambda x=x, y=y, p=pdl: dev["add"](x, y, p),
                "jit": lambda x=x, y=y, p=pdl: jit["pdl_add"].add(x, y, p), "torch": lambda x=x, y=y: x + y})
        cases[f"grid_sum {n}"] = (4 * n, "B", {
            "forge-aot": lambda x=x: wheel.grid_sum(x), "jit-same": lambda x=x: dev["grid_sum"](x),
            "jit": lambda x=x: jit["grid_sum"].grid_sum(x), "torch": lambda x=x: x.sum()})
    # gsplat-style SH to colour (a heuristic picks num_warps) and FlagGems-style row mean (@libentry over autotune)
    for n, deg, bs in ((1_000_000, 1, 256), (100_000, 0, 128)):
        sh, dirs = torch.randn(n, (deg + 1) ** 2, 3, device="cuda"), torch.randn(n, 3, device="cuda")
        cases[f"sh_to_color {n} deg{deg}"] = (4 * (sh.numel() + dirs.numel() + 3 * n), "B", {
            "forge-aot": lambda sh=sh, d=dirs, g=deg, b=bs: wheel.sh_to_color(sh, d, g, b),
            "jit-same": lambda sh=sh, d=dirs, g=deg, b=bs: dev["sh_to_color"](sh, d, g, b),
            "jit": lambda sh=sh, d=dirs, g=deg, b=bs: jit["sh_to_color"].sh_to_color(sh, d, g, b)})
    for shape, dim in (((4096, 4096), 1), ((1024, 1000), -1)):
        x = torch.randn(shape, device="cuda", dtype=h)
        cases[f"gems_mean {shape[0]}x{shape[1]}"] = (2 * x.numel(), "B", {
            "forge-aot": lambda x=x, d=dim: wheel.mean_dim(x, d), "jit-same": lambda x=x, d=dim: dev["mean_dim"](x, d),
            "jit": lambda x=x, d=dim: jit["gems_mean"].mean_dim(x, d), "torch": lambda x=x, d=dim: x.mean(d)})
    # Unsloth-style cross-entropy forward (heuristics coerce the flags the call passes), Gemma-2 softcapping
    for rows, cap in ((4096, 30.0), (512, 0)):
        logits = torch.randn(rows, 32000, device="cuda", dtype=h)
        labels = torch.randint(0, 32000, (rows,), device="cuda")
        cases[f"cross_entropy {rows}x32000{' softcap' if cap else ''}"] = (2 * logits.numel(), "B", {
            "forge-aot": lambda lg=logits, lb=labels, c=cap: wheel.cross_entropy_loss(lg, lb, c),
            "jit-same": lambda lg=logits, lb=labels, c=cap: dev["cross_entropy_loss"](lg, lb, c),
            "jit": lambda lg=logits, lb=labels, c=cap: jit["cross_entropy"].cross_entropy_loss(lg, lb, c),
            "torch": lambda lg=logits, lb=labels, c=cap: F.cross_entropy(
                (c * torch.tanh(lg.float() / c)) if c else lg.float(), lb)})
    # The GIoU loss of a Towards Data Science post: bf16 predictions (autocast) against fp32 targets, 256 boxes
    for batch in (32, 4096):
        pred = jit["giou"].random_boxes(batch, 256, torch.bfloat16, "cuda", padding=0.0)
        tgt = jit["giou"].random_boxes(batch, 256, torch.float32, "cuda", padding=0.3)
        cases[f"giou {batch}x256 bf16/fp32"] = (batch * 256 * (8 + 16 + 2 + 1), "B", {
            "forge-aot": lambda p=pred, t=tgt: wheel.loss_with_triton(p, t),
            "jit-same": lambda p=pred, t=tgt: dev["loss_with_triton"](p, t),
            "jit": lambda p=pred, t=tgt: jit["giou"].loss_with_triton(p, t),
            "torch": lambda p=pred, t=tgt: _torch_giou_loss(p, t)})
    # Triton's tutorial 04, seeded dropout (a new seed each call)
    for n in (1 << 20, 1 << 26):
        x = torch.randn(n, device="cuda", dtype=h)
        cases[f"dropout {n}"] = (2 * x.numel() * 2, "B", {
            "forge-aot": lambda x=x: wheel.seeded_dropout(x, 0.5, 1234),
            "jit-same": lambda x=x: dev["seeded_dropout"](x, 0.5, 1234),
            "jit": lambda x=x: jit["dropout"].seeded_dropout(x, 0.5, 1234),
            "torch": lambda x=x: F.dropout(x, 0.5)})
    # Mamba-2's chunk cumsum (autotuned over the head block; the wheel's rows tuned by forge-aot tune)
    for batch, seqlen, nheads in ((8, 4096, 80), (1, 1000, 24)):
        dt, A, dt_bias = jit["chunk_cumsum"].make_inputs(batch, seqlen, nheads, torch.bfloat16, "cuda")
        cases[f"chunk_cumsum {batch}x{seqlen}x{nheads}"] = (batch * seqlen * nheads * (2 + 8), "B", {
            "forge-aot": lambda d=dt, a=A, b=dt_bias: wheel._chunk_cumsum_fwd(d, a, 256, dt_bias=b, dt_softplus=True),
            "jit-same": lambda d=dt, a=A, b=dt_bias: dev["_chunk_cumsum_fwd"](d, a, 256, dt_bias=b, dt_softplus=True),
            "jit": lambda d=dt, a=A, b=dt_bias: jit["chunk_cumsum"]._chunk_cumsum_fwd(d, a, 256, dt_bias=b,
                                                                                    dt_softplus=True),
            "torch": lambda d=dt, a=A, b=dt_bias: _torch_chunk_cumsum(d, a, 256, b)})
    # A first-order linear recurrence in accelerated-scan's style (tl.associative_scan, enable_fp_fusion=False),
    # forward and forward + backward; torch has no scan to compare with (its loop over T is not a contender).
    for b, c, t in ((4, 256, 4096), (16, 1024, 2048)):
        gates, values = jit["linear_scan"].make_inputs(b, c, t, torch.bfloat16, "cuda")
        cases[f"linear_scan fwd {b}x{c}x{t}"] = (3 * gates.numel() * 2, "B", {
            "forge-aot": lambda g=gates, v=values: wheel.linear_scan(g, v),
            "jit-same": lambda g=gates, v=values: dev["linear_scan"](g, v),
            "jit": lambda g=gates, v=values: jit["linear_scan"].linear_scan(g, v)})
        gg, vg, dh = gates.clone().requires_grad_(), values.clone().requires_grad_(), torch.randn_like(values)

        def scan_fb(fn, gg=gg, vg=vg, dh=dh):
            return lambda: fn(gg, vg).backward(dh)

        cases[f"linear_scan fwd+bwd {b}x{c}x{t}"] = (None, None, {
            "forge-aot": scan_fb(wheel.linear_scan), "jit-same": scan_fb(dev["linear_scan"]),
            "jit": scan_fb(jit["linear_scan"].linear_scan)})
    # mamba_ssm's residual add + RMSNorm / LayerNorm (autotuned over num_warps; the forward rows tuned by
    # forge-aot tune, the backward's not): a Mamba block's pre-norm (fp32 residual stream) and a LayerNorm with bias
    for rows, n in ((2048, 2560), (16, 2560), (4096, 4096), (8, 4096)):
        x = torch.randn(rows, n, device="cuda", dtype=h)
        w, b = torch.randn(n, device="cuda", dtype=h), torch.randn(n, device="cuda", dtype=h)
        res = torch.randn(rows, n, device="cuda", dtype=torch.float32)
        cases[f"add_rms_norm fwd {rows}x{n}"] = (rows * n * (2 * 2 + 2 * 4), "B", {
            "forge-aot": lambda x=x, w=w, r=res: wheel.rms_norm_fn(x, w, None, r, prenorm=True, residual_in_fp32=True),
            "jit-same": lambda x=x, w=w, r=res: dev["rms_norm_fn"](x, w, None, r, prenorm=True, residual_in_fp32=True),
            "jit": lambda x=x, w=w, r=res: jit["add_norm"].rms_norm_fn(x, w, None, r, prenorm=True,
                                                                                 residual_in_fp32=True),
            "torch": lambda x=x, w=w, r=res: (F.rms_norm((x + r).to(h), (x.shape[-1],), w, 1e-6), x + r)})
        cases[f"layer_norm_fn fwd {rows}x{n}"] = (rows * n * 2 * 2, "B", {
            "forge-aot": lambda x=x, w=w, b=b: wheel.layer_norm_fn(x, w, b),
            "jit-same": lambda x=x, w=w, b=b: dev["layer_norm_fn"](x, w, b),
            "jit": lambda x=x, w=w, b=b: jit["add_norm"].layer_norm_fn(x, w, b),
            "torch": lambda x=x, w=w, b=b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-6)})
        if rows >= 2048:
            xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
            rg, dy = res.clone().requires_grad_(True), torch.randn_like(x)

            def norm_fb(fn, xg=xg, wg=wg, rg=rg, dy=dy):
                return lambda: fn(xg, wg, None, rg, prenorm=True, residual_in_fp32=True)[0].backward(dy)

            cases[f"add_rms_norm fwd+bwd {rows}x{n}"] = (None, None, {
                "forge-aot": norm_fb(wheel.rms_norm_fn), "jit-same": norm_fb(dev["rms_norm_fn"]),
                "jit": norm_fb(jit["add_norm"].rms_norm_fn)})
    # SGLang's paged decode attention (no autotune: the file as is runs the same config as the wheel), GQA 32/8,
    # head size 128, bf16; torch has no paged-KV kernel to compare with
    for batch, seq in ((32, 2048), (8, 8192)):
        args = jit["decode_attention"].make_inputs(batch, 32, 8, 128, [seq] * batch, torch.bfloat16, "cuda")
        cases[f"decode_attention {batch}x{seq} gqa"] = (2 * batch * seq * 8 * 128 * 2, "B", {
            "forge-aot": lambda a=args: wheel.decode_attention_fwd(*a, sm_scale=0.088),
            "jit-same": lambda a=args: dev["decode_attention_fwd"](*a, sm_scale=0.088),
            "jit": lambda a=args: jit["decode_attention"].decode_attention_fwd(*a, sm_scale=0.088)})
    # Unsloth-style RoPE (kernels wrapped after their def, strides as constexprs): Llama-3-8B's heads (32 query, 8
    # key/value, 128 wide), bf16, forward and forward + backward; torch is the rotate_half form in bf16
    rope = jit["unsloth_rope"]
    for batch, seq in ((4, 2048), (1, 512)):
        q, kk = (torch.randn(batch, heads, seq, 128, device="cuda", dtype=torch.bfloat16) for heads in (32, 8))
        angle = torch.randn(seq, 64, device="cuda")
        cos, sin = angle.cos().bfloat16(), angle.sin().bfloat16()
        cases[f"unsloth_rope fwd {batch}x{seq} 32/8x128"] = (2 * 2 * (q.numel() + kk.numel()), "B", {
            "forge-aot": lambda q=q, k=kk, c=cos, s=sin: wheel.fast_rope_embedding(q, k, c, s),
            "jit-same": lambda q=q, k=kk, c=cos, s=sin: dev["fast_rope_embedding"](q, k, c, s),
            "jit": lambda q=q, k=kk, c=cos, s=sin: rope.fast_rope_embedding(q, k, c, s),
            "torch": lambda q=q, k=kk, c=cos, s=sin: _torch_rope(q, k, c, s)})
        qg, kg = q.clone().requires_grad_(), kk.clone().requires_grad_()
        dq, dk = torch.randn_like(q), torch.randn_like(kk)

        def rope_fb(fn, qg=qg, kg=kg, c=cos, s=sin, dq=dq, dk=dk):
            return lambda: torch.autograd.backward(fn(qg, kg, c, s), (dq, dk))

        cases[f"unsloth_rope fwd+bwd {batch}x{seq} 32/8x128"] = (None, None, {
            "forge-aot": rope_fb(wheel.fast_rope_embedding), "jit-same": rope_fb(dev["fast_rope_embedding"]),
            "jit": rope_fb(rope.fast_rope_embedding), "torch": rope_fb(_torch_rope)})
    # Liger's fused residual add + RMSNorm (its backward's rows_per_program from the SM count), Llama-3-8B's hidden
    # size, 8 x 512 tokens, bf16; torch: the add, then F.rms_norm
    farn = jit["fused_add_rms_norm"]
    x, r = (torch.randn(8, 512, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)

    def torch_add_rms(x, r, w):
        s = x + r
        return F.rms_norm(s, (s.shape[-1],), w, 1e-6), s

    cases["liger_fused_add_rms_norm fwd 4096x4096"] = (x.numel() * 2 * 4, "B", {  # reads x, r; writes y, s
        "forge-aot": lambda: wheel.liger_fused_add_rms_norm(x, r, w),
        "jit-same": lambda: dev["liger_fused_add_rms_norm"](x, r, w),
        "jit": lambda: farn.liger_fused_add_rms_norm(x, r, w),
        "torch": lambda: torch_add_rms(x, r, w)})
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
    dy, ds = torch.randn_like(x), torch.randn_like(x)

    def add_rms_fb(fn):
        return lambda: torch.autograd.backward(fn(xg, rg, wg), (dy, ds))

    cases["liger_fused_add_rms_norm fwd+bwd 4096x4096"] = (None, None, {
        "forge-aot": add_rms_fb(wheel.liger_fused_add_rms_norm),
        "jit-same": add_rms_fb(dev["liger_fused_add_rms_norm"]),
        "jit": add_rms_fb(farn.liger_fused_add_rms_norm), "torch": add_rms_fb(torch_add_rms)})
    # flash-linear-attention's chunk-local cumsum (its own caching autotuner, keyed on IS_VARLEN): gates of 2 x 256K
    # steps x 4 heads in fp32 (batch and heads are constexprs, one binary each: the examples' 2 and 4), chunks of 64;
    # torch: the same sums of the chunks viewed as a dimension
    g = torch.randn(2, 1 << 18, 4, device="cuda")
    cases["chunk_local_cumsum 2x256Kx4"] = (g.numel() * 4 * 2, "B", {
        "forge-aot": lambda: wheel.chunk_local_cumsum(g, 64),
        "jit-same": lambda: dev["chunk_local_cumsum"](g, 64),
        "jit": lambda: jit["chunk_local_cumsum"].chunk_local_cumsum(g, 64),
        "torch": lambda: g.view(2, (1 << 18) // 64, 64, 4).cumsum(2).view(2, 1 << 18, 4)})
    # flash-attn's rotary as flash-attn writes it: an int offset (training) and a tensor of per-sequence offsets
    # (decoding with a KV cache), its SEQLEN_OFFSETS taking either; torch: the same rotation in eager ops
    fa_wheel = importlib.import_module("forge_realworld._ops.triton_rotary")
    fa_jit = importlib.import_module("flashattnlike.ops.triton.rotary")
    x = torch.randn(8, 4096, 32, 128, device="cuda", dtype=h)
    angle = torch.randn(8192, 64, device="cuda")
    cos, sin = angle.cos().to(h), angle.sin().to(h)
    for offset in (0, 7):
        cases[f"flash_rotary 8x4096x32x128 offset {offset}"] = (2 * x.numel() * 2, "B", {
            "forge-aot": lambda x=x, o=offset, c=cos, s=sin: fa_wheel.apply_rotary(x, c, s, seqlen_offsets=o),
            "jit": lambda x=x, o=offset, c=cos, s=sin: fa_jit.apply_rotary(x, c, s, seqlen_offsets=o),
            "torch": lambda x=x, o=offset, c=cos, s=sin: _torch_rotary(x, c[o:], s[o:])})
    q = torch.randn(64, 1, 32, 128, device="cuda", dtype=h)
    offsets = torch.randint(0, 8000, (64,), device="cuda", dtype=torch.int32)
    cases["flash_rotary decode 64x1x32x128 tensor offsets"] = (2 * q.numel() * 2, "B", {
        # (bound now: later cases rebind q, cos, sin)
        "forge-aot": lambda q=q, o=offsets, c=cos, s=sin: fa_wheel.apply_rotary(q, c, s, seqlen_offsets=o),
        "jit": lambda q=q, o=offsets, c=cos, s=sin: fa_jit.apply_rotary(q, c, s, seqlen_offsets=o),
        "torch": lambda q=q, o=offsets, c=cos, s=sin: _torch_rotary(q.transpose(0, 1), c[o.long()], s[o.long()])
        .transpose(0, 1)})
    # No "jit" (the file as is) here: its @triton.autotune compiles all 36 configs serially for each row (minutes
    # of device time); the tuner measured the same configs with the same compiler, and jit-same runs the winner.
    for z, hh, n_ctx, d, causal in ((4, 32, 4096, 128, False), (4, 32, 1024, 64, False), (4, 32, 4096, 128, True)):
        q, kk, v = (torch.randn(z, hh, n_ctx, d, device="cuda", dtype=h) for _ in range(3))
        cases[f"attention-tma {z}x{hh}x{n_ctx}x{d}{' causal' if causal else ''}"] = (
            4 * z * hh * n_ctx * n_ctx * d // (2 if causal else 1), "F", {
                "forge-aot": lambda q=q, kk=kk, v=v, c=causal: wheel.attention_tma(q, kk, v, c),
                "jit-same": lambda q=q, kk=kk, v=v, c=causal: dev["attention_tma"](q, kk, v, c),
                "torch": lambda q=q, kk=kk, v=v, c=causal: F.scaled_dot_product_attention(q, kk, v, is_causal=c)})
    # DeepSpeed's triton_ops (dslike, its files unchanged; kernels under `if _TRITON_AVAILABLE:`): SwiGLU at
    # Llama-3-8B's MLP width, bf16, forward and forward + backward; the fused RMSNorm at its built width (n_cols
    # and eps are constexprs there: 2048, 1e-6), forward + backward; the autotuned grouped GEMM over its built 4
    # groups (KC and NO are its autotune key: the wheel's untuned table serves any), torch one mm per group
    ds_swiglu = jit["ds_swiglu"]
    gate, up = (torch.randn(8, 512, 14336, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cases["ds_swiglu fwd 4096x14336"] = (3 * 2 * gate.numel(), "B", {
        "forge-aot": lambda: wheel.swiglu(gate, up), "jit-same": lambda: dev["swiglu"](gate, up),
        "jit": lambda: ds_swiglu.swiglu(gate, up), "torch": lambda: F.silu(gate) * up})
    gg, ug = gate.clone().requires_grad_(), up.clone().requires_grad_()
    dout = torch.randn_like(gate)

    def backward_of(fn, *args, grad):
        return lambda: torch.autograd.backward(fn(*args), grad)

    cases["ds_swiglu fwd+bwd 4096x14336"] = (None, None, {
        name: backward_of(fn, gg, ug, grad=dout) for name, fn in (
            ("forge-aot", wheel.swiglu), ("jit-same", dev["swiglu"]), ("jit", ds_swiglu.swiglu),
            ("torch", lambda g, u: F.silu(g) * u))})
    ds_rms = jit["ds_rms"]
    hidden = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dh = torch.randn_like(hidden)
    cases["ds_fused_rms_norm fwd+bwd 4096x2048"] = (None, None, {
        name: backward_of(fn, hidden, weight, 1e-6, grad=dh) for name, fn in (
            ("forge-aot", wheel.fused_rms_norm), ("jit-same", dev["fused_rms_norm"]),
            ("jit", ds_rms.fused_rms_norm), ("torch", lambda h, w, e: F.rms_norm(h, (h.shape[-1],), w, e)))})
    ds_gmm = jit["ds_group_gemm"]
    mat_a = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    mat_b = torch.randn(4, 4096, 2048, device="cuda", dtype=torch.bfloat16) / 64
    offs = torch.tensor([1024, 4096, 6144, 8192], device="cuda", dtype=torch.int32)
    bounds = [0, *offs.tolist()]

    def torch_gmm(a, b):
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(itertools.pairwise(bounds))])

    cases["ds_group_gemm fwd 4x(2048x4096x2048)"] = (2 * 8192 * 4096 * 2048, "F", {
        "forge-aot": lambda: wheel.group_gemm_triton(mat_a, mat_b, offs),
        "jit-same": lambda: dev["group_gemm_triton"](mat_a, mat_b, offs),
        "jit": lambda: ds_gmm.group_gemm_triton(mat_a, mat_b, offs), "torch": lambda: torch_gmm(mat_a, mat_b)})
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", default="", help="run only cases whose name contains one of these (comma-separated)")
    ap.add_argument("--mode", choices=("events", "graph"), default="events")
    args = ap.parse_args()
    import forge_realworld as wheel
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench, do_bench_cudagraph

    from forge_aot.dev import load_dev_ops

    sys.path.insert(0, str(REPO))
    dev = load_dev_ops(FIXTURE / "kernel_manifest.toml")
    sys.path.insert(0, str(FIXTURE))  # the fixture project's helper packages (ligerlike, flalike), as for its authors
    jit = {n: _load(n) for n in ("rms_norm", "layer_norm", "fused_softmax", "l2norm", "matmul_autotune",
                                 "matmul_persistent", "flash_attention", "geglu", "fp8_quant", "block_fp8_matmul",
                                 "fused_recurrent", "fused_moe", "matmul_tma_host", "attention_tutorial", "pdl_add",
                                 "grid_sum", "sh_to_color", "gems_mean", "cross_entropy", "giou", "dropout",
                                 "chunk_cumsum", "linear_scan", "add_norm", "decode_attention",
                                 "liger_cross_entropy", "fused_linear_cross_entropy", "fused_add_rms_norm",
                                 "chunk_local_cumsum")}
    from forge_aot.introspect import load_kernel_module

    # imported once per process: its @triton_op registered forge_fixture::rotary when the plan read it
    jit["rotary"] = load_kernel_module(str(FIXTURE / "kernels" / "rotary.py"))
    # a package (its relative imports), imported as its users import it
    jit["unsloth_rope"] = importlib.import_module("unslothlike.kernels.rope_embedding")
    for name, module in (("ds_swiglu", "swiglu_triton"), ("ds_rms", "fused_rms_norm"),
                         ("ds_group_gemm", "group_gemm_triton")):
        jit[name] = importlib.import_module(f"dslike.ops.triton_ops.{module}")
    results = {}
    names = ["forge-aot", "jit-same", "jit", "torch"]
    print(f"{'case':32s} " + " ".join(f"{n + ' ms':>12s}" for n in names)
          + f" {'jit-same/aot':>12s} {'jit/aot':>8s} {'torch/aot':>9s} {'aot rate':>14s}")
    for case, (work, unit, fns) in _cases(torch, F, wheel, dev, jit).items():
        if not any(part in case for part in args.only.split(",")):
            continue
        for fn in fns.values():  # warm up: module loads, JIT compiles, autotuning
            fn()
        torch.cuda.synchronize()
        present = [n for n in names if n in fns]
        samples: dict[str, list[float]] = {n: [] for n in present}
        mode = args.mode
        if mode == "graph":
            try:
                for n in present:
                    do_bench_cudagraph(fns[n], rep=5)
            except Exception as exc:  # not capturable: time this case with events
                print(f"{case}: graph capture failed ({type(exc).__name__}), timed with events", file=sys.stderr)
                torch.cuda.synchronize()
                mode = "events"
        for r in range(args.rounds):
            order = present[r % len(present):] + present[:r % len(present)]
            for n in order:
                samples[n].append(do_bench_cudagraph(fns[n], rep=50, return_mode="median") if mode == "graph"
                                  else do_bench(fns[n], warmup=25, rep=200, return_mode="median"))
        med = {n: statistics.median(v) for n, v in samples.items()}
        med.update({n: math.nan for n in names if n not in fns})  # not run for this case (see _cases)
        rate = ""
        if work:
            per_s = work / (med["forge-aot"] * 1e-3)
            rate = f"{per_s / 1e12:.2f} TB/s" if unit == "B" else f"{per_s / 1e12:.0f} TFLOP/s"
        results[case] = {"mode": mode, "median_ms": med,
                         "spread_ms": {n: [min(v), max(v)] for n, v in samples.items()},
                         "samples_ms": samples, "jit_same_over_aot": med["jit-same"] / med["forge-aot"],
                         "jit_over_aot": med["jit"] / med["forge-aot"],
                         "torch_over_aot": med["torch"] / med["forge-aot"],
                         "aot_rate": rate}
        print(f"{case:32s} " + " ".join(f"{med[n]:12.4f}" for n in names)
              + f" {med['jit-same'] / med['forge-aot']:12.3f} {med['jit'] / med['forge-aot']:8.3f}"
              f" {med['torch'] / med['forge-aot']:9.3f} {rate:>14s}" + ("" if mode == args.mode else f" ({mode})"))
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rounds": args.rounds,
                                         "mode": args.mode, "cases": results}, indent=1))


if __name__ == "__main__":
    main()
