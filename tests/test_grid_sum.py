"""A grid-wide barrier made safe by ``launch_cooperative_grid=True`` (tests/fixtures/realworld/kernels/grid_sum.py).

CPU: the plan records the flag the host code passes. GPU: the sum against torch in fp64 and bit for bit against
Triton's JIT on odd sizes; a grid too large to be resident at once is refused by the driver with its own error
(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE), which shows the attribute reaches ``cuLaunchKernelEx``: a plain launch
of that grid would start and spin."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, offset_view, poison_allocator, torch_dtype


def test_the_flag_is_recorded(realworld_plan) -> None:
    kp = realworld_plan.kernels["grid_sum"]
    assert kp.launch_flags == ["launch_cooperative_grid"] and "launch_cooperative_grid" not in kp.axes


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "grid_sum.py", "_grid_sum_jit")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("n", [1, 1000, 100_003, 4_000_037])
@pytest.mark.parametrize("programs", [None, 7])
@pytest.mark.parametrize("offset", [0, 1])
def test_grid_sum_against_torch_and_the_jit(realworld, jit, dtype, n, programs, offset) -> None:
    import torch

    x = offset_view(torch.randn(n, device="cuda", dtype=torch_dtype(dtype)), offset)
    results = []
    for impl in (realworld, jit):
        poison_allocator(4 * 4096)  # a partial sum read before its program wrote it would be NaN
        results.append(impl.grid_sum(x, programs))
    torch.cuda.synchronize()
    out, ref = results
    exact = x.double().sum().item()
    assert abs(out.double().item() - exact) <= 1e-5 * max(1.0, x.double().abs().sum().item())
    if offset == 0:  # the examples' specialization: the JIT's own binary, bit for bit
        assert torch.equal(out, ref)
    else:  # an unaligned input the examples did not trace: a less specialized binary, summed in another order
        assert abs(out.item() - ref.item()) <= 1e-6 * x.double().abs().sum().item()


@pytest.mark.gpu
def test_a_grid_that_cannot_be_resident_is_refused_by_the_driver(realworld, jit) -> None:
    import torch

    x = torch.randn(10_000, device="cuda")
    too_many = torch.cuda.get_device_properties(0).multi_processor_count * 64  # > 16 resident 128-thread blocks/SM
    with pytest.raises(realworld._runtime.DriverError, match="CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"):
        realworld.grid_sum(x, too_many)
    with pytest.raises(RuntimeError):  # Triton's own launcher refuses it too
        jit.grid_sum(x, too_many)
    torch.cuda.synchronize()  # nothing was launched: the stream is healthy
    assert abs(realworld.grid_sum(x).item() - x.double().sum().item()) < 1e-3
