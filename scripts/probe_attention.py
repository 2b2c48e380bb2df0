"""Probe under Triton's JIT (no wheel): the block-pointer attention fixture against the tensor-descriptor one
(several configs) and torch SDPA, interleaved rounds, medians. Used to choose the attention fixtures' spaces.

    python scripts/probe_attention.py --rounds 5 --json probe.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

KERNELS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "realworld" / "kernels"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, KERNELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TMA_CONFIGS = [(128, 64, 2, 4), (128, 64, 3, 4), (128, 128, 2, 8), (128, 128, 3, 8), (64, 64, 3, 4), (128, 64, 4, 4),
               (64, 128, 3, 4)]
BLOCK_POINTER_CONFIGS = [(64, 64, 3, 4), (128, 64, 3, 8)]


def _case(bp, tma, shape, causal, rounds):
    z, h, n, d = shape
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    sm = 1.0 / d ** 0.5
    stage = 3 if causal else 1
    flops = 4 * z * h * n * n * d * (0.5 if causal else 1.0)
    contenders = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)}

    def tma_call(bm, bn, s, w):
        o = torch.empty_like(q)
        m = torch.empty((z, h, n), device="cuda", dtype=torch.float32)
        tma._attn_fwd_tma.fn[(triton.cdiv(n, bm), z * h, 1)](
            q, k, v, sm, m, o, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2), h, n, HEAD_DIM=d,
            BLOCK_M=bm, BLOCK_N=bn, STAGE=stage, num_stages=s, num_warps=w)
        return o

    def bp_call(bm, bn, s, w):
        o = torch.empty_like(q)
        m = torch.empty((z, h, n), device="cuda", dtype=torch.float32)
        bp._attn_fwd.fn[(triton.cdiv(n, bm), z * h, 1)](
            q, k, v, sm, m, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(), z, h, n, HEAD_DIM=d,
            BLOCK_M=bm, BLOCK_N=bn, STAGE=stage, num_stages=s, num_warps=w)
        return o

    for cfg in TMA_CONFIGS:
        if not (causal and cfg[0] < cfg[1]):
            contenders["tma {}/{} s{} w{}".format(*cfg)] = lambda cfg=cfg: tma_call(*cfg)
    for cfg in BLOCK_POINTER_CONFIGS:
        contenders["blockptr {}/{} s{} w{}".format(*cfg)] = lambda cfg=cfg: bp_call(*cfg)
    errors = {}
    for name, fn in list(contenders.items()):
        try:
            out = fn()
            torch.cuda.synchronize()
            errors[name] = ((out.float() - ref).norm() / ref.norm()).item()
        except Exception as e:  # a probe: report and drop the contender
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
            del contenders[name]
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            times[name].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    sdpa = statistics.median(times["sdpa"])
    print(f"\n{z}x{h}x{n}x{d}{' causal' if causal else ''}: flops {flops:.3g}")
    rows = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        rows[name] = {"median_ms": med, "min_ms": min(ts), "max_ms": max(ts), "tflops": flops / med / 1e9,
                      "vs_sdpa": sdpa / med, "rel_err": errors[name]}
        print(f"  {name:28s} {med:8.4f} ms ({min(ts):.4f}-{max(ts):.4f})  {flops / med / 1e9:6.1f} TFLOP/s  "
              f"{sdpa / med:5.2f}x sdpa  err {errors[name]:.1e}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    bp = _load("flash_attention")
    tma = _load("flash_attention_tma")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    results = {}
    for (z, h, n, d, causal) in ((4, 32, 4096, 128, False), (4, 32, 1024, 64, False), (4, 32, 4096, 128, True),
                                 (4, 32, 1000, 64, False)):
        case = f"{z}x{h}x{n}x{d}{' causal' if causal else ''}"
        results[case] = _case(bp, tma, (z, h, n, d), causal, a.rounds)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
