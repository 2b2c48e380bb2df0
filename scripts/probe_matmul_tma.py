"""Probe under Triton's JIT (no wheel): the persistent TMA matmul (kernels/matmul.py: matmul_tma_kernel) over its
space against the tiled kernel's tuned winner and torch.mm, CUDA-graph replay, interleaved rounds, medians. Used
to decide whether the Hopper path earns its place before tuning it.

    python scripts/probe_matmul_tma.py --rounds 5 --json probe.json
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import statistics
from pathlib import Path

import torch
import triton
from triton.testing import do_bench_cudagraph

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def _load():
    spec = importlib.util.spec_from_file_location("matmul_probe", KERNELS / "matmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPACE = {"BLOCK_M": [128], "BLOCK_N": [256, 128], "BLOCK_K": [64, 128], "num_warps": [8, 4], "num_stages": [3, 4, 5]}
"""The manifest's space for matmul_tma (``--wide`` adds 64-row and 64-column tiles, for problems too small to fill
every SM with 128x128 tiles)."""
WIDE = {"BLOCK_M": [128, 64], "BLOCK_N": [256, 128, 64], "BLOCK_K": [64], "num_warps": [8, 4], "num_stages": [3, 4]}


def _case(mm, M: int, N: int, K: int, dtype: torch.dtype, sms: int, rounds: int, space: dict) -> dict:
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    ref = (a.double() @ b.double())
    fns = {"torch.mm": lambda: torch.mm(a, b)}
    c = torch.empty(M, N, device="cuda", dtype=dtype)

    def tiled(c=c):
        grid = (triton.cdiv(M, 128) * triton.cdiv(N, 256),)
        mm.matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), BLOCK_M=128,
                               BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
        return c
    fns["tiled winner 128x256x64 w8 s3"] = tiled
    for bm, bn, bk, w, s in itertools.product(*(space[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps",
                                                                  "num_stages"))):
        if (bm * bk + bk * bn) * 2 * s > 160 * 1024:
            continue

        def tma(bm=bm, bn=bn, bk=bk, w=w, s=s, c=c):
            grid = (min(sms, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
            mm.matmul_tma_kernel[grid](a, b, c, M, N, K, sms, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                       num_warps=w, num_stages=s)
            return c
        fns[f"tma {bm}x{bn}x{bk} w{w} s{s}"] = tma
    errors, times = {}, {k: [] for k in fns}
    for name, fn in list(fns.items()):
        try:
            c.fill_(float("nan"))
            got = fn()
            torch.cuda.synchronize()
            errors[name] = ((got.double() - ref).norm() / ref.norm()).item()
        except Exception as exc:  # a config that does not compile or run
            errors[name] = repr(exc)[:200]
            del times[name]
    for r in range(rounds):
        names = list(times)
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(do_bench_cudagraph(fns[name], rep=50) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["torch.mm"]
    case = f"{M}x{N}x{K} {dtype}"
    print(f"\n{case}  (us, median of {rounds}; vs torch = torch time / this time)")
    for k in sorted(med, key=med.get):
        print(f"  {k:34s} {med[k]:9.1f}  {base / med[k]:5.3f}x  err {errors[k]:.1e}")
    for k, e in errors.items():
        if isinstance(e, str):
            print(f"  {k}: {e}")
    return case, {"median_us": med, "samples_us": times, "rel_err": errors}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192,2048x4096x4096", help="MxNxK,...")
    ap.add_argument("--wide", action="store_true", help="also 64-row and 64-column tiles (see WIDE)")
    args = ap.parse_args()
    mm = _load()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {}
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        case, result = _case(mm, M, N, K, torch.float16, sms, args.rounds, WIDE if args.wide else SPACE)
        out[case] = result
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
