"""vector_add: packaged wheel and Triton JIT against float64 torch, odd sizes, misaligned views."""

from __future__ import annotations

import pytest

from tests.conftest import (
    expected_spec,
    in_fresh_thread,
    launched_and_built,
    offset_view,
    poison_allocator,
    relative_error,
    reset_handle,
    torch_dtype,
)

TOLERANCE = {"fp32": 1e-6, "fp16": 1e-3, "bf16": 8e-3}
SIZES = [1, 17, 1000, 4096, 65537, 1 << 20, 3_000_001]



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("misaligned", [False, True])
def test_packaged_vector_add(packaged, dtype: str, n: int, misaligned: bool) -> None:
    import torch

    from kernels.vector_add import reference

    x = torch.randn(n, device="cuda", dtype=torch_dtype(dtype))
    y = torch.randn(n, device="cuda", dtype=torch_dtype(dtype))
    if misaligned:
        x, y = offset_view(x), offset_view(y, 3)
    poison_allocator(x.numel() * x.element_size())
    reset_handle("forge_kernels._ops.vector_add", "add_kernel")
    out = packaged.vector_add(x, y)
    torch.cuda.synchronize()
    assert out.dtype == x.dtype and out.shape == x.shape
    assert relative_error(out, reference(x, y)) < TOLERANCE[dtype]
    # x, y, out, n_elements as Triton's JIT would specialize them; the most specialized binary that holds
    launched, built = launched_and_built("forge_kernels._ops.vector_add", "add_kernel")
    assert {"DDDD", "DDDx", "xxxx"} <= built
    assert launched == {expected_spec([x, y, out, n], built)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_dev_mode_matches_packaged(packaged, dev_ops, dtype: str) -> None:
    import torch

    x = torch.randn(12345, device="cuda", dtype=torch_dtype(dtype))
    y = torch.randn(12345, device="cuda", dtype=torch_dtype(dtype))
    assert torch.equal(dev_ops["vector_add"](x, y), packaged.vector_add(x, y))


@pytest.mark.gpu
def test_unbuilt_dtype_and_cpu_tensor_errors(packaged) -> None:
    import torch

    x = torch.randn(16, device="cuda", dtype=torch.float64)
    with pytest.raises(TypeError, match=r"no build for T=fp64.*bf16, fp16, fp32"):
        packaged.vector_add(x, x)
    with pytest.raises(RuntimeError, match="CPU tensor"):
        packaged.vector_add(torch.randn(4), torch.randn(4))


@pytest.mark.gpu
def test_launch_from_a_fresh_thread(packaged) -> None:
    """A new thread has no current CUDA context: the loader must launch under the device's primary context."""
    import torch

    x = torch.randn(5000, device="cuda")
    y = torch.randn(5000, device="cuda")
    torch.cuda.synchronize()
    def work():
        out = packaged.vector_add(x, y)
        torch.cuda.synchronize()
        return out

    assert relative_error(in_fresh_thread(work), x.double() + y.double()) < 1e-6
