"""Unsloth-style rotary embedding (tests/fixtures/realworld/unslothlike/kernels/rope_embedding.py): kernels wrapped by
assignment after their def (``f = triton.jit(f)``, ``f = triton.heuristics({...})(f)``), strides and head sizes
as constexprs, and a package that refuses to import without an accelerator (``device_type.py`` asks
``torch.cuda.is_available()`` at import), packaged unchanged.

CPU: the kernel found and split as a decorated one, the plan built per model shape (the build answers
``is_available()`` as the GPU it builds for; a plain import on this machine raises, as Unsloth does).
GPU: the wheel against torch in fp64 and bit for bit against the same file under Triton's JIT, forward and backward,
on the traced model shapes; a shape no example built is refused before any launch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from forge_aot.sourcesplit import parse_source
from tests.conftest import HALF_TOL, REALWORLD, import_fixture_file, relative_error, torch_dtype

SOURCE = REALWORLD / "unslothlike" / "kernels" / "rope_embedding.py"
MODELS = ((32, 8, 128), (16, 16, 64), (28, 4, 128))  # the file's EXAMPLE_MODELS: (query heads, kv heads, head size)


def test_the_kernel_wrapped_after_its_def_is_split_as_a_decorated_one() -> None:
    src = parse_source(SOURCE, {"fast_rope_embedding"})
    kernel = src.kernels["_rope_embedding"]
    assert kernel.decorators == ("heuristics", "jit")
    assert [p.name for p in kernel.params if p.constexpr] == [
        "Q_row_stride", "cos_row_stride", "sin_row_stride", "head_dim", "n_heads", "BACKWARD_PASS", "BLOCK_SIZE"]
    host, original = src.host_source.splitlines(), SOURCE.read_text().splitlines()
    assert len(host) == len(original)
    assert "_rope_embedding = triton" not in src.host_source and "def _rope_embedding" not in src.host_source
    assert host[original.index("_rope_embedding = triton.heuristics(")].startswith("__forge_heuristics__(")
    compile(src.host_source, str(SOURCE), "exec")


def test_the_package_refuses_to_import_without_a_gpu_but_the_build_traces_it_as_one(realworld_plan) -> None:
    import torch

    if not torch.cuda.is_available():  # as Unsloth: no accelerator, no import
        code = (f"import sys; sys.path.insert(0, {str(REALWORLD)!r}); import unslothlike.kernels.rope_embedding")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and "cannot find any torch accelerator" in proc.stderr
    # Q, cos and sin rows: heads x head size, head size / 2 (the tables), twice; one variant per model and dtype
    variants = {(e.target, e.assignment["T"], e.assignment["n_heads"], e.assignment["head_dim"],
                 e.assignment["Q_row_stride"], e.assignment["BLOCK_SIZE"]) for e in realworld_plan.entries
                if e.kernel == "unsloth_rope"}
    heads = {(h, d) for q, kv, d in MODELS for h in (q, kv)}
    assert variants == {(t, dt, h, d, h * d, d // 2) for t in ("sm_80", "sm_90") for dt in ("fp16", "bf16")
                        for h, d in heads}
    # A decode step (seq 1): Q.transpose(1, 2).contiguous() is Q itself, so the kernel rotates the caller's Q in
    # place (as the file does under the JIT) and returns a view of it: no custom op may say that, so the op stays
    # Python calls (torch.compile breaks its graph there, as Unsloth's own @torch.compiler.disable does)
    module = realworld_plan.modules["rope_embedding"]
    assert module["schemas"]["fast_rope_embedding"] is None
    assert "a view of one" in module["schema_notes"]["fast_rope_embedding"]


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(SOURCE, "unslothlike.kernels.rope_embedding")


def _inputs(dtype: str, batch: int, n_q: int, n_kv: int, seq: int, head_dim: int):
    import torch

    dt = torch_dtype(dtype)
    angle = torch.randn(seq, head_dim // 2, device="cuda") * 3
    Q = torch.randn(batch, n_q, seq, head_dim, device="cuda", dtype=dt)
    K = torch.randn(batch, n_kv, seq, head_dim, device="cuda", dtype=dt)
    return Q, K, angle.cos().to(dt), angle.sin().to(dt)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("batch_seq", [(2, 512), (1, 77), (3, 1000), (1, 1)])
def test_forward_and_backward_against_torch_and_the_jit(realworld, jit, dtype, model, batch_seq) -> None:
    import torch

    Q, K, cos, sin = _inputs(dtype, batch_seq[0], *model[:2], batch_seq[1], model[2])
    gq, gk = torch.randn_like(Q), torch.randn_like(K)
    ref_q, ref_k = jit.rope_reference(Q, K, cos, sin)
    results = {}
    for name, module in (("wheel", realworld), ("jit", jit)):
        q_in, k_in = Q.clone().requires_grad_(), K.clone().requires_grad_()
        q, k = module.fast_rope_embedding(q_in, k_in, cos, sin)
        ((q * gq).sum() + (k * gk).sum()).backward()
        torch.cuda.synchronize()
        results[name] = (q, k, q_in.grad, k_in.grad, q_in.detach(), k_in.detach())
    q, k, dq, dk, q_after, _ = results["wheel"]
    assert q.shape == Q.shape and q.dtype == Q.dtype
    # the caller's Q: untouched, except in a decode step (seq 1), where the file rotates it in place
    assert torch.equal(q_after, q) if Q.shape[2] == 1 else torch.equal(q_after, Q)
    assert relative_error(q, ref_q) < HALF_TOL[dtype] and relative_error(k, ref_k) < HALF_TOL[dtype]
    # the backward rotates the gradient back: the transpose of the forward rotation, in fp64
    back_q, back_k = jit.rope_reference(gq, gk, cos, -sin)
    assert relative_error(dq, back_q) < HALF_TOL[dtype] and relative_error(dk, back_k) < HALF_TOL[dtype]
    for mine, theirs in zip(results["wheel"], results["jit"]):
        assert torch.equal(mine, theirs)  # the JIT compiles the same specialization: the same bits


@pytest.mark.gpu
def test_a_model_shape_no_example_built_is_refused_before_any_launch(realworld) -> None:
    import torch
    from forge_realworld._runtime.errors import NotBuiltError

    Q, K, cos, sin = _inputs("bf16", 1, 12, 12, 64, 96)  # 12 heads of 96: no example passes them
    before = Q.clone()
    with pytest.raises(NotBuiltError, match=r"head_dim|n_heads|Q_row_stride"):
        realworld.fast_rope_embedding(Q, K, cos, sin)
    torch.cuda.synchronize()
    assert torch.equal(Q, before)
