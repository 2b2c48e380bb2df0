"""vLLM-style FP8 quantization (tests/fixtures/realworld/kernels/fp8_quant.py): the FP8 format is a torch dtype
the caller picks, ``y_q_ptr.dtype.element_ty`` in the kernel, float ranges from ``torch.finfo`` as arguments,
a ``use_ue8m0`` constexpr flag, ``@triton.jit(do_not_specialize=...)``, and kernels built for sm_90 only.

CPU: the plan's variants, the custom op's schema with a dtype argument, the non-specialized count, the targets.
GPU: the wheel against a torch reference and against the same file under Triton's JIT (bit for bit)."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, offset_view, poison_allocator, reset_handle, torch_dtype


def test_formats_come_from_the_callers_dtype_and_build_for_sm90_only(realworld_plan) -> None:
    plan = realworld_plan
    group = [e for e in plan.entries if e.kernel == "fp8_group_quant"]
    assert {e.target for e in group} == {"sm_90"}  # e4m3 needs sm_89+: the kernel's own targets
    # T the input, Q the output format (the dtype argument), use_ue8m0 a call-site constexpr
    combos = {(e.assignment["T"], e.assignment["Q"], e.assignment["use_ue8m0"]) for e in group}
    assert combos == {(t, q, u) for t in ("bf16", "fp16") for q, u in (("fp8e4nv", False), ("fp8e4nv", True),
                                                                       ("fp8e5", False))}
    assert {(e.assignment["BLOCK"], e.assignment["num_warps"], e.assignment["num_stages"]) for e in group} == \
        {(128, 1, 1)}
    assert {e.target for e in plan.entries if e.kernel == "fp8_static_quant"} == {"sm_90"}


def test_a_dtype_argument_makes_a_schema_and_do_not_specialize_is_kept(realworld_plan) -> None:
    schemas = realworld_plan.modules["fp8_quant"]["schemas"]
    assert schemas["per_token_group_quant_fp8"] == (
        "(Tensor x, SymInt group_size, float eps=1e-10, ScalarType? dtype=None, bool use_ue8m0=False) "
        "-> (Tensor, Tensor)")
    # no return annotation: the schema comes from the traced calls, the dtype default in the parser's spelling
    assert schemas["static_scaled_fp8_quant"] == (
        "(Tensor x, Tensor scale, ScalarType dtype=float8_e4m3fn) -> Tensor")
    import torch

    torch._C.parse_schema("static_scaled_fp8_quant" + schemas["static_scaled_fp8_quant"])
    from forge_aot.sourcesplit import parse_source

    src = parse_source(REALWORLD / "kernels" / "fp8_quant.py")
    assert src.kernels["_static_scaled_fp8_quant"].do_not_specialize == ("n_elements",)
    specs = {c.spec for e in realworld_plan.entries if e.kernel == "fp8_static_quant"
             for calls in e.calls.values() for c in calls}
    # the three pointers only: n_elements (4096 * 1000 is divisible by 16) is not specialized, as under the JIT
    assert specs == {"DDD"}, specs


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "fp8_quant.py", "_fp8_jit_fp8_quant")


def _needs_fp8() -> None:
    import torch

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wheel builds the FP8 kernels for sm_90 only")


def _reference(x, group_size: int, dtype, ue8m0: bool):
    import torch

    finfo = torch.finfo(dtype)
    groups = x.float().reshape(*x.shape[:-1], -1, group_size)
    scale = groups.abs().amax(dim=-1).clamp_min(1e-10) / finfo.max
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (groups / scale[..., None]).clamp(finfo.min, finfo.max)
    return q.reshape(x.shape), scale


TRACED = {(1, 7168), (33, 7168), (256, 2048), (7, 1536)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e4m3-ue8m0", "e5m2"])
@pytest.mark.parametrize("shape", [(1, 7168), (33, 7168), (256, 2048), (7, 1536), (5, 384), (1000, 896)])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
def test_group_quant_against_torch_and_the_jit(realworld, jit, dtype, fmt, shape, layout) -> None:
    import torch

    _needs_fp8()
    x = torch.randn(shape, device="cuda", dtype=torch_dtype(dtype)) * 5
    if layout == "misaligned":
        x = offset_view(x)
    q_dtype = torch.float8_e5m2 if fmt == "e5m2" else torch.float8_e4m3fn
    ue8m0 = fmt == "e4m3-ue8m0"
    reset_handle("forge_realworld._ops.fp8_quant", "_per_token_group_quant_fp8")
    poison_allocator(x.numel() * 4)
    x_q, x_s = realworld.per_token_group_quant_fp8(x, 128, dtype=q_dtype, use_ue8m0=ue8m0)
    torch.cuda.synchronize()
    assert x_q.dtype == q_dtype and x_q.shape == x.shape and x_s.shape == (shape[0], shape[1] // 128)
    ref_q, ref_s = _reference(x, 128, q_dtype, ue8m0)
    torch.testing.assert_close(x_s, ref_s, rtol=1e-6, atol=0)
    if ue8m0:
        assert torch.equal(torch.exp2(torch.log2(x_s).round()), x_s)  # powers of two
    # Each value is the reference rounded to the format: within one FP8 step (fp32 division may round the other
    # way at a tie), and most exactly.
    exact = (x_q.float() == ref_q.to(q_dtype).float()).float().mean().item()
    assert exact > 0.999, exact
    # one step: 2^-3 (e4m3) or 2^-2 (e5m2) of the value, and the subnormals' fixed spacing near zero
    step, spacing = (2.0 ** -3, 2.0 ** -9) if q_dtype == torch.float8_e4m3fn else (2.0 ** -2, 2.0 ** -16)
    assert ((x_q.float() - ref_q).abs() <= ref_q.abs() * step + spacing).all()
    j_q, j_s = jit.per_token_group_quant_fp8(x, 128, dtype=q_dtype, use_ue8m0=ue8m0)
    assert torch.equal(x_q.view(torch.uint8), j_q.view(torch.uint8)) and torch.equal(x_s, j_s)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4097 * 1000, 4096 * 1000, 12345, 1, 1 << 20])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
def test_static_quant_takes_any_count_with_one_binary(realworld, jit, n, layout) -> None:
    import torch

    _needs_fp8()
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 100
    if layout == "misaligned":
        x = offset_view(x)
    scale = torch.tensor([0.37], device="cuda", dtype=torch.float32)
    out = realworld.static_scaled_fp8_quant(x, scale)
    ref = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    exact = (out.view(torch.uint8) == ref.view(torch.uint8)).float().mean().item()
    assert exact > 0.999, exact  # x * (1 / scale) in the kernel, x / scale in the reference
    assert torch.equal(out.view(torch.uint8), jit.static_scaled_fp8_quant(x, scale).view(torch.uint8))


@pytest.mark.gpu
def test_the_custom_op_quantizes_under_torch_compile(realworld) -> None:
    import torch

    _needs_fp8()
    op = torch.ops.forge_realworld.per_token_group_quant_fp8
    x = torch.randn(9, 1536, device="cuda", dtype=torch.bfloat16)
    eager_q, eager_s = realworld.per_token_group_quant_fp8(x, 128)
    compiled = torch.compile(lambda t: op(t, 128, dtype=torch.float8_e4m3fn), fullgraph=True)
    q, s = compiled(x)
    assert torch.equal(q.view(torch.uint8), eager_q.view(torch.uint8)) and torch.equal(s, eager_s)
