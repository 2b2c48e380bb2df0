"""The Triton tutorial's fused softmax (tests/fixtures/realworld/kernels/fused_softmax.py), packaged unchanged: host
code that asks Triton's driver for the device's properties at import, compiles with ``kernel.warmup(...)`` to read
the binary's registers and shared memory, sizes a persistent grid by occupancy and launches the compiled kernel.

CPU: the split of its host code, the build's per-target tracing (num_stages follows each target's shared memory),
the runtime's answers for Triton's driver, the compiled-kernel handle. GPU: the wheel against torch, against the
same file under Triton's JIT (the same binary: the same registers, grid and bits), with Triton unimportable."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from forge_aot import runtime as rt
from forge_aot.sourcesplit import parse_source
from tests.conftest import (
    REALWORLD,
    import_fixture_file,
    offset_view,
    poison_allocator,
    relative_error,
    reset_handle,
    torch_dtype,
)

SOURCE = REALWORLD / "kernels" / "fused_softmax.py"
TRITON_CUDA_KEYS = {"max_shared_mem", "max_num_regs", "multiprocessor_count", "warpSize", "sm_clock_rate",
                    "mem_clock_rate", "mem_bus_width"}
TOL = {"fp16": 2e-3, "fp32": 1e-5}


def test_host_code_keeps_the_driver_queries_and_the_warmup() -> None:
    src = parse_source(SOURCE, {"softmax"})
    host = src.host_source.splitlines()
    original = SOURCE.read_text().splitlines()
    assert len(host) == len(original)
    at = original.index("from triton.runtime import driver")
    assert host[at] == "driver = triton.runtime.driver"
    for line in ("DEVICE = triton.runtime.driver.active.get_active_torch_device()",
                 "properties = driver.active.utils.get_device_properties(DEVICE.index)"):
        assert host[original.index(line)] == line
    assert src.reads_device
    (site,) = src.launches  # the warmup, with the call-site constexprs and options it passes
    assert set(site.keywords) == {"BLOCK_SIZE", "num_stages", "num_warps"}


def test_each_target_gets_the_stages_its_shared_memory_asks_for(realworld_plan) -> None:
    # num_stages = 4 if SIZE_SMEM > 200000 else 2: A100 (163 KB) 2, H100 (227 KB) 4. The kernel parameter and the
    # compile option are one axis, as a Triton keyword argument sets both.
    entries = [e for e in realworld_plan.entries if e.kernel == "fused_softmax"]
    stages = {t: {e.assignment["num_stages"] for e in entries if e.target == t} for t in ("sm_80", "sm_90")}
    assert stages == {"sm_80": {2}, "sm_90": {4}}
    for e in entries:
        assert e.assignment["num_warps"] == 8
        for rows in e.tables.values():
            for row in rows:
                assert (row.preferences[0].num_stages, row.preferences[0].num_warps) == (e.assignment["num_stages"], 8)
    blocks = {(e.assignment["T"], e.assignment["BLOCK_SIZE"]) for e in entries if e.target == "sm_90"}
    assert blocks == {("fp16", 1024), ("fp16", 4096), ("fp16", 8192), ("fp16", 32768), ("fp32", 1024),
                      ("fp32", 4096), ("fp32", 8192)}
    # host code that never asks about the device is traced once, for every target alike; the RMSNorm's asks
    # torch for the SM count (its backward's grid): traced per target, the same variants on both
    for kernel, targets in (("layer_norm_fwd", {None}), ("rms_norm_fwd", {"sm_80", "sm_90"})):
        built = {(e.variant, e.target) for e in realworld_plan.entries if e.kernel == kernel}
        assert {v for v, t in built if t == "sm_80"} == {v for v, t in built if t == "sm_90"}
        calls = [c for calls in (e.calls for e in realworld_plan.entries if e.kernel == kernel) for cs in calls.values()
                 for c in cs]
        assert calls and {c.target for c in calls} == targets


def test_the_host_shim_answers_as_the_traced_targets_gpu() -> None:
    from forge_aot.targets import TARGETS, representative_device
    from forge_aot.trace import as_target

    driver = rt.host_triton.runtime.driver
    assert driver.active is driver
    for target in ("sm_80", "sm_90", "gfx942"):
        info = TARGETS[target]
        with as_target(target, tag=False):
            props = driver.active.utils.get_device_properties(0)
            got = driver.active.get_current_target()
            assert (got.backend, got.arch, got.warp_size) == (info.backend, info.arch, info.warp_size)
            assert props == representative_device(target)[1] and props["max_shared_mem"] == info.max_shared
            assert driver.active.get_active_torch_device().index == 0
        assert set(props) >= TRITON_CUDA_KEYS
        assert set(props) - TRITON_CUDA_KEYS == (set() if info.backend == "cuda" else {"arch", "max_threads_per_sm"})
    assert rt.DEVICE_PROFILE[0] is None  # restored
    with pytest.raises(AttributeError, match=r"triton\.runtime\.driver only, not triton\.runtime\.autotuner"):
        rt.host_triton.runtime.autotuner  # noqa: B018
    with pytest.raises(AttributeError, match="read-only"):
        got.arch = 80  # type: ignore[misc]


def test_the_real_devices_answers_are_read_once_per_device(monkeypatch) -> None:
    # the driver takes ~0.13 ms per attribute on the H100 host; FLA-style host code asks on every call
    import importlib

    from forge_aot.runtime import drivers

    host_driver = importlib.import_module("forge_aot.runtime.host_driver")
    calls = []

    class FakeDriver:
        backend = "cuda"

        def properties(self, index):
            calls.append(("properties", index))
            return {"multiprocessor_count": 132 + index, "max_shared_mem": 232448}

        def describe(self, index):
            calls.append(("describe", index))
            return {"capability": (9, 0), "arch": "sm_90", "name": "fake", "max_shared": 232448}

    monkeypatch.setattr(drivers, "_driver", FakeDriver())
    monkeypatch.setattr(host_driver, "_PROPERTIES", {})
    monkeypatch.setattr(host_driver, "_TARGETS", {})
    monkeypatch.setattr(host_driver._ActiveDriver, "get_current_device", lambda self: 1)
    active = rt.host_triton.runtime.driver.active
    first = active.utils.get_device_properties(1)
    first["multiprocessor_count"] = 0  # the caller's copy
    assert active.utils.get_device_properties(1)["multiprocessor_count"] == 133
    assert active.utils.get_device_properties(0)["multiprocessor_count"] == 132
    assert active.get_current_target() is active.get_current_target()
    assert (active.get_current_target().backend, active.get_current_target().arch) == ("cuda", 90)
    assert calls == [("properties", 1), ("properties", 0), ("describe", 1)]


def test_the_compiled_handle_takes_all_parameters_or_the_runtime_ones() -> None:
    spec = {"function": "k", "params": [["y", "*fp16"], ["x", "*fp16"], ["n", "i32"], ["BLOCK", "constexpr"],
                                        ["STAGES", "constexpr"]],
            "axes": ["BLOCK", "STAGES"], "dtype_args": {}, "spec_params": [], "key": [], "variants": {}}
    launched = []

    class Recording(rt.Kernel):
        def run(self, grid, args, kwargs):
            launched.append((grid, args, kwargs))

    kernel = Recording("k", spec, {}, backend=None)
    handle = rt.PlaceholderCompiled(kernel, {"BLOCK": 64, "STAGES": 2, "num_warps": 8})
    handle._init_handles()
    assert (handle.n_regs, handle.n_spills, handle.metadata.num_warps, handle.metadata.shared) == (32, 0, 8, 1024)
    handle[(3, 1, 1)]("y", "x", 5, 64, 2)  # every parameter, constexprs included (the tutorial's launch)
    handle[(3,)]("y", "x", 5)  # the runtime parameters only
    assert launched == [((3, 1, 1), ("y", "x", 5), {"BLOCK": 64, "STAGES": 2, "num_warps": 8}),
                        ((3,), ("y", "x", 5), {"BLOCK": 64, "STAGES": 2, "num_warps": 8})]
    with pytest.raises(TypeError, match=r"its 3 runtime arguments or all 5 parameters, got 4"):
        handle[(1,)]("y", "x", 5, 64)
    with pytest.raises(rt.ForgeRuntimeError, match="torch's current stream"):
        handle[(1,)]("y", "x", 5, stream=7)
    with pytest.raises(AttributeError, match=r"metadata\.shared.*not metadata\.tmem_size"):
        handle.metadata.tmem_size  # noqa: B018


def test_meta_implementation_runs_the_warmup_without_a_binary() -> None:
    # a custom op's fake implementation (torch.compile / torch.export) runs the host code with launches skipped:
    # the warmup gives the placeholder, and the output comes out with its shape and dtype
    import torch

    from forge_aot.runtime.host_modules import exec_host_module
    from forge_aot.runtime.torch_ops import call_without_launches

    spec = {"function": "softmax_kernel", "params": [["output_ptr", "*T"], ["input_ptr", "*T"],
                                                     ["input_row_stride", "i32"], ["output_row_stride", "i32"],
                                                     ["n_rows", "i32"], ["n_cols", "i32"],
                                                     ["BLOCK_SIZE", "constexpr"], ["num_stages", "constexpr"]],
            "axes": ["T", "BLOCK_SIZE", "num_stages", "num_warps"], "dtype_args": {"T": "output_ptr"},
            "spec_params": [], "key": [], "variants": {}}
    kernel = rt.Kernel("fused_softmax", spec, {}, backend=None)
    host = parse_source(SOURCE, {"softmax"}).host_source
    from forge_aot.trace import as_target

    x = torch.empty(37, 3000, dtype=torch.float16, device="meta")
    with as_target("sm_90", tag=False):  # the host code's driver queries answered without a GPU
        module = exec_host_module("_t_fused_meta", str(SOURCE), {"softmax_kernel": kernel}, host)
        y = call_without_launches(module.softmax, x)
    assert (y.shape, y.dtype, y.device.type) == (x.shape, x.dtype, "meta")
    (handle, programs), = module.kernels.values()
    # meta tensors (no device): the placeholder's 32 registers give 8 blocks of 8 warps per SM, on 132 SMs
    assert isinstance(handle, rt.PlaceholderCompiled) and programs == 132 * 8


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(realworld):
    import forge_realworld._ops.fused_softmax as host  # the bound host module (its kernels cache, its properties)

    return realworld, host


@pytest.fixture(scope="module")
def jit():
    """The fixture file as its authors run it: under Triton's JIT."""
    return import_fixture_file(SOURCE, "_fs_jit_fused_softmax")



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", [(1823, 781), (4, 1024), (37, 4096), (5, 8192), (1, 3000), (300, 5000)])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "strided-rows"])
def test_fused_softmax_against_torch_and_the_jit(wheel, jit, dtype, shape, layout) -> None:
    import torch

    package, host = wheel
    rows, cols = shape
    x = torch.randn(rows, cols, device="cuda", dtype=torch_dtype(dtype)) * 4
    if layout == "misaligned":
        x = offset_view(x)
    elif layout == "strided-rows":  # rows 16 elements apart from their ends: stride(0) != n_cols
        x = torch.randn(rows, cols + 16, device="cuda", dtype=torch_dtype(dtype))[:, :cols] * 4
    host.kernels.clear()  # the cache is per block size only (the JIT's would reuse another dtype's binary)
    jit.kernels.clear()
    reset_handle("forge_realworld._ops.fused_softmax", "softmax_kernel")
    poison_allocator(x.numel() * x.element_size())
    y = package.softmax(x)
    torch.cuda.synchronize()
    ref = torch.softmax(x.double(), dim=-1)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert relative_error(y, ref) < TOL[dtype]
    jy = jit.softmax(x)
    block = 1 << (cols - 1).bit_length()
    (handle, programs), (compiled, jit_programs) = host.kernels[block], jit.kernels[block]
    # The grid the host code derived from the wheel's binary: the tutorial's occupancy rule over its figures.
    assert (handle.metadata.num_warps, handle.metadata.num_stages) == (8, 4 if host.SIZE_SMEM > 200000 else 2)
    occupancy = min(host.NUM_REGS // (handle.n_regs * host.WARP_SIZE * 8), host.SIZE_SMEM // handle.metadata.shared)
    assert programs == host.NUM_SM * occupancy > 0
    if layout == "contiguous" and rows > 1:
        # The specialization the JIT compiled for this call is one the build traced (the JIT also compiles the
        # single row's n_rows == 1 and the offset or strided layouts' exact alignments, which the wheel serves with
        # a more general binary): the same binary, so the same registers, shared memory, grid and bits.
        assert (handle.n_regs, handle.metadata.shared, handle.metadata.num_stages) == \
            (compiled.n_regs, compiled.metadata.shared, compiled.metadata.num_stages)
        assert programs == jit_programs
        assert torch.equal(y, jy)
    else:
        assert relative_error(y, jy.double()) < TOL[dtype]


@pytest.mark.gpu
def test_torch_compile_fullgraph_traces_the_op_and_caches_real_figures(wheel) -> None:
    # The op is a torch custom op (schema from the traced calls); its Meta implementation runs the host code on
    # fake tensors, where the warmup gives the generic binary of the device (not a placeholder): what the host
    # code caches from it serves the eager calls after.
    import torch

    package, host = wheel
    host.kernels.clear()
    x = torch.randn(300, 4000, device="cuda", dtype=torch.float16)
    compiled = torch.compile(lambda t: package.softmax(t) * 2, fullgraph=True)
    y = compiled(x)
    assert torch.equal(y, package.softmax(x) * 2)
    ((handle, programs),) = host.kernels.values()
    assert not isinstance(handle, rt.PlaceholderCompiled) and handle.n_regs > 0
    occupancy = min(host.NUM_REGS // (handle.n_regs * host.WARP_SIZE * 8), host.SIZE_SMEM // handle.metadata.shared)
    assert programs == torch.cuda.get_device_properties(0).multi_processor_count * occupancy


@pytest.mark.gpu
def test_device_properties_and_target_are_tritons(wheel) -> None:
    import triton
    import triton.runtime

    _, host = wheel
    active = triton.runtime.driver.active
    assert host.properties == active.utils.get_device_properties(0)
    got, want = host.triton.runtime.driver.active.get_current_target(), active.get_current_target()
    assert (got.backend, got.arch, got.warp_size) == (want.backend, want.arch, want.warp_size)
    assert not host.is_hip()
    assert active.get_active_torch_device() == host.DEVICE


@pytest.mark.gpu
def test_what_triton_refuses_the_wheel_refuses_by_name(wheel) -> None:
    # fp32 rows of 32000 with 4 stages need 384 KB of shared memory: Triton's JIT raises OutOfResources, the
    # build compiled no such binary, and the wheel names what it has
    import torch

    package, host = wheel
    host.kernels.clear()
    with pytest.raises(ValueError, match=r"BLOCK_SIZE=32768.*not built|combination .*BLOCK_SIZE=32768"):
        package.softmax(torch.randn(3, 32000, device="cuda", dtype=torch.float32))


@pytest.mark.gpu
def test_fresh_process_without_triton_runs_the_tutorial_host_code(realworld) -> None:  # (skips without the wheel)
    from tests.test_cold_process_gpu import NO_TRITON

    child = NO_TRITON + textwrap.dedent("""
        import torch
        import forge_realworld
        x = torch.randn(1823, 781, device="cuda")
        y = forge_realworld.softmax(x)
        err = (y.double() - torch.softmax(x.double(), -1)).abs().max().item()
        print(json.dumps({"triton": sorted(m for m in sys.modules if m.split(".")[0] == "triton"),
                          "spawned": spawned, "err": err}))
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["triton"] == [] and result["spawned"] == [] and result["err"] < 1e-6
