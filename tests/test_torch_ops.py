"""Exported ops as torch custom ops: schemas from annotations or from the traced examples, a fake
implementation that runs the host code with launches skipped, and torch.compile(fullgraph=True) tracing them
as one op (CPU: no kernel runs; the GPU test runs them)."""

from __future__ import annotations

import pytest

from forge_aot import runtime as rt
from forge_aot.index import build_index
from forge_aot.manifest import load_manifest
from forge_aot.plan import make_plan
from tests.conftest import FIXTURES, REPO


def _ops(manifest, namespace: str):
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    index = build_index(plan, None, "jit", {m: s["path"] for m, s in plan.modules.items()})
    sources = {m: (s["path"], s["host_source"]) for m, s in plan.modules.items()}
    return index, rt.register_torch_ops(namespace, index, rt.bind_ops(namespace, index, None, sources))


def test_schemas_from_annotations_and_from_traced_examples() -> None:
    plan = make_plan(load_manifest(REPO / "kernel_manifest.toml"), ["sm_90"])
    assert plan.modules["softmax"]["schemas"] == {"softmax": "(Tensor x) -> Tensor"}
    assert plan.modules["softmax"]["schema_notes"] == {"softmax": "from the type annotations"}
    real = make_plan(load_manifest(FIXTURES / "realworld" / "kernel_manifest.toml"), ["sm_90"])
    assert real.modules["rms_norm"]["schemas"]["rms_norm"] == (
        "(Tensor x, Tensor weight, float eps=1e-06, float offset=0.0, str casting_mode='llama') -> Tensor")
    assert real.modules["layer_norm"]["schemas"]["layer_norm"].startswith("(Tensor x, int[] normalized_shape,")
    assert "float? sm_scale=None" in real.modules["flash_attention"]["schemas"]["attention"]


def test_fake_implementation_gives_the_host_codes_shapes_without_launching() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    _ops(REPO / "kernel_manifest.toml", "forge_test_fake")
    with FakeTensorMode():
        x = torch.empty(8, 1000, device="cuda", dtype=torch.float16)
        y = torch.ops.forge_test_fake.softmax(x)
        assert y.shape == (8, 1000) and y.dtype == torch.float16 and y.device.type == "cuda"
        a = torch.empty(64, 32, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(32, 48, device="cuda", dtype=torch.bfloat16)
        assert torch.ops.forge_test_fake.matmul(a, b).shape == (64, 48)


class _Captured(Exception):
    pass


def test_torch_compile_fullgraph_traces_the_op_as_one_custom_op() -> None:
    import torch

    _, ops = _ops(FIXTURES / "realworld" / "kernel_manifest.toml", "forge_test_compile")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)

        def run(*args):
            raise _Captured  # nothing to run on a CPU machine: the graph is what this test checks
        return run

    def f(x, w):
        return ops["rms_norm"](x, w, 1e-6, 0.0, "llama") * 2

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    with pytest.raises(_Captured):
        compiled(torch.randn(4, 2048, dtype=torch.float16), torch.randn(2048, dtype=torch.float16))
    (gm,) = graphs
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "forge_test_compile.rms_norm" in targets, targets  # one opaque op, no graph break


@pytest.mark.gpu
def test_compiled_and_exported_ops_match_eager(packaged) -> None:
    import torch

    x = torch.randn(37, 1000, device="cuda")
    a = torch.randn(300, 200, device="cuda", dtype=torch.float16)
    b = torch.randn(200, 120, device="cuda", dtype=torch.float16)

    def f(x, a, b):
        return packaged.softmax(x) * 2, packaged.matmul(a, b)

    eager = f(x, a, b)
    compiled = torch.compile(f, fullgraph=True)(x, a, b)
    for got, want in zip(compiled, eager):
        assert torch.equal(got, want)
    assert hasattr(torch.ops.forge_kernels, "softmax")

    class M(torch.nn.Module):
        def forward(self, x):
            return packaged.softmax(x) + 1

    exported = torch.export.export(M(), (x,))
    assert any("forge_kernels.softmax" in str(n.target) for n in exported.graph.nodes)
    assert torch.equal(exported.module()(x), packaged.softmax(x) + 1)


@pytest.mark.gpu
def test_library_style_op_compiles_fullgraph() -> None:
    import torch

    forge_realworld = pytest.importorskip("forge_realworld")
    x = torch.randn(8, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    compiled = torch.compile(lambda x, w: forge_realworld.rms_norm(x, w) * 2, fullgraph=True)
    assert torch.equal(compiled(x, w), forge_realworld.rms_norm(x, w) * 2)
