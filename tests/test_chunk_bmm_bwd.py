"""Mamba-2's chunked B gradient in mamba_ssm's ``_bmm_chunk_bwd(a, dout, residual=None, out=None)`` style
(tests/fixtures/realworld/kernels/chunk_bmm_bwd.py): an output buffer every example leaves None.

A caller's ``out`` is written and returned, which no custom op may do, so the schema leaves the buffer out: calls
without one (every call the examples make, and mamba's own in its chunk scan) are one custom op under
torch.compile(fullgraph=True); a call passing one runs as Python, as before (it had cost the op its custom op).

CPU: the schema and the buffer's place, the calls the exported op hands its custom op, the custom op's
implementations given the host function's arguments back (positions after the buffer included), torch.compile over
meta tensors, and a backward refused for such an op. GPU: fp64 reference on odd lengths and misaligned tensors,
with and without the residual and groups, the caller's ``out`` written and returned, torch.compile(fullgraph=True)
bit for bit against eager, and a compiled call passing ``out``."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from tests.conftest import REALWORLD, offset_view, poison_allocator

SCHEMA = "(Tensor a, Tensor dout, Tensor? residual=None) -> Tensor"


def test_the_output_buffer_is_left_out_of_the_schema(realworld_plan) -> None:
    mod = realworld_plan.modules["chunk_bmm_bwd"]
    assert mod["schemas"]["_chunk_bmm_bwd"] == SCHEMA
    assert mod["buffers"] == {"_chunk_bmm_bwd": [["out", 3]]}
    assert "without its output buffer out" in mod["schema_notes"]["_chunk_bmm_bwd"]


def test_the_calls_the_custom_op_takes_and_gives_back() -> None:
    """``exports.custom_call``: the arguments the schema leaves out taken out where they are None (by position or by
    name), the call left to Python where one is a tensor; ``custom_ops._with_left_out``: None back in their places
    for the host function."""
    from forge_aot.runtime.custom_ops import _with_left_out
    from forge_aot.runtime.exports import custom_call

    def without(left_out, args, kwargs):
        return custom_call(("m", "(...)", None, None, left_out), args, kwargs)

    out = (("out", 3),)
    assert without(out, ("a", "d"), {}) == (("a", "d"), {})
    assert without(out, ("a", "d", "r", None), {}) == (("a", "d", "r"), {})
    assert without(out, ("a", "d"), {"out": None, "residual": "r"}) == (("a", "d"), {"residual": "r"})
    assert without(out, ("a", "d", None, "o"), {}) is None
    assert without(out, ("a", "d"), {"out": "o"}) is None
    middle = (("out", 1),)  # a buffer before other positional parameters: f(x, out=None, scale=1.0)
    assert without(middle, ("x", None, 2.0), {}) == (("x", 2.0), {})
    assert _with_left_out(middle, ("x", 2.0), {}) == (("x", None, 2.0), {})
    # where no later argument comes by position it comes last (a required one: vLLM's q_descale, session 42)
    assert _with_left_out(middle, ("x",), {}) == (("x", None), {})
    assert _with_left_out(middle, (), {"x": 1}) == ((), {"x": 1})  # (a call by name: the host's default stands)
    # two left out (TransformerEngine's dbias=None, dscales=None): f(x, a=None, scale=1.0, b=None)
    two = (("a", 1), ("b", 3))
    assert without(two, ("x", None, 2.0, None), {}) == (("x", 2.0), {})
    assert without(two, ("x", None, 2.0), {"b": None}) == (("x", 2.0), {})
    assert without(two, ("x",), {"scale": 2.0}) == (("x",), {"scale": 2.0})
    assert without(two, ("x", None, 2.0, "t"), {}) is None
    assert without(two, ("x", "t"), {}) is None
    assert _with_left_out(two, ("x", 2.0), {}) == (("x", None, 2.0, None), {})
    assert _with_left_out(two, ("x",), {"scale": 2.0}) == (("x", None), {"scale": 2.0})
    assert _with_left_out((("a", 1), ("b", -1)), ("x", 2.0), {}) == (("x", None, 2.0), {"b": None})
    # a host function's **kwargs left out of the schema (FLA's public ops): a call passing more runs as Python
    takes = ("m", "(...)", None, None, None, (2, ("q", "k", "scale")))
    assert custom_call(takes, ("q", "k"), {"scale": 0.5}) == (("q", "k"), {"scale": 0.5})
    assert custom_call(takes, ("q", "k"), {"chunk_size": 64}) is None
    assert custom_call(takes, ("q", "k", 0.5), {}) is None
    assert _with_left_out((("out", -1),), ("x", 2.0), {}) == (("x", 2.0), {"out": None})  # keyword-only: by name
    assert _with_left_out((("out", -1),), ("x",), {"out": None}) == (("x",), {"out": None})
    assert _with_left_out(None, ("x",), {}) == (("x",), {})


def _project(tmp_path, extra: str = ""):
    root = tmp_path / "proj"
    (root / "kernels").mkdir(parents=True)
    shutil.copy(REALWORLD / "kernels" / "chunk_bmm_bwd.py", root / "kernels")
    (root / "kernels" / "chunk_bmm_bwd.py").write_text((root / "kernels" / "chunk_bmm_bwd.py").read_text() + extra)
    (root / "kernel_manifest.toml").write_text(textwrap.dedent('''\
        [project]
        name = "forge_test_out_buffer"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.chunk_bmm_bwd]
        source = "kernels/chunk_bmm_bwd.py:_chunk_bmm_bwd_kernel"
        ops = ["_chunk_bmm_bwd"]
        signature = { a_ptr = "*T", dout_ptr = "*T", db_ptr = "*T", res_ptr = "*T" }
        dtypes = { T = ["fp16", "bf16"] }
        examples = "examples"
    '''))
    return root


def test_the_custom_op_runs_the_host_code_and_compiles_fullgraph_without_the_buffer(tmp_path) -> None:
    """On meta tensors (no kernel runs): ``torch.ops.<ns>._chunk_bmm_bwd`` takes the schema's arguments, the
    residual by position too (the host function gets it where it takes it); torch.compile(fullgraph=True) traces
    calls leaving ``out`` None, by default, by name or by position, as the one custom op; a call passing ``out``
    runs the host code, which Dynamo cannot trace whole, so fullgraph=True says so."""
    import torch

    from tests.test_torch_ops import _ops

    _, ops = _ops(_project(tmp_path) / "kernel_manifest.toml", "forge_test_out_buffer")
    a = torch.empty(2, 300, 48, device="meta", dtype=torch.float16)
    dout = torch.empty(2, 5, 64, 64, device="meta", dtype=torch.float16)
    op = torch.ops.forge_test_out_buffer._chunk_bmm_bwd
    assert str(op.default._schema) == f"forge_test_out_buffer::_chunk_bmm_bwd{SCHEMA}"
    for got in (op(a, dout), op(a, dout, torch.empty_like(a)), op(a, dout, residual=torch.empty_like(a))):
        assert got.shape == a.shape and got.dtype == a.dtype
    grouped = torch.empty(1, 200, 2, 32, device="meta", dtype=torch.bfloat16)
    assert op(grouped, torch.empty(1, 4, 2, 64, 64, device="meta", dtype=torch.bfloat16)).shape == grouped.shape

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm

    fn = ops["_chunk_bmm_bwd"]
    for call in (lambda a, d, r: fn(a, d) * 2, lambda a, d, r: fn(a, d, r, None) * 2,
                 lambda a, d, r: fn(a, d, residual=r, out=None) * 2):
        torch._dynamo.reset()
        got = torch.compile(call, fullgraph=True, backend=backend)(a, dout, torch.empty_like(a))
        assert got.shape == a.shape
    assert len(graphs) == 3 and all(g.count("forge_test_out_buffer._chunk_bmm_bwd") == 1 for g in graphs), graphs
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):  # the buffer passed: host code, not the custom op
        torch.compile(lambda a, d, o: fn(a, d, out=o), fullgraph=True, backend=backend)(a, dout, torch.empty_like(a))
    assert len(graphs) == 3


def test_a_backward_for_an_op_whose_schema_leaves_out_its_buffer_is_refused(tmp_path) -> None:
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    root = _project(tmp_path, "\n\ndef setup(ctx, inputs, output):\n    pass\n\n\ndef backward(ctx, grad):\n"
                              "    return grad\n")
    manifest = root / "kernel_manifest.toml"
    manifest.write_text(manifest.read_text() + '\n[kernels.chunk_bmm_bwd.autograd]\n'
                        '_chunk_bmm_bwd = { setup-context = "setup", backward = "backward" }\n')
    with pytest.raises(ManifestError, match=r"leaves argument out out of its schema .* a backward for "
                                            r"such an op is not supported"):
        make_plan(load_manifest(manifest), ["sm_90"])


# -- GPU ---------------------------------------------------------------------------------------------------------

CASES = [  # (batch, seqlen, chunk_size, k, groups, dtype, residual, misaligned)
    (2, 300, 64, 48, 0, "fp16", False, False),
    (2, 300, 64, 48, 0, "bf16", True, False),
    (2, 256, 128, 64, 0, "fp16", True, True),
    (3, 77, 64, 48, 0, "bf16", False, True),  # shorter than one chunk
    (1, 200, 64, 32, 2, "fp16", False, False),  # groups
    (2, 130, 64, 32, 2, "bf16", True, True),
]


def _inputs(batch, seqlen, chunk_size, k, groups, dtype, residual, misaligned, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    nchunks = -(-seqlen // chunk_size)
    shape = (batch, seqlen, groups, k) if groups else (batch, seqlen, k)
    dshape = (batch, nchunks, groups, chunk_size, chunk_size) if groups else (batch, nchunks, chunk_size, chunk_size)
    a = torch.randn(shape, device="cuda", dtype=dt, generator=g)
    dout = torch.randn(dshape, device="cuda", dtype=dt, generator=g) / chunk_size ** 0.5
    res = torch.randn(shape, device="cuda", dtype=dt, generator=g) if residual else None
    if misaligned:
        a, dout = offset_view(a), offset_view(dout)
        res = offset_view(res) if res is not None else None
    return a, dout, res


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "seqlen", "chunk_size", "k", "groups", "dtype", "residual", "misaligned"), CASES)
def test_chunk_bmm_bwd_against_fp64_with_and_without_the_callers_buffer(realworld, batch, seqlen, chunk_size, k,
                                                                        groups, dtype, residual, misaligned) -> None:
    import torch

    from tests.conftest import import_fixture_file

    ref_module = import_fixture_file(REALWORLD / "kernels" / "chunk_bmm_bwd.py", "_chunk_bmm_bwd_ref")
    a, dout, res = _inputs(batch, seqlen, chunk_size, k, groups, dtype, residual, misaligned, seed=seqlen)
    poison_allocator(a.numel() * a.element_size())
    got = realworld._chunk_bmm_bwd(a, dout, res)
    want = ref_module.reference(a, dout, res)
    assert torch.isfinite(got).all()
    tol = 2e-2 if dtype == "bf16" else 5e-3
    assert torch.allclose(got.double().cpu(), want, rtol=tol, atol=tol * 4), (got.double().cpu() - want).abs().max()
    # the caller's buffer: written and returned, the same values
    out = torch.full_like(a, float("nan"))
    back = realworld._chunk_bmm_bwd(a, dout, res, out)
    assert back is out and torch.equal(out, got)


@pytest.mark.gpu
def test_chunk_bmm_bwd_compiles_fullgraph_as_its_custom_op_bit_for_bit(realworld) -> None:
    import torch

    a, dout, res = _inputs(2, 300, 64, 48, 0, "bf16", True, False, seed=7)
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    def step(a, d, r):
        return realworld._chunk_bmm_bwd(a, d) + realworld._chunk_bmm_bwd(a, d, residual=r, out=None)

    eager = step(a, dout, res)
    for backend in (recording, "inductor"):
        torch._dynamo.reset()
        assert torch.equal(torch.compile(step, fullgraph=True, backend=backend)(a, dout, res), eager)
    assert graphs[0].count("forge_realworld._chunk_bmm_bwd") == 2, graphs[0]
    direct = torch.ops.forge_realworld._chunk_bmm_bwd(a, dout, res)
    assert torch.equal(direct, realworld._chunk_bmm_bwd(a, dout, res))

    # a compiled call passing the buffer: the host code (a graph break), the buffer written and returned
    out = torch.full_like(a, float("nan"))
    torch._dynamo.reset()
    back = torch.compile(lambda a, d, o: realworld._chunk_bmm_bwd(a, d, out=o))(a, dout, out)
    assert back.data_ptr() == out.data_ptr() and torch.equal(out, realworld._chunk_bmm_bwd(a, dout))
