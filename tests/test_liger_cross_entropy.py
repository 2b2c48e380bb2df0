"""Liger-Kernel-style cross entropy (tests/fixtures/realworld/kernels/liger_cross_entropy.py): the forward kernel
writes the gradient into the logits in place, the host code reads ``(target != ignore_index).sum().item()``
(a value of a tensor: none exists while torch.compile or torch.export trace), ``reduction`` is a string constexpr
and the label smoothing and z-loss scale float constexprs, the backward scales the saved gradient in place
unless ``torch.equal(grad_output, 1.0)``, and the result is ``loss`` or ``(loss, z_loss)``.

CPU: the op is a mutating custom op with padded results; its Meta implementation answers the host code's value
reads with stand-ins (the build checked that no result shape follows them), so fake tensors, torch.export and
torch.compile(fullgraph=True) take it as one op. GPU: losses and gradients against torch in fp64 and bit for bit
against the file under Triton's JIT, every reduction, ignored rows, softcapping with label smoothing and the
z-loss, grad_output other than 1, and compiled inference against eager."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, relative_error, torch_dtype

SCHEMA = ("(Tensor(a!) input, Tensor target, int ignore_index=-100, float lse_square_scale=0.0, "
          "float label_smoothing=0.0, str reduction='mean', float? softcap=None, bool return_z_loss=False) "
          "-> (Tensor, Tensor?)")


def test_the_op_is_a_mutating_custom_op_despite_its_host_sync(realworld_plan) -> None:
    module = realworld_plan.modules["liger_cross_entropy"]
    assert module["schemas"]["liger_cross_entropy"] == SCHEMA, module["schema_notes"]
    assert module["results"]["liger_cross_entropy"]["argument"] == "return_z_loss"
    kp = realworld_plan.kernels["liger_cross_entropy"]
    assert ("n_non_ignore", "i32") in kp.params  # what .item() read: a runtime argument of the launch
    built = {(e.assignment["reduction"], e.assignment["label_smoothing"], e.assignment["HAS_SOFTCAPPING"],
              e.assignment["RETURN_Z_LOSS"], e.assignment["num_warps"])
             for e in realworld_plan.entries if e.kernel == "liger_cross_entropy"}
    assert built == {("mean", 0.0, False, False, 32), ("sum", 0.0, False, False, 32),
                     ("mean", 0.1, True, True, 32), ("none", 0.1, True, True, 32)}


def test_fake_tensors_export_and_compile_take_the_op_whole() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tests.test_torch_ops import _ops

    _ops(REALWORLD / "kernel_manifest.toml", "forge_test_liger_ce")
    op = torch.ops.forge_test_liger_ce.liger_cross_entropy
    with FakeTensorMode():
        x = torch.empty(6, 32000, device="cuda", dtype=torch.bfloat16)
        t = torch.empty(6, device="cuda", dtype=torch.int64)
        loss, z = op(x, t)
        assert loss.shape == () and loss.dtype == torch.float32 and z is None
        loss, z = op(x, t, -100, 1e-4, 0.1, "none", 30.0, True)
        assert loss.shape == (6,) and z.shape == (6,)

    class Loss(torch.nn.Module):
        def forward(self, x, t):
            return torch.ops.forge_test_liger_ce.liger_cross_entropy(x, t)[0] * 2

    exported = torch.export.export(Loss(), (torch.randn(5, 32000), torch.randint(0, 32000, (5,))))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "forge_test_liger_ce.liger_cross_entropy.default" in targets, targets


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "kernels" / "liger_cross_entropy.py", "_liger_cross_entropy_jit")


def _reference(logits, target, reduction, label_smoothing, softcap, lse_square_scale):
    """Loss and z-loss in fp64, as Liger defines them (the z-loss added to the loss, both over kept rows)."""
    import torch

    x = logits.double()
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    ce = torch.nn.functional.cross_entropy(x, target, ignore_index=-100, reduction="none",
                                           label_smoothing=label_smoothing)
    kept = target != -100
    z = torch.where(kept, lse_square_scale * torch.logsumexp(x, -1) ** 2, 0.0)
    loss = ce + z
    if reduction == "none":
        return loss, z
    if reduction == "sum":
        return loss.sum(), z.sum()
    n = kept.sum()
    return loss.sum() / n, z.sum() / n


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("vocab", [32000, 50257, 128256])
@pytest.mark.parametrize("rows", [1, 7, 333])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradient_against_torch_and_the_jit(realworld, jit, dtype, vocab, rows, reduction) -> None:
    import torch

    torch.manual_seed(rows + vocab)
    base = torch.randn(rows, vocab, device="cuda", dtype=torch_dtype(dtype)) * 3
    target = torch.randint(0, vocab, (rows,), device="cuda")
    if rows > 1:
        target[::3] = -100
    ref_logits = base.detach().clone().requires_grad_()
    ref, _ = _reference(ref_logits, target, reduction, 0.0, None, 0.0)
    ref.backward()
    logits = base.clone().requires_grad_()
    jit_logits = base.clone().requires_grad_()
    loss = realworld.liger_cross_entropy(logits, target, reduction=reduction)
    jit_loss = jit.liger_cross_entropy(jit_logits, target, reduction=reduction)
    (loss * 1.0).backward()  # grad_output 1: nothing to scale
    jit_loss.backward()
    torch.cuda.synchronize()
    assert loss.dtype == torch.float32
    assert relative_error(loss.reshape(1), ref.reshape(1)) < 1e-5
    tol = 1e-5 if dtype == "fp32" else 1e-2
    assert relative_error(logits.grad, ref_logits.grad) < tol
    assert torch.equal(loss, jit_loss) and torch.equal(logits.grad, jit_logits.grad)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_softcap_label_smoothing_z_loss_and_a_scaled_backward(realworld, jit, reduction) -> None:
    import torch

    base = torch.randn(97, 32000, device="cuda", dtype=torch.bfloat16) * 8
    target = torch.randint(0, 32000, (97,), device="cuda")
    target[5::7] = -100
    kw = dict(label_smoothing=0.1, softcap=30.0, return_z_loss=True, lse_square_scale=1e-4, reduction=reduction)
    logits, jit_logits = base.clone().requires_grad_(), base.clone().requires_grad_()
    loss, z_loss = realworld.liger_cross_entropy(logits, target, **kw)
    jit_loss, jit_z = jit.liger_cross_entropy(jit_logits, target, **kw)
    ref_logits = base.detach().clone().requires_grad_()
    ref, ref_z = _reference(ref_logits, target, reduction, 0.1, 30.0, 1e-4)
    (loss.sum() * 2).backward()  # grad_output 2: the in-place scaling kernel runs
    (jit_loss.sum() * 2).backward()
    (ref.sum() * 2).backward()
    torch.cuda.synchronize()
    assert relative_error(loss.reshape(-1), ref.reshape(-1)) < 1e-4
    assert relative_error(z_loss.reshape(-1), ref_z.reshape(-1)) < 1e-4
    assert relative_error(logits.grad, ref_logits.grad) < 2e-2
    assert torch.equal(loss, jit_loss) and torch.equal(z_loss, jit_z) and torch.equal(logits.grad, jit_logits.grad)


@pytest.mark.gpu
def test_the_logits_are_overwritten_with_the_gradient_as_liger_does(realworld) -> None:
    import torch

    logits = torch.randn(16, 32000, device="cuda")
    target = torch.randint(0, 32000, (16,), device="cuda")
    expected = (torch.softmax(logits.double(), -1) - torch.nn.functional.one_hot(target, 32000)) / 16
    with torch.no_grad():
        realworld.liger_cross_entropy(logits, target)
    torch.cuda.synchronize()
    assert relative_error(logits, expected) < 1e-5


@pytest.mark.gpu
def test_compiled_inference_runs_the_custom_op_and_matches_eager(realworld) -> None:
    import torch

    base = torch.randn(33, 128256, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 128256, (33,), device="cuda")
    target[::4] = -100

    def f(x, t):
        return realworld.liger_cross_entropy(x, t, reduction="sum") * 0.5

    compiled = torch.compile(f, fullgraph=True)
    with torch.no_grad():
        eager_x, compiled_x = base.clone(), base.clone()
        eager = f(eager_x, target)
        out = compiled(compiled_x, target)
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    assert torch.equal(compiled_x, eager_x)  # the in-place gradient write kept under functionalization
