"""Liger-style rotary embedding (tests/fixtures/realworld/ligerlike/ops/rope.py): the kernel rotates
``q.transpose(1, 2).contiguous()`` in place, a copy for the examples' layout but the caller's own memory for the
layout Hugging Face attention passes (``proj(x).view(b, s, h, d).transpose(1, 2)``).

CPU: the op's custom op says it writes nothing (what its examples show), and the index tells the runtime what the
kernel writes through. GPU: plain calls as the file runs under Triton's JIT, bit for bit, in both layouts (in place
for Hugging Face's, as Liger does) and against torch in fp64, forward and backward; under the custom op (torch.ops,
torch.compile fullgraph) the examples' layout runs and Hugging Face's is refused before the kernel writes ``q``
(runtime/guard.py): the schema would otherwise hide the write from torch.compile."""

from __future__ import annotations

import pytest

from tests.conftest import HALF_TOL, REALWORLD, import_fixture_file, relative_error, torch_dtype

SOURCE = REALWORLD / "ligerlike" / "ops" / "rope.py"
SHAPES = ((2, 32, 8, 61, 128), (1, 12, 4, 37, 96))  # the examples': (batch, q heads, kv heads, seq, head size)


def test_the_custom_op_says_it_writes_nothing_and_the_index_what_the_kernel_writes(realworld_plan) -> None:
    (module,) = [m for m in realworld_plan.modules.values() if "liger_rotary_pos_emb" in m["ops"]]
    assert module["schemas"]["liger_rotary_pos_emb"] == ("(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? "
                                                         "position_ids=None, int unsqueeze_dim=1) -> (Tensor, Tensor)")
    assert realworld_plan.kernels["liger_rope"].spec_json()["writes"] == ["q_ptr", "k_ptr"]


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(SOURCE, "ligerlike.ops.rope")


def _inputs(dtype: str, shape: tuple[int, ...], layout: str, jit):
    """q, k as (batch, heads, seq, dim): contiguous so ("bhsd", the examples'), or Hugging Face's transposed view
    of a (batch, seq, heads, dim) projection ("hf"); cos, sin (1, seq, dim). Offset by one element in storage."""
    import torch

    b, hq, hk, s, d = shape
    dt = torch_dtype(dtype)

    def make(h):
        if layout == "bhsd":
            return torch.randn(b * h * s * d + 1, device="cuda", dtype=dt)[1:].view(b, h, s, d)
        return torch.randn(b * s * h * d + 1, device="cuda", dtype=dt)[1:].view(b, s, h, d).transpose(1, 2)

    cos, sin = jit.rope_cos_sin(s, d, "cuda", dt)
    return make(hq), make(hk), cos, sin


def _reference(q, k, cos, sin):
    """Hugging Face's apply_rotary_pos_emb, in fp64."""
    import torch

    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

    cos, sin = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    q, k = q.double(), k.double()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["bhsd", "hf"])
def test_plain_calls_run_as_the_file_does_under_the_jit(realworld, jit, dtype, shape, layout) -> None:
    import torch

    q0, k0, cos, sin = _inputs(dtype, shape, layout, jit)
    gq, gk = torch.randn_like(q0), torch.randn_like(k0)
    tol = HALF_TOL.get(dtype, 1e-5)
    results = {}
    for name, module in (("wheel", realworld), ("jit", jit)):
        q_in, k_in = q0.clone(memory_format=torch.preserve_format), k0.clone(memory_format=torch.preserve_format)
        assert q_in.stride() == q0.stride()
        q, k = module.liger_rotary_pos_emb(q_in, k_in, cos, sin)
        torch.cuda.synchronize()
        results[name] = (q, k, q_in, k_in)
    q, k, q_in, k_in = results["wheel"]
    ref_q, ref_k = _reference(q0, k0, cos, sin)
    assert relative_error(q, ref_q) < tol and relative_error(k, ref_k) < tol
    # Hugging Face's layout: rotated in place (q is a view of the caller's q), as Liger does; the examples': a copy
    if layout == "hf":
        assert q.data_ptr() == q_in.data_ptr() and torch.equal(q_in, q)
    else:
        assert torch.equal(q_in, q0) and torch.equal(k_in, k0)
    for mine, theirs in zip(results["wheel"], results["jit"]):
        assert torch.equal(mine, theirs)  # the same specialization compiled: the same bits
    # the backward rotates the gradient back
    qg, kg = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    q, k = realworld.liger_rotary_pos_emb(qg, kg, cos, sin)
    ((q * gq).sum() + (k * gk).sum()).backward()
    rq, rk = (t.detach().double().requires_grad_() for t in (q0, k0))
    ref_q, ref_k = _reference(rq, rk, cos, sin)
    ((ref_q * gq.double()).sum() + (ref_k * gk.double()).sum()).backward()
    assert relative_error(qg.grad, rq.grad) < tol and relative_error(kg.grad, rk.grad) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_the_custom_op_refuses_the_write_its_schema_denies_before_the_kernel_runs(realworld, jit, shape) -> None:
    import torch
    from forge_realworld._runtime.errors import ForgeRuntimeError

    op = torch.ops.forge_realworld.liger_rotary_pos_emb
    q, k, cos, sin = _inputs("bf16", shape, "bhsd", jit)
    q_before, k_before = q.clone(), k.clone()
    out_q, out_k = op(q, k, cos, sin)
    plain_q, plain_k = realworld.liger_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(out_q, plain_q) and torch.equal(out_k, plain_k)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)
    q, k, cos, sin = _inputs("bf16", shape, "hf", jit)
    q_before, k_before = q.clone(), k.clone()
    with pytest.raises(ForgeRuntimeError, match=r"forge_realworld\.liger_rotary_pos_emb: kernel _triton_rope would "
                                                r"write argument q \(through its parameter q_ptr\).*nothing was "
                                                r"launched"):
        op(q, k, cos, sin)
    torch.cuda.synchronize()
    assert torch.equal(q, q_before) and torch.equal(k, k_before)  # nothing written


@pytest.mark.gpu
def test_torch_compile_fullgraph_runs_the_safe_layout_and_stops_the_hidden_write(realworld, jit) -> None:
    import torch

    b, hq, hk, s, d = SHAPES[0]

    def attention_inputs(x_q, x_k, cos, sin):
        # Hugging Face's attention: the projections viewed as (batch, seq, heads, dim), then transposed
        q = x_q.view(b, s, hq, d).transpose(1, 2)
        k = x_k.view(b, s, hk, d).transpose(1, 2)
        q, k = realworld.liger_rotary_pos_emb(q, k, cos, sin)
        return q * 2, k * 2

    def contiguous_inputs(q, k, cos, sin):
        q, k = realworld.liger_rotary_pos_emb(q, k, cos, sin)
        return q * 2, k * 2

    torch._dynamo.reset()
    with torch.no_grad():
        q, k, cos, sin = _inputs("bf16", SHAPES[0], "bhsd", jit)
        compiled = torch.compile(contiguous_inputs, fullgraph=True)
        got, want = compiled(q, k, cos, sin), contiguous_inputs(q.clone(), k.clone(), cos, sin)
        assert all(torch.equal(a, w) for a, w in zip(got, want))
        x_q = torch.randn(b, s, hq * d, device="cuda", dtype=torch.bfloat16)
        x_k = torch.randn(b, s, hk * d, device="cuda", dtype=torch.bfloat16)
        before = x_q.clone()
        with pytest.raises(Exception, match=r"would write argument q \(through its parameter q_ptr\)"):
            torch.compile(attention_inputs, fullgraph=True)(x_q, x_k, cos, sin)
        torch.cuda.synchronize()
        assert torch.equal(x_q, before)
