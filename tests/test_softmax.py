"""softmax: packaged wheel against float64 torch, odd row lengths, strided and misaligned inputs."""

from __future__ import annotations

import pytest

from tests.conftest import (
    expected_spec,
    launched_and_built,
    offset_view,
    poison_allocator,
    relative_error,
    reset_handle,
    torch_dtype,
)

TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1e-2}
SHAPES = [(1, 1), (3, 7), (37, 1000), (128, 4096), (5, 20000), (1024, 257)]



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "row-strided"])
def test_packaged_softmax(packaged, dtype: str, shape: tuple[int, int], layout: str) -> None:
    import torch

    from kernels.softmax import reference

    x = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype)) * 4
    if layout == "misaligned":
        x = offset_view(x)
    elif layout == "row-strided":
        x = torch.randn(shape[0], shape[1] + 5, device="cuda", dtype=torch_dtype(dtype))[:, 2 : 2 + shape[1]]
    poison_allocator(x.numel() * x.element_size())
    reset_handle("forge_kernels._ops.softmax", "softmax_kernel")
    out = packaged.softmax(x)
    torch.cuda.synchronize()
    assert relative_error(out, reference(x)) < TOLERANCE[dtype]
    # Built without examples: pointers aligned and strides divisible by 16 (n_cols as the row says, or
    # unassumed), no integer's divisibility assumed, and the generic binary.
    x2 = x.reshape(-1, shape[-1]) if x.stride(-1) == 1 else x.contiguous()
    launched, built = launched_and_built("forge_kernels._ops.softmax", "softmax_kernel")
    assert "xxxxx" in built
    assert launched == {expected_spec([out, x2, shape[-1], x2.stride(0), out.stride(0)], built)}


@pytest.mark.gpu
def test_softmax_handles_minus_inf(packaged) -> None:
    import torch

    x = torch.randn(4, 300, device="cuda")
    x[:, 100:] = float("-inf")
    out = packaged.softmax(x)
    assert not torch.isnan(out).any()
    assert relative_error(out, torch.softmax(x.double(), -1)) < 1e-5
