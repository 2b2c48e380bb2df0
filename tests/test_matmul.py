"""matmul: packaged wheel against float64 torch, non-power-of-two shapes, transposed and misaligned inputs."""

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

TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}
SHAPES = [(1, 1, 1), (17, 33, 65), (1000, 1000, 1000), (512, 4096, 4096), (4096, 4096, 4096), (1, 4096, 300),
          (1100, 1048, 1032), (520, 536, 552)]
"""(M, N, K); on Hopper 1000³, 4096³, 1100×1048×1032 and 520×536×552 take the persistent TMA kernel when their
data are 16-byte aligned (1100×1048×1032 has partial tiles on every side; 1000³ and 520×536×552 have K not a
multiple of 16), the rest the tiled kernel (512×4096×4096: aligned and under 1024)."""



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("mnk", SHAPES)
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "transposed-b"])
def test_packaged_matmul(packaged, dtype: str, mnk: tuple[int, int, int], layout: str) -> None:
    import torch

    from kernels.matmul import TMA_MIN_DIM, TMA_MIN_DIM_UNALIGNED, reference

    M, N, K = mnk
    a = torch.randn(M, K, device="cuda", dtype=torch_dtype(dtype))
    b = torch.randn(K, N, device="cuda", dtype=torch_dtype(dtype))
    if layout == "misaligned":
        a, b = offset_view(a), offset_view(b, 5)
    elif layout == "transposed-b":
        b = torch.randn(N, K, device="cuda", dtype=torch_dtype(dtype)).t()
    poison_allocator(M * N * a.element_size())
    reset_handle("forge_kernels._ops.matmul", "matmul_kernel")
    reset_handle("forge_kernels._ops.matmul", "matmul_tma_kernel")
    c = packaged.matmul(a, b)
    torch.cuda.synchronize()
    assert c.shape == (M, N) and c.dtype == a.dtype
    assert relative_error(c, reference(a, b)) < TOLERANCE[dtype]
    # A call takes the most specialized binary of its config whose every assumption holds (the tuning inputs'
    # exact specializations per row, the same with M, N, K or any divisibility unassumed, the generic one).
    a2 = a if a.stride(1) == 1 else a.contiguous()
    b2 = b if b.stride(1) == 1 else b.contiguous()
    props = torch.cuda.get_device_properties(a.device)
    least = TMA_MIN_DIM_UNALIGNED if K % 16 or N % 16 else TMA_MIN_DIM
    tma = (not torch.version.hip and (props.major, props.minor) == (9, 0) and min(M, N, K) >= least
           and K % 8 == 0 and N % 8 == 0 and a2.data_ptr() % 16 == 0 and b2.data_ptr() % 16 == 0)
    tiled = launched_and_built("forge_kernels._ops.matmul", "matmul_kernel")
    persistent = launched_and_built("forge_kernels._ops.matmul", "matmul_tma_kernel")
    if tma:
        launched, built = persistent
        assert tiled[0] == set()
        assert launched == {expected_spec([a2, b2, c, M, N, K, props.multi_processor_count], built)}
    else:
        launched, built = tiled
        assert persistent[0] == set() and "x" * 9 in built
        assert launched == {expected_spec([a2, b2, c, M, N, K, a2.stride(0), b2.stride(0), c.stride(0)], built)}


@pytest.mark.gpu
def test_matmul_dev_mode(dev_ops) -> None:
    import torch

    a = torch.randn(300, 200, device="cuda", dtype=torch.float16)
    b = torch.randn(200, 100, device="cuda", dtype=torch.float16)
    assert relative_error(dev_ops["matmul"](a, b), a.double() @ b.double()) < 2e-3
