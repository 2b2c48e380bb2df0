"""Element-wise add of two tensors: out = x + y."""

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for two tensors of the same shape and dtype on one GPU."""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(f"vector_add: shapes/dtypes differ: {tuple(x.shape)} {x.dtype}, {tuple(y.shape)} {y.dtype}")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n)
    return out


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.double() + y.double()


def tune_inputs(key, variant, device):
    """Random operands of ``n_elements`` elements (forge-aot tune; left out of the wheel)."""
    n = key["n_elements"]
    return (torch.randn(n, device=device, dtype=variant["T"]), torch.randn(n, device=device, dtype=variant["T"]))
