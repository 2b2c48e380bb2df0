"""Kernels for the launch-overhead benchmark: 4 and 19 runtime arguments, 4 with a @triton.heuristics value, and 3
host-side tensor descriptors whose block shapes a config pre-hook sets, as the Triton tutorials' TMA kernels do
(bench_launch.py)."""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


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


def _desc_blocks(nargs):
    # the Triton tutorials' pattern: each config's pre-hook sets the descriptors' block shapes (the call passes dummies)
    for name in ("x_desc", "y_desc", "o_desc"):
        nargs[name].block_shape = [nargs["BM"], nargs["BN"]]


@triton.autotune(configs=[triton.Config({"BM": 32, "BN": 32}, num_warps=4, num_stages=1, pre_hook=_desc_blocks)],
                 key=["M", "N"])
@triton.jit
def add_desc_kernel(x_desc, y_desc, o_desc, M, N, BM: tl.constexpr, BN: tl.constexpr):
    m, n = tl.program_id(0) * BM, tl.program_id(1) * BN
    o_desc.store([m, n], x_desc.load([m, n]) + y_desc.load([m, n]))


def add_desc(x, y):
    out = torch.empty_like(x)
    M, N = x.shape
    dummy = [1, 1]
    descs = [TensorDescriptor(t, [M, N], [N, 1], dummy) for t in (x, y, out)]
    add_desc_kernel[lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))](*descs, M, N)
    return out


def examples(device="cpu"):
    add_desc(torch.randn(64, 64, device=device), torch.randn(64, 64, device=device))
