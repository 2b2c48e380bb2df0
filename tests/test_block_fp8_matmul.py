"""vLLM's block-FP8 matmul (tests/fixtures/realworld/kernels/block_fp8_matmul.py): the launch config comes from a
JSON file per (N, K, GPU model) beside the kernel file, looked up by ``torch.cuda.get_device_name()`` and the batch
size nearest to M, else a default config; the kernel launch spreads it (``**config``, launch options included).

CPU: the variants the two traced H100 models reach. GPU: the wheel against a dequantized fp64 reference and the
same file under Triton's JIT, and the config launched is the shipped file's row for M."""

from __future__ import annotations

import pytest

from tests.conftest import (
    HALF_TOL,
    REALWORLD,
    import_fixture_file,
    offset_view,
    relative_error,
    reset_handle,
    torch_dtype,
)

TUNED = {  # the shipped file's configs (BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M, num_warps, num_stages)
    "small": (16, 64, 1, 4, 4), "medium": (64, 64, 32, 4, 3), "large": (128, 128, 16, 8, 3)}
DEFAULT = (64, 128, 32, 4, 2)  # no file for the device (an H100 PCIe) or for the weight shape


def _config(assignment) -> tuple[int, ...]:
    return tuple(assignment[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "GROUP_SIZE_M", "num_warps", "num_stages"))


def test_the_tuned_file_and_the_default_config_are_both_built(realworld_plan) -> None:
    entries = [e for e in realworld_plan.entries if e.kernel == "block_fp8_matmul"]
    assert {e.target for e in entries} == {"sm_90"}
    configs = {_config(e.assignment) for e in entries}
    # the SXM trace reads the file (three configs over its batch sizes), the PCIe trace finds none (the default)
    assert configs == {*TUNED.values(), DEFAULT}
    assert {e.assignment["T"] for e in entries} == {"bf16", "fp16"} and len(entries) == 8
    assert realworld_plan.modules["block_fp8_matmul"]["schemas"]["w8a8_block_fp8_matmul"] == (
        "(Tensor A, Tensor B, Tensor As, Tensor Bs, SymInt[] block_size, ScalarType output_dtype=float16) -> Tensor")


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "block_fp8_matmul.py", "_bfp8_jit_block_fp8_matmul")


def _operands(m: int, n: int, k: int):
    import torch

    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    a_s = torch.rand(m, k // 128, device="cuda") + 0.1
    b = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    b_s = torch.rand((n + 127) // 128, k // 128, device="cuda") + 0.1
    return a, b, a_s, b_s


def _reference(a, b, a_s, b_s):
    a_deq = a.double() * a_s.double().repeat_interleave(128, dim=1)[:, : a.shape[1]]
    b_deq = b.double() * b_s.double().repeat_interleave(128, dim=0)[: b.shape[0]].repeat_interleave(128, dim=1)[
        :, : b.shape[1]]
    return a_deq @ b_deq.T


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(("m", "n", "expected"), [(1, 1536, "small"), (13, 1536, "small"), (100, 1536, "medium"),
                                                  (3000, 1536, "large"), (77, 2112, "default")])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
def test_block_fp8_matmul_launches_the_shipped_files_config(realworld, jit, out_dtype, m, n, expected,
                                                           layout) -> None:
    import torch

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wheel builds the FP8 kernels for sm_90 only")
    dtype = torch_dtype(out_dtype)
    a, b, a_s, b_s = _operands(m, n, 7168)
    if layout == "misaligned":
        a = offset_view(a)  # one byte off: no 16-byte alignment for A
    reset_handle("forge_realworld._ops.block_fp8_matmul", "_w8a8_block_fp8_matmul")
    c = realworld.w8a8_block_fp8_matmul(a, b, a_s, b_s, [128, 128], output_dtype=dtype)
    torch.cuda.synchronize()
    assert c.shape == (m, n) and c.dtype == dtype
    assert relative_error(c, _reference(a, b, a_s, b_s)) < HALF_TOL[out_dtype]
    import forge_realworld._ops.block_fp8_matmul as host

    (state,) = host._w8a8_block_fp8_matmul._states.values()
    on_sxm = torch.cuda.get_device_name() == "NVIDIA H100 80GB HBM3"
    want = TUNED[expected] if expected in TUNED and on_sxm else DEFAULT
    assert _config(state.assignment) == want  # read from the wheel's copy of the file
    assert torch.equal(c, jit.w8a8_block_fp8_matmul(a, b, a_s, b_s, [128, 128], output_dtype=dtype))


@pytest.mark.gpu
def test_the_wheel_reads_its_own_copy_of_the_config_file(realworld) -> None:
    import os

    import forge_realworld._ops.block_fp8_matmul as host
    import torch

    host.get_w8a8_block_fp8_configs.cache_clear()
    configs = host.get_w8a8_block_fp8_configs(1536, 7168, 128, 128)
    shipped = os.path.join(os.path.dirname(realworld.__file__), "_ops", "configs")
    if torch.cuda.get_device_name() == "NVIDIA H100 80GB HBM3":
        assert configs is not None and sorted(configs)[:3] == [1, 2, 4]
    assert os.listdir(shipped) == [
        "N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"]
