"""flash-linear-attention's style (tests/fixtures/realworld/kernels/l2norm.py with its project helper module
``flalike/utils.py``): the device is asked of Triton's driver and of torch at import of a helper module, and the
host code picks a tile size and num_warps by architecture and a persistent grid by SM count.

CPU: the per-target trace (the helper module imported afresh for each target) and torch's device queries as
the build answers them. GPU: the wheel against torch in fp64 and against the same files under Triton's JIT."""

from __future__ import annotations

import pytest

from tests.conftest import (
    HALF_TOL,
    REALWORLD,
    import_fixture_file,
    offset_view,
    poison_allocator,
    relative_error,
    reset_handle,
    torch_dtype,
)


def test_each_target_gets_the_tile_its_architecture_asks_for(realworld_plan) -> None:
    # BT = 32 if is_nvidia_hopper else 16 (torch.cuda.get_device_capability() at the helper's import);
    # num_warps = 8 if check_shared_mem("hopper") else 4 (Triton's driver, per call)
    plan = realworld_plan
    tiles = {t: {(e.assignment["BT"], e.assignment["num_warps"]) for e in plan.entries
                 if e.kernel == "l2norm" and e.target == t} for t in ("sm_80", "sm_90")}
    assert tiles == {"sm_80": {(16, 4)}, "sm_90": {(32, 8)}}
    heads = {(e.assignment["DT"], e.assignment["D"]) for e in plan.entries if e.kernel == "l2norm"}
    assert heads == {(dt, d) for dt in ("fp16", "bf16") for d in (64, 128, 256)}
    # the persistent kernel's grid comes from the SM count, a runtime value: the same variants for both targets
    rows = {(e.variant, e.target) for e in plan.entries if e.kernel == "l2norm_rows"}
    assert {v for v, t in rows if t == "sm_80"} == {v for v, t in rows if t == "sm_90"} and rows
    # the kernels' @triton.jit helper module (flalike.op) is no host code: not imported by it, not shipped
    assert "from flalike.op import" not in plan.modules["l2norm"]["host_source"]
    assert set(plan.modules["l2norm"]["local_sources"]) == {"flalike", "flalike.utils"}


def test_torch_device_queries_answer_as_the_target_only_inside() -> None:
    import torch

    from forge_aot.targets import TARGETS, torch_answers_as

    real = torch.cuda.get_device_capability
    with torch_answers_as("sm_90"):
        assert torch.cuda.get_device_capability() == (9, 0) and torch.cuda.current_device() == 0
        props = torch.cuda.get_device_properties(torch.device("cuda", 0))
        assert (props.multi_processor_count, props.shared_memory_per_block_optin) == (132, TARGETS["sm_90"].max_shared)
        assert "H100" in torch.cuda.get_device_name()
        with pytest.raises(AttributeError, match=r"stand-in device properties have .*multi_processor_count"):
            props.clock_rate  # noqa: B018
    with torch_answers_as("gfx942"):
        assert torch.cuda.get_device_properties().gcnArchName == "gfx942"
        assert torch.cuda.get_device_properties().warp_size == 64
        assert torch.cuda.is_available() and torch.version.hip and torch.version.cuda is None
    versions = torch.version.cuda, torch.version.hip
    with torch_answers_as("sm_80"):  # as on the GPU the wheel serves (libraries gate their queries on these)
        assert torch.cuda.is_available() and torch.version.cuda and torch.version.hip is None
    assert torch.cuda.get_device_capability is real and (torch.version.cuda, torch.version.hip) == versions


def test_host_code_gated_on_is_available_and_the_backend_traces_as_the_target(tmp_path) -> None:
    """SGLang's attention files ask ``torch.cuda.is_available()`` before the capability, and ``is_hip()``
    (``torch.version.hip``) for AMD's blocks: each target builds what that GPU's process would launch (on a
    machine without a GPU the build had taken the "no GPU" branch for every target, with no warning)."""
    import textwrap

    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        is_cuda_available = torch.cuda.is_available()
        if is_cuda_available:
            CUDA_CAPABILITY = torch.cuda.get_device_capability()
        _is_hip = torch.version.hip is not None


        @triton.jit
        def copy_kernel(X, Y, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


        def copy(x, y):
            if _is_hip:
                block = 256
            elif is_cuda_available and CUDA_CAPABILITY[0] > 8:
                block = 128
            else:
                block = 64
            copy_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)


        def examples(device):
            x = torch.empty(1000, device=device)
            copy(x, torch.empty_like(x))
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "gated"\nversion = "0.1"\ntargets = ["sm_80", "sm_90", "gfx942"]\n\n'
        '[kernels.copy]\nsource = "k.py:copy_kernel"\nops = ["copy"]\nsignature = { X = "*fp32" }\n'
        'examples = "examples"\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert {e.target: e.variant for e in plan.entries} == {"sm_80": "BLOCK=64", "sm_90": "BLOCK=128",
                                                         "gfx942": "BLOCK=256"}


def test_host_code_that_picks_waits_for_and_streams_its_device_traces(tmp_path) -> None:
    """What host code does around its launches on the GPU it answers as: Unsloth's kernels/utils.py reads every
    device's raw stream at import (keyed by ``torch.cuda.device(i).idx``), vLLM's LoRA ops set the tensors' device,
    others wait for it or launch on a stream. On a machine without a GPU these had raised (``torch._C`` without
    ``_cuda_getCurrentRawStream``, "Torch not compiled with CUDA enabled") and the build stopped."""
    import textwrap

    import torch

    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import ctypes

        import torch
        import triton
        import triton.language as tl

        DEVICE_COUNT = torch.cuda.device_count()
        _CUDA_STREAMS = {
            (index := torch.cuda.device(i).idx): ctypes.c_void_p(torch._C._cuda_getCurrentRawStream(index))
            for i in range(DEVICE_COUNT)
        }
        CUDA_STREAMS = [None] * (max(_CUDA_STREAMS.keys()) + 1)
        for k, v in _CUDA_STREAMS.items():
            CUDA_STREAMS[k] = v


        @triton.jit
        def scale_kernel(X, Y, n, s, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * s, mask=offs < n)


        def scale(x, s):
            y = torch.empty_like(x)
            torch.cuda.set_device(x.device)
            assert torch.cuda.device_of(x).idx == torch.cuda.device("cuda").idx == 0
            with torch.cuda.stream(torch.cuda.current_stream(x.device)):
                scale_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), s, BLOCK=256)
            torch.cuda.current_stream().synchronize()
            torch.cuda.synchronize()
            return y


        def examples(device):
            scale(torch.randn(1000, device=device), 0.5)
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "streams"\nversion = "0.1"\ntargets = ["sm_90"]\n\n'
        '[kernels.scale]\nsource = "k.py:scale_kernel"\nops = ["scale"]\nsignature = { X = "*fp32" }\n'
        'examples = "examples"\n')
    real = torch.cuda.synchronize
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert {e.variant for e in plan.entries} == {"BLOCK=256"}
    assert torch.cuda.synchronize is real and hasattr(torch._C, "_cuda_getCurrentRawStream") == \
        torch.backends.cuda.is_built()  # the stand-ins are gone after the trace


def test_host_codes_torch_compiled_helpers_run_eagerly_while_traced(tmp_path) -> None:
    """Cut Cross-Entropy's host code calls ``@torch.compile(fullgraph=True, dynamic=True)`` helpers around its kernels
    (``sort_logit_avg``): compiling them for the GPU the trace's tensors answer as asked CPU torch for the CUDA RNG
    state, and the examples failed. While the build traces, ``torch.compile`` gives the function back as it is."""
    import textwrap

    import torch

    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(X, Y, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


        @torch.compile(fullgraph=True, dynamic=True)
        def _order(x):
            return torch.argsort(x).to(torch.int32)


        softcap = torch.compile(lambda x, c: torch.tanh(x / c) * c)


        def scale(x):
            y = torch.empty_like(x)
            scale_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
            return softcap(y, 30.0), _order(x)


        def examples(device="cuda"):
            scale(torch.randn(1001, device=device))
    '''))
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "compiled_helpers"\nversion = "0.1"\ntargets = ["sm_90"]\n\n'
        '[kernels.scale]\nsource = "k.py:scale_kernel"\nops = ["scale"]\nexamples = "examples"\n')
    real = torch.compile
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"), ["sm_90"])
    assert plan.modules["k"]["schemas"]["scale"] == "(Tensor x) -> (Tensor, Tensor)"
    assert torch.compile is real


def test_dynamos_rules_built_during_the_trace_are_built_again_from_torchs_own_functions() -> None:
    """torch._dynamo maps torch's functions to tracing rules once, on first use, refusing one object under two names
    of different rules: a kernel file whose import reached it during the trace (bitsandbytes' int8 matmul, through
    its imports) stopped the build while two stand-ins were one function; and a map built from the stand-ins would
    not know torch's own functions afterwards."""
    import torch
    import torch._dynamo.trace_rules as rules

    from forge_aot.targets import torch_answers_as

    rules.get_torch_obj_rule_map.cache_clear()
    with torch_answers_as("sm_90"):
        assert torch.cuda.synchronize in rules.get_torch_obj_rule_map()  # the stand-in, built without a complaint
    assert rules.get_torch_obj_rule_map.cache_info().currsize == 0
    built = rules.get_torch_obj_rule_map()
    assert torch.cuda.synchronize in built and torch.cuda.get_device_capability in built


def test_a_helper_that_asks_the_device_makes_its_kernel_files_trace_per_target(tmp_path) -> None:
    from forge_aot.localmods import local_imports
    from forge_aot.plan import _helpers_ask_device

    path = REALWORLD / "kernels" / "l2norm.py"
    found = local_imports(path, REALWORLD)
    assert "flalike.utils" in found and _helpers_ask_device(found)
    assert not _helpers_ask_device(local_imports(REALWORLD / "kernels" / "layer_norm.py", REALWORLD))


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(realworld):
    return realworld


@pytest.fixture(scope="module")
def jit():
    """The fixture file as its authors run it (its helper package importable, as in its project)."""
    return import_fixture_file(REALWORLD / "kernels" / "l2norm.py", "_l2_jit_l2norm")



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(2, 1000, 64), (4096, 128), (3, 77, 256), (1, 64), (8, 1024), (5, 4096),
                                   (333, 3000)])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "transposed"])
def test_l2norm_against_torch_and_the_jit(wheel, jit, dtype, shape, layout) -> None:
    import torch

    x = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype)) * 3
    if layout == "misaligned":
        x = offset_view(x)
    elif layout == "transposed":  # input_guard makes it contiguous first, as in FLA
        x = torch.randn(tuple(reversed(shape)), device="cuda", dtype=torch_dtype(dtype)).transpose(0, -1) * 3
    reset_handle("forge_realworld._ops.l2norm", "l2norm_fwd_kernel")
    poison_allocator(x.numel() * x.element_size())
    y = wheel.l2norm(x)
    torch.cuda.synchronize()
    ref = x.double() / x.double().norm(dim=-1, keepdim=True)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert relative_error(y, ref) < HALF_TOL[dtype]
    jy = jit.l2norm(x)
    if layout != "misaligned" and shape in ((2, 1000, 64), (4096, 128), (3, 77, 256), (8, 1024), (5, 4096)):
        assert torch.equal(y, jy)  # a traced shape: the JIT's own binary
    else:
        assert relative_error(y, jy.double()) < HALF_TOL[dtype]
    if shape[-1] <= 512:
        import forge_realworld._ops.l2norm as host

        (state,) = host.l2norm_fwd_kernel._states.values()
        hopper = torch.cuda.get_device_capability()[0] >= 9
        assert (state.assignment["BT"], state.assignment["num_warps"]) == ((32, 8) if hopper else (16, 4))


@pytest.mark.gpu
def test_the_helper_module_answers_from_the_real_device(wheel) -> None:
    import forge_realworld._ops._local.flalike.utils as utils
    import torch
    import triton

    wheel.l2norm(torch.randn(4, 64, device="cuda", dtype=torch.float16))
    assert utils.is_nvidia_hopper == (torch.cuda.get_device_capability()[0] >= 9)
    assert utils.get_multiprocessor_count(0) == torch.cuda.get_device_properties(0).multi_processor_count
    assert utils.check_shared_mem("hopper") == (
        triton.runtime.driver.active.utils.get_device_properties(0)["max_shared_mem"] >= 232448)
    assert utils.triton is not triton  # the runtime's shim: Triton itself is never imported by the wheel


@pytest.mark.gpu
def test_a_head_size_that_was_not_built_is_named(wheel) -> None:
    # D is a call-site constexpr of the tiled kernel: the examples built 64, 128 and 256
    import torch

    with pytest.raises(ValueError, match=r"D=100 was not built; built values: \[64, 128, 256\]"):
        wheel.l2norm(torch.randn(3, 100, device="cuda", dtype=torch.float16))
