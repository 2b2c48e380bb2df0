"""Kernels for the launch-overhead benchmark: 4 and 19 runtime arguments, and 4 with a @triton.heuristics value
(bench_launch.py)."""

import torch
import triton
import triton.language as tl


@triton.jit
def args19_kernel(out_ptr, x_ptr, y_ptr, z_ptr, w_ptr, n, a0, a1, a2, a3,
                  s0, s1, s2, s3, s4, s5, s6, s7, s8, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * s0, mask=mask)
    y = tl.load(y_ptr + offs * s1, mask=mask)
    z = tl.load(z_ptr + offs * s2, mask=mask)
    w = tl.load(w_ptr + offs * s3, mask=mask)
    acc = a0 * x + a1 * y + a2 * z + a3 * w + (s4 + s5 + s6 + s7 + s8)
    tl.store(out_ptr + offs, acc, mask=mask)


def args19(x, y, z, w):
    out = torch.empty_like(x)
    n = x.numel()
    args19_kernel[(triton.cdiv(n, 1024),)](out, x, y, z, w, n, 1.0, 2.0, 3.0, 4.0, 1, 1, 1, 1, 0, 0, 0, 0, 0,
                                           BLOCK=1024)
    return out


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def add_heur_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:  # the heuristic drops the mask when the blocks tile n exactly (a common library pattern)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add_heur(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_heur_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out
