"""Liger-Kernel-style fused residual add + RMSNorm (tests/fixtures/realworld/ligerlike/ops/fused_add_rms_norm.py):
``S = X + R`` returned beside ``Y``, Llama's and Gemma's casting modes as a constexpr read from module-level
``tl.constexpr`` globals, and a backward whose ``rows_per_program`` constexpr comes from the SM count, asked only
``if S.device.type == "cuda"`` (one program on any other device).

CPU: the build traces host code on tensors that answer as CUDA tensors (``ongpu.tensors_on_gpu``), so the backward
is built for each target GPU's program count (it had been built for the single program of the CPU branch, and every
GPU call failed with NotBuiltError). GPU: outputs and gradients against torch in fp64 and bit for bit against the
file under Triton's JIT, with fewer rows than the H100 has SMs (one row per program), more (several), batched 3-D
inputs and an input that starts one element into its storage."""

from __future__ import annotations

import pytest

from tests.conftest import REALWORLD, import_fixture_file, relative_error, torch_dtype


def test_the_backward_is_built_for_each_gpus_program_count(realworld_plan) -> None:
    # 333 rows, 2 x 37 and 8 x 512: sm_90 traced as an H100 SXM and PCIe (132 and 114 SMs: 3 rows per program for
    # both, 32 and 36), sm_80 as an A100 (108 SMs: 4, 38); 74 rows take one program each on all of them
    built = {(e.target, e.assignment["rows_per_program"]) for e in realworld_plan.entries
             if e.kernel == "liger_fused_add_rms_norm_bwd"}
    assert built == {("sm_80", 1), ("sm_80", 4), ("sm_80", 38), ("sm_90", 1), ("sm_90", 3), ("sm_90", 32),
                     ("sm_90", 36)}
    modes = {(e.assignment["T"], e.assignment["casting_mode"], str(e.assignment["X_dtype"]))
             for e in realworld_plan.entries if e.kernel == "liger_fused_add_rms_norm_bwd"}
    assert modes == {("fp32", 0, "tl.float32"), ("bf16", 0, "tl.bfloat16"), ("fp16", 0, "tl.float16"),
                     ("bf16", 1, "tl.bfloat16")}
    schema = realworld_plan.modules["fused_add_rms_norm"]["schemas"]["liger_fused_add_rms_norm"]
    assert schema == ("(Tensor X, Tensor R, Tensor W, float eps=1e-06, float offset=0.0, str casting_mode='llama', "
                      "bool in_place=False) -> (Tensor, Tensor)")


BRANCHES = """\
import torch
import triton
import triton.language as tl


# allocated at import on the device torch says there is
_ONE = torch.ones(1, device="cuda" if torch.cuda.is_available() else "cpu")


@triton.jit
def k(x, n, ROWS: tl.constexpr):
    pass


def op(x):
    sm_count = 1
    if x.device.type == "cuda":
        sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count
    assert x.is_cuda and x.get_device() == 0 and x.device == torch.device("cuda", 0) and _ONE.is_cuda
    # allocations on the tensors' device (or torch's name for it) stay where the trace keeps its tensors
    y = torch.empty(x.shape[0], device=x.device).cuda().to("cuda")
    torch.zeros(1, device=x.get_device()).to(x.device, torch.float16)
    k[(sm_count,)](y, y.numel(), ROWS=triton.cdiv(y.shape[0], sm_count))
    return Fn.apply(x)


class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        # the autograd engine runs this without the caller's torch-function modes: the build enters its own again
        n = 7 if g.is_cuda else 1
        k[(n,)](g, g.numel(), ROWS=n)
        return g * 2


def examples(device="cpu"):
    op(torch.randn(264, device=device, requires_grad=True)).sum().backward()
"""


def test_host_code_sees_cuda_tensors_while_the_build_traces(tmp_path) -> None:
    """What the GPU branch of host code computes is what the build builds, per target, and allocating on "cuda"
    (at import too) works on a machine without one; torch's own answers are back after the trace."""
    import torch

    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(BRANCHES)
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_80", "sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
        'ops = ["op"]\nsignature = { x = "*fp32", n = "i32" }\nexamples = "examples"\n')
    apply = torch.autograd.function.BackwardCFunction.apply
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    built = {(e.target, e.assignment["ROWS"]) for e in plan.entries}
    # 264 rows over 108 (A100) and 132 (H100) programs; the backward's 7 programs
    assert built == {("sm_80", 3), ("sm_80", 7), ("sm_90", 2), ("sm_90", 7)}
    x = torch.randn(3)
    assert x.device.type == "cpu" and not x.is_cuda and x.get_device() == -1
    assert torch.autograd.function.BackwardCFunction.apply is apply
    with pytest.raises((AssertionError, RuntimeError)):
        torch.empty(1, device="cuda")  # CPU torch: not compiled with CUDA


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "ligerlike" / "ops" / "fused_add_rms_norm.py", "_fused_add_rms_norm_jit")


def _reference(X, R, W, eps, offset, dY, dS):
    """Y and S, and the gradients of (Y * dY + S * dS).sum() for X, R and W, in fp64."""
    import torch

    X, R, W = (t.detach().double().requires_grad_() for t in (X, R, W))
    S = X + R
    Y = S * torch.rsqrt(S.pow(2).mean(-1, keepdim=True) + eps) * (offset + W)
    ((Y * dY.double()).sum() + (S * dS.double()).sum()).backward()
    return Y.detach(), S.detach(), X.grad, R.grad, W.grad


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "mode", "offset"), [("fp32", "llama", 0.0), ("bf16", "llama", 0.0),
                                                        ("fp16", "llama", 0.0), ("bf16", "gemma", 1.0)])
@pytest.mark.parametrize("shape", [(77, 4096), (1, 3000), (333, 4096), (300, 3000), (2, 37, 4096), (8, 512, 4096)])
@pytest.mark.parametrize("misaligned", [False, True])
def test_forward_and_backward_against_torch_and_the_jit(realworld, jit, dtype, mode, offset, shape,
                                                        misaligned) -> None:
    import math

    import torch

    torch.manual_seed(sum(shape) + len(dtype))
    dt = torch_dtype(dtype)
    n = math.prod(shape)

    def fresh():
        if misaligned:  # one element into its storage: no 16-byte alignment to assume
            return torch.randn(n + 1, device="cuda", dtype=dt)[1:].view(shape)
        return torch.randn(shape, device="cuda", dtype=dt)

    X, R = fresh(), fresh()
    W = torch.randn(shape[-1], device="cuda", dtype=dt)
    dY, dS = torch.randn_like(X), torch.randn_like(X)
    if len(shape) == 3 and shape[1] == 512 and (dtype, mode) != ("bf16", "llama"):
        # 32 rows per program: built where the examples ran it (Llama's bf16), refused elsewhere before any launch
        from forge_realworld._runtime.errors import NotBuiltError

        x, r, w = (t.detach().clone().requires_grad_() for t in (X, R, W))
        Y, S = realworld.liger_fused_add_rms_norm(x, r, w, 1e-6, offset, mode)
        with pytest.raises(NotBuiltError, match="rows_per_program"):
            ((Y * dY).sum() + (S * dS).sum()).backward()
        return
    ref = _reference(X, R, W, 1e-6, offset, dY, dS)
    results = []
    for impl in (realworld, jit):
        x, r, w = (t.detach().clone().requires_grad_() for t in (X, R, W))
        Y, S = impl.liger_fused_add_rms_norm(x, r, w, 1e-6, offset, mode)
        for out in (Y, S):
            assert out.shape == X.shape and out.dtype == dt
        ((Y * dY).sum() + (S * dS).sum()).backward()
        results.append((Y, S, x.grad, r.grad, w.grad))
    torch.cuda.synchronize()
    mine, theirs = results
    tol = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 5e-3}[dtype]
    for got, want, name in zip(mine, ref, ("Y", "S", "dX", "dR", "dW")):
        assert relative_error(got, want) < tol, (name, relative_error(got, want))
    for got, jit_got, name in zip(mine, theirs, ("Y", "S", "dX", "dR", "dW")):
        assert torch.equal(got, jit_got), name


@pytest.mark.gpu
def test_development_mode_runs_the_helpers_triton_dtypes(realworld) -> None:
    """Development mode (``forge_aot.dev.load_dev_ops``) runs the project's helper modules with Triton itself, so
    the backward's ``torch_to_triton_dtype[S.dtype]`` is Triton's own ``tl.bfloat16``: it finds the variant built for
    the runtime's (it had raised "X_dtype=triton.language.bfloat16 was not built"), and computes what the wheel does."""
    import torch

    from forge_aot.dev import load_dev_ops

    dev = load_dev_ops(REALWORLD / "kernel_manifest.toml")
    X, R = (torch.randn(333, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    W = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    dY, dS = torch.randn_like(X), torch.randn_like(X)
    results = []
    for fn in (dev["liger_fused_add_rms_norm"], realworld.liger_fused_add_rms_norm):
        x, r, w = (t.detach().clone().requires_grad_() for t in (X, R, W))
        Y, S = fn(x, r, w)
        torch.autograd.backward((Y, S), (dY, dS))
        results.append((Y, S, x.grad, r.grad, w.grad))
    for got, want in zip(*results):
        assert torch.equal(got, want)
