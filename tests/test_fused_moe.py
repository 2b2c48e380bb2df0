"""vLLM-style fused MoE (tests/fixtures/realworld/kernels/fused_moe.py): ``compute_type`` passed as a Triton element
type (``tl.bfloat16``) from host code, the launch config spread as ``**config``, quantization flags as constexprs
with ``None`` scales, weight-only int8 with per-channel scales, B's unit K stride.

CPU: the host code keeps ``tl.<type>`` (and nothing else of ``triton.language``), the plan's variants, the
runtime's element types against Triton's. GPU: the wheel against an fp32 torch reference and against the same
file under Triton's JIT (bit for bit), odd token counts, unaligned sizes and pointers, torch.compile."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import REALWORLD, import_fixture_file, offset_view, poison_allocator, relative_error, torch_dtype

FILE = REALWORLD / "kernels" / "fused_moe.py"


def test_host_code_keeps_triton_element_types_and_nothing_else_of_triton_language() -> None:
    from forge_aot.sourcesplit import parse_source

    src = parse_source(FILE, {"fused_moe", "fused_moe_int8"})
    host = src.host_source.split("\n")
    original = FILE.read_text().split("\n")
    assert len(host) == len(original)  # line for line
    line = original.index("import triton.language as tl")
    assert host[line] == "tl = triton.language"  # the runtime's element types
    assert "compute_type = tl.bfloat16 if hidden_states.dtype == torch.bfloat16 else tl.float16" in src.host_source
    assert "@triton.jit" not in src.host_source and "tl.dot" not in src.host_source


@pytest.mark.parametrize("use, message", [
    ("tl.arange(0, 4)", "host code uses 'tl' (of triton.language, host code may use only its element types"),
    ("tl.constexpr(4)", "host code uses 'tl' (of triton.language"),
    ("triton.language.arange(0, 4)", "host code uses triton.language"),
])
def test_other_triton_language_names_in_host_code_are_refused(tmp_path: Path, use: str, message: str) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.sourcesplit import parse_source

    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent(f"""
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def k(x_ptr, T: tl.constexpr):
            tl.store(x_ptr, tl.zeros((1,), dtype=T))

        def op(x):
            v = {use}
            k[(1,)](x, T=tl.float32)
            return x
        """))
    with pytest.raises(SourceError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_source(path, {"op"})


def test_element_types_from_either_spelling(tmp_path: Path) -> None:
    from forge_aot.sourcesplit import parse_source

    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent("""
        import torch
        import triton
        from triton import language as language

        ACC = {torch.float16: language.float32, torch.bfloat16: triton.language.float32}

        @triton.jit
        def k(x_ptr, T: language.constexpr):
            language.store(x_ptr, language.zeros((1,), dtype=T))

        def op(x):
            k[(1,)](x, T=ACC[x.dtype])
            return x
        """))
    host = parse_source(path, {"op"}).host_source
    assert "language = triton.language\n" in host and "ACC = {" in host


TINY_KERNEL = '''\
import torch
import triton
import triton.language as tl

OUT_TYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, s, BLOCK: tl.constexpr, OUT: tl.constexpr, ACC: tl.constexpr = tl.float32):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, (tl.load(x_ptr + offs, mask=mask).to(ACC) * s).to(OUT), mask=mask)


def scale(x: torch.Tensor, s: float) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    out_type = OUT_TYPES[x.dtype]
    assert out_type.primitive_bitwidth == 16 and out_type.is_floating() and repr(out_type).startswith("triton.language")
    scale_kernel[(triton.cdiv(n, 1024),)](x, out, n, s, BLOCK=1024, OUT=out_type)
    return out


def examples(device="cpu"):
    for dtype in (torch.float16, torch.bfloat16):
        scale(torch.randn(3000, device=device, dtype=dtype), 0.5)
'''


@pytest.mark.slow
def test_element_type_constexprs_build_and_run_from_the_wheel(tmp_path: Path) -> None:
    """A tiny project built for real (cross-compiled for sm_90): each traced element type is a build variant, a
    kernel default ``tl.float32`` reaches the compiler as Triton's type, and in a fresh process with neither
    Triton nor forge-aot importable the host code's ``tl.bfloat16`` selects the variant the index recorded."""
    from tests.test_localmods import _installed, _run_fresh

    root = tmp_path / "project"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "scale.py").write_text(TINY_KERNEL)
    (root / "kernel_manifest.toml").write_text(textwrap.dedent("""\
        [project]
        name = "forge_eltypes"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.scale]
        source = "kernels/scale.py:scale_kernel"
        ops = ["scale"]
        signature = { x_ptr = "*T", out_ptr = "*T", n = "i32", s = "fp32" }
        dtypes = { T = ["fp16", "bf16"] }
        examples = "examples"
        """))
    target = _installed(root / "kernel_manifest.toml", tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["forge_aot"] = None
        import torch, forge_eltypes
        from forge_eltypes._runtime.kernel import LAUNCHES
        import forge_eltypes._ops.scale as host
        LAUNCHES.skip = True  # bind, launch nothing: there is no GPU here
        out = host.scale(torch.empty(10, dtype=torch.bfloat16), 2.0)
        LAUNCHES.skip = False
        kernel = host.scale_kernel
        x = torch.empty(1, dtype=torch.bfloat16)
        runtime, call = kernel._bind((x, x, 10, 2.0), {"BLOCK": 1024, "OUT": host.tl.bfloat16})
        found = kernel.find_variant(kernel.axis_values(runtime, call))
        print(json.dumps({"variants": sorted(kernel.variants), "found": found[0], "tl": repr(host.tl.float16),
                          "default": repr(call["ACC"])}))
        ''')
    res = _run_fresh(code, target)
    assert res["variants"] == ["T=bf16,BLOCK=1024,OUT=tl.bfloat16,ACC=tl.float32",
                               "T=fp16,BLOCK=1024,OUT=tl.float16,ACC=tl.float32"]
    assert res["found"] == "T=bf16,BLOCK=1024,OUT=tl.bfloat16,ACC=tl.float32"
    assert res["tl"] == "triton.language.float16" and res["default"] == "'tl.float32'"  # the index's text


def test_runtime_element_types_match_tritons() -> None:
    import triton.language as tl

    from forge_aot.introspect import as_host_value, host_dtype
    from forge_aot.runtime.host_triton import HOST_DTYPES, host_triton

    shim = host_triton.language
    for attr in HOST_DTYPES:
        ours, theirs = getattr(shim, attr), getattr(tl, attr)
        assert (ours.name, ours.primitive_bitwidth, repr(ours)) == (theirs.name, theirs.primitive_bitwidth,
                                                                    repr(theirs))
        assert ours.is_floating() == theirs.is_floating() and ours.is_fp8() == theirs.is_fp8()
        assert ours.is_bf16() == theirs.is_bf16() and ours.is_fp16() == theirs.is_fp16()
        assert ours.is_int() == theirs.is_int() and ours.is_fp32() == theirs.is_fp32()
        assert as_host_value(theirs) == ours and type(as_host_value(theirs)) is type(ours)
        assert isinstance(ours, shim.dtype)
        # what the index and manifests write, and what the compile step hands Triton
        assert ours == f"tl.{attr}" and host_dtype(ours) is theirs and host_dtype(f"tl.{attr}") is theirs
    assert {shim.float16: 1}[shim.float16] == 1 and shim.float16 != shim.bfloat16
    assert host_dtype("tl.arange") == "tl.arange" and host_dtype(3) == 3
    with pytest.raises(AttributeError, match="element types"):
        shim.arange  # noqa: B018


def test_the_plan_builds_each_traced_compute_type(realworld_plan) -> None:
    group = [e for e in realworld_plan.entries if e.kernel == "fused_moe"]
    assert {e.target for e in group} == {"sm_80", "sm_90"}
    combos = {(e.assignment["T"], e.assignment["W"], e.assignment["compute_type"], e.assignment["top_k"],
               e.assignment["MUL_ROUTED_WEIGHT"], e.assignment["use_int8_w8a16"]) for e in group}
    gemms = {(2, False), (1, True)}  # the first GEMM (top_k = 2, no router weight), the second
    assert combos == {(t, t, f"tl.{name}", k, m, False) for t, name in (("bf16", "bfloat16"), ("fp16", "float16"))
                      for k, m in gemms} | {("bf16", "i8", "tl.bfloat16", k, m, True) for k, m in gemms}
    assert any("compute_type=tl.bfloat16" in e.variant for e in group)
    # the config the host code spreads: vLLM's two defaults, by batch size against the expert count
    assert {(e.assignment["BLOCK_SIZE_M"], e.assignment["BLOCK_SIZE_N"], e.assignment["BLOCK_SIZE_K"],
             e.assignment["GROUP_SIZE_M"]) for e in group} == {(16, 32, 64, 1), (64, 64, 32, 8)}
    # B is [E, N, K] contiguous: its K stride is 1 in every call, which the JIT specializes (and so the build)
    params = realworld_plan.kernels["fused_moe"].spec_params
    specs = {c.spec for e in group for calls in e.calls.values() for c in calls}
    assert {s[params.index("stride_bk")] for s in specs} == {"1"}
    assert {s[params.index("a_scale_ptr")] for s in specs} == {"N"}  # None in every call


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(FILE, "_fused_moe_jit")


TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("M, E, H, inter, topk", [
    (1, 8, 256, 192, 2), (3, 8, 256, 192, 2), (8, 8, 256, 192, 2), (33, 8, 256, 192, 2), (200, 8, 256, 192, 2),
    (257, 8, 256, 192, 2), (9, 16, 384, 128, 2), (100, 8, 200, 100, 2), (77, 16, 256, 192, 2)])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
def test_fused_moe_against_torch_and_the_jit(realworld, jit, dtype, M, E, H, inter, topk, layout) -> None:
    import torch

    x, w1, w2, gating = jit.make_inputs(M, E, H, inter, topk, torch_dtype(dtype), "cuda", seed=M + H)
    if layout == "misaligned":
        x = offset_view(x)  # the activations' pointer not 16-byte aligned
    poison_allocator(M * topk * 2 * inter * 2)
    out = realworld.fused_moe(x, w1, w2, gating, topk)
    torch.cuda.synchronize()
    assert out.shape == x.shape and out.dtype == x.dtype and not out.isnan().any()
    ref = jit.reference(x, w1, w2, gating, topk)
    assert relative_error(out, ref) < TOLERANCE[dtype]
    assert torch.equal(out, jit.fused_moe(x, w1, w2, gating, topk))


@pytest.mark.gpu
def test_a_top_k_no_example_traced_is_refused_before_any_launch(realworld, jit) -> None:
    """top_k is a constexpr: each value is a build. The examples trace vLLM's top-2 (and 1 for the second GEMM), so
    a top-4 call names what was built instead of launching a binary compiled for another top_k."""
    import torch

    x, w1, w2, gating = jit.make_inputs(9, 16, 256, 192, 4, torch.bfloat16, "cuda")
    with pytest.raises(realworld._runtime.NotBuiltError, match=r"constexpr top_k=4 was not built; built values: "
                                                                r"\[1, 2\]"):
        realworld.fused_moe(x, w1, w2, gating, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 50, 200, 301])
def test_weight_only_int8_against_torch_and_the_jit(realworld, jit, M) -> None:
    import torch

    x, w1, w2, s1, s2, gating = jit.make_inputs(M, 8, 256, 192, 2, torch.bfloat16, "cuda", int8=True, seed=M)
    poison_allocator(M * 2 * 2 * 192 * 2)
    out = realworld.fused_moe_int8(x, w1, w2, s1, s2, gating, 2)
    torch.cuda.synchronize()
    ref = jit.reference(x, w1, w2, gating, 2, w1_scale=s1, w2_scale=s2)
    assert relative_error(out, ref) < TOLERANCE["bf16"]
    assert torch.equal(out, jit.fused_moe_int8(x, w1, w2, s1, s2, gating, 2))


@pytest.mark.gpu
def test_fused_moe_under_torch_compile(realworld, jit) -> None:
    import torch

    x, w1, w2, gating = jit.make_inputs(40, 8, 256, 192, 2, torch.bfloat16, "cuda", seed=1)
    eager = realworld.fused_moe(x, w1, w2, gating, 2)
    compiled = torch.compile(lambda *a: torch.ops.forge_realworld.fused_moe(*a, 2), fullgraph=True)
    assert torch.equal(compiled(x, w1, w2, gating), eager)
