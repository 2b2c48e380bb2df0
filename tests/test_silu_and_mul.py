"""SiLU-and-mul in serving engines' style (tests/fixtures/realworld/kernels/silu_and_mul.py): a module-level
``tl.constexpr`` block size read by the kernel's default and by the host grid, ``tl.static_assert``, inline PTX
(``tl.inline_asm_elementwise``), and the host function a ``@torch.library.custom_op`` with a fake.

CPU: the host module binds the block size as a plain value (the build had refused host code reading a global
defined with Triton), the kernel's default is that value, the op's schema is the custom op's own, and a real sm_80
and sm_90 compile takes the inline PTX. GPU: against an fp64 reference and bit for bit against the file under
Triton's JIT for decode and prefill token counts, odd widths and unaligned rows; torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, offset_view, poison_allocator, torch_dtype

TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3}
"""Relative error against fp64 (computed in fp32 with ex2.approx, stored in the tensors' dtype)."""


def test_the_host_module_binds_the_block_size_as_a_plain_value() -> None:
    import ast

    from forge_aot.sourcesplit import parse_source

    src = parse_source(REALWORLD / "kernels" / "silu_and_mul.py", {"silu_and_mul"})
    host = src.host_source.splitlines()
    # the value, with the .value a tl.constexpr object has (host code may read it either way)
    assert "BLOCK_SIZE = triton._host_constexpr(1024)" in host
    assert "LOG2E = triton._host_constexpr(1.4426950408889634)" in host
    code = ast.parse(src.host_source)
    assert not [n for n in ast.walk(code) if isinstance(n, ast.Name) and n.id == "tl"]  # no Triton where it runs
    assert "@triton.jit" not in src.host_source
    (block,) = [p for p in src.kernels["_silu_and_mul_kernel"].params if p.name == "BLOCK"]
    assert block.constexpr and block.default == 1024


def test_the_plan_takes_the_custom_ops_schema_and_the_default_block(realworld_plan) -> None:
    entries = [e for e in realworld_plan.entries if e.kernel == "silu_and_mul"]
    assert {(e.target, e.assignment["T"], e.assignment["BLOCK"]) for e in entries} == {
        (t, dt, 1024) for t in ("sm_80", "sm_90") for dt in ("bf16", "fp16")}
    schema = realworld_plan.modules["silu_and_mul"]["schemas"]["silu_and_mul"]
    assert schema == "(Tensor x) -> Tensor", schema


@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
def test_the_inline_ptx_compiles_for_each_cuda_target(realworld_plan, tmp_path, target) -> None:
    from forge_aot import targets
    from forge_aot._compile_worker import compile_one
    from forge_aot.plan import job_for

    entry = next(e for e in realworld_plan.entries if e.kernel == "silu_and_mul" and e.target == target)
    (rows,) = entry.tables.values()
    binary = min(realworld_plan.binaries_for(entry, rows[0].key, rows[0].preferences[0]), key=lambda b: b.spec)
    job = job_for(realworld_plan, entry, rows[0].preferences[0], binary)
    t = targets.TARGETS[target]
    payload = {**job.to_json(), "binary_stem": job.binary_stem, "out_dir": str(tmp_path),
               "source": str(REALWORLD / job.source),
               "target_info": {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}}
    assert compile_one(payload)["ok"]
    cubin = (tmp_path / f"{job.binary_stem}.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"_silu_and_mul_kernel" in cubin


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "silu_and_mul.py", "_silu_and_mul_jit")


def _reference(x):
    import torch

    d = x.shape[-1] // 2
    gate, up = x[..., :d].double(), x[..., d:].double()
    return gate * torch.sigmoid(gate) * up


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(("tokens", "d"), [(1, 14336), (512, 14336), (33, 11008), (7, 1000), (3, 1), (5, 1025)])
@pytest.mark.parametrize("aligned", [True, False])
def test_silu_and_mul_against_fp64_and_the_jit(realworld, jit, dtype, tokens, d, aligned) -> None:
    import torch

    x = torch.randn(tokens, 2 * d, device="cuda", dtype=torch_dtype(dtype)) * 3
    if not aligned:
        x = offset_view(x)  # every row 2 bytes past a 16-byte boundary
    poison_allocator(tokens * d * 2)
    out = realworld.silu_and_mul(x)
    same = jit.silu_and_mul(x)
    torch.cuda.synchronize()
    ref = _reference(x)
    assert out.shape == (tokens, d) and out.dtype == x.dtype
    err = float((out.double() - ref).norm() / ref.norm())
    assert err <= TOLERANCE[dtype], err
    # element by element, the same operations whatever the binary's vector width: bit for bit, unaligned too
    assert torch.equal(out, same)


@pytest.mark.gpu
def test_the_custom_op_under_torch_compile(realworld) -> None:
    import torch

    x = torch.randn(4, 2, 2 * 11008, device="cuda", dtype=torch.bfloat16)
    eager = realworld.silu_and_mul(x)
    assert eager.shape == (4, 2, 11008)
    compiled = torch.compile(lambda t: realworld.silu_and_mul(t) + 1, fullgraph=True)
    assert torch.equal(compiled(x), eager + 1)
    assert torch.equal(torch.ops.forge_realworld.silu_and_mul(x), eager)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_out_variant_writes_the_callers_tensor_eager_and_compiled(realworld, dtype) -> None:
    """vLLM's convention, ``silu_and_mul_out(out, x)``: a mutating custom op (``Tensor(a!) out -> ()``); eager and
    under torch.compile(fullgraph=True) the caller's ``out`` holds the result, equal to the functional op's."""
    import torch

    x = torch.randn(33, 2 * 11008, device="cuda", dtype=torch_dtype(dtype))
    expected = realworld.silu_and_mul(x)
    out = torch.full((33, 11008), float("nan"), device="cuda", dtype=x.dtype)
    assert realworld.silu_and_mul_out(out, x) is None
    assert torch.equal(out, expected)

    def step(o, t):
        realworld.silu_and_mul_out(o, t)
        return o * 2

    out2 = torch.full_like(out, float("nan"))
    doubled = torch.compile(step, fullgraph=True)(out2, x)
    assert torch.equal(out2, expected) and torch.equal(doubled, expected * 2)
    out3 = torch.full_like(out, float("nan"))
    torch.ops.forge_realworld.silu_and_mul_out(out3, x)
    assert torch.equal(out3, expected)
