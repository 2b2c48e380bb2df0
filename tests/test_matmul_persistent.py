"""The Triton tutorial's persistent matmul (tests/fixtures/realworld/kernels/matmul_persistent.py): the host code
passes torch's SM count as the ``NUM_SMS`` constexpr, so each GPU model needs its own binary. ``project.trace-gpus``
names the models the build traces (H100 SXM and PCIe for sm_90 here).

CPU: the variants per target and model, the manifest's checks of ``trace-gpus``. GPU: the wheel against torch in
fp64 and bit for bit against the same file under Triton's JIT, with the device's own SM count."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge_aot.errors import ManifestError
from forge_aot.manifest import load_manifest
from tests.conftest import (
    HALF_TOL,
    REALWORLD,
    import_fixture_file,
    offset_view,
    poison_allocator,
    relative_error,
    reset_handle,
)


def test_each_traced_gpu_gets_its_sm_count_built(realworld_plan) -> None:
    plan = realworld_plan
    sms = {t: {e.assignment["NUM_SMS"] for e in plan.entries if e.kernel == "matmul_persistent" and e.target == t}
           for t in ("sm_80", "sm_90")}
    assert sms == {"sm_80": {108}, "sm_90": {132, 114}}  # A100 SXM (default); H100 SXM and PCIe (listed)
    for e in plan.entries:
        if e.kernel == "matmul_persistent":
            (row,) = e.tables["default"]
            assert (row.preferences[0].num_warps, row.preferences[0].num_stages) == (8, 3)


def test_trace_gpus_are_checked(tmp_path: Path) -> None:
    from forge_aot.targets import DEFAULT_GPU, GPU_MODELS, trace_gpus

    assert all(GPU_MODELS[g].target == t for t, g in DEFAULT_GPU.items())
    assert trace_gpus(["sm_80", "sm_90"], ("H20", "H100-SXM")) == [("sm_80", "A100-SXM"), ("sm_90", "H20"),
                                                                   ("sm_90", "H100-SXM")]
    text = (REALWORLD / "kernel_manifest.toml").read_text()
    for bad, message in (('trace-gpus = ["H100-PCIE"]', r"unknown GPU 'H100-PCIE'.*did you mean 'H100-PCIe'"),
                         ('trace-gpus = ["MI300X"]', r"MI300X is a gfx942 GPU, which is not one of project.targets"),
                         ('trace-gpus = ["H20", "H20"]', "listed twice")):
        (tmp_path / "kernel_manifest.toml").write_text(
            text.replace('trace-gpus = ["H100-SXM", "H100-PCIe"]', bad).replace('tuning-data = "tuning"\n', ""))
        with pytest.raises(ManifestError, match=message) as info:
            load_manifest(tmp_path / "kernel_manifest.toml")
        assert "project.trace-gpus" in str(info.value)


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(realworld):
    return realworld


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "matmul_persistent.py", "_mp_jit")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mnk", [(1024, 1024, 1024), (777, 333, 129), (16, 4096, 4096), (1, 300, 64),
                                 (2048, 1536, 1000)])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "transposed-b"])
def test_persistent_matmul_against_torch_and_the_jit(wheel, jit, dtype, mnk, layout) -> None:
    import torch

    M, N, K = mnk
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a = torch.randn(M, K, device="cuda", dtype=dt)
    b = torch.randn(K, N, device="cuda", dtype=dt)
    if layout == "misaligned":
        a, b = offset_view(a), offset_view(b, 3)
    elif layout == "transposed-b":
        b = torch.randn(N, K, device="cuda", dtype=dt).t()
    import forge_realworld._ops.matmul_persistent as host

    reset_handle("forge_realworld._ops.matmul_persistent", "matmul_kernel_persistent")  # the C path's memory too
    poison_allocator(M * N * 2)
    c = wheel.matmul_persistent(a, b)
    torch.cuda.synchronize()
    assert relative_error(c, a.double() @ b.double()) < HALF_TOL[dtype] * 2
    (state,) = host.matmul_kernel_persistent._states.values()
    assert state.assignment["NUM_SMS"] == torch.cuda.get_device_properties(0).multi_processor_count
    jc = jit.matmul_persistent(a, b)
    if layout == "contiguous" and mnk in ((1024, 1024, 1024), (777, 333, 129), (16, 4096, 4096)):
        assert torch.equal(c, jc)  # a traced shape: the JIT's own binary
    else:
        assert relative_error(c, jc.double()) < 1e-3
