"""mamba_ssm / flash-attn's residual add + LayerNorm / RMSNorm (tests/fixtures/realworld/kernels/add_norm.py):
``@triton.autotune`` configs that set only ``num_warps`` keyed on constexpr flags, the flags passed by position,
None for the absent bias, residual, residual output and (RMSNorm) mean, the residual stream in fp32 beside fp16/bf16
activations, a backward grid of one program per SM, an autograd Function returning ``y`` or ``(y, residual)``.

The call without a residual passes None for both tensors of the type variable ``R`` (the residual and the residual
output), which Triton's JIT compiles as constants; the packaged kernel had refused it ("their dtype selects the
build"). Such a call now takes the first built variant (by id) with its other values, the one the build traced it
into. CPU: the plan, that rule on both sides. GPU: forward and backward against fp64 and bit for bit against the
file's host code under Triton's JIT with the wheel's configs (development mode), odd widths, unaligned rows."""

from __future__ import annotations

import types

import pytest

from forge_aot import runtime as rt
from tests.conftest import HALF_TOL, REALWORLD, offset_view, poison_allocator, relative_error, torch_dtype

STYLES = {
    # name: (layer_norm_fn keyword arguments, has bias, has residual)
    "mamba_first_block": (dict(prenorm=True, residual_in_fp32=True, is_rms_norm=True), False, False),
    "mamba_block": (dict(prenorm=True, residual_in_fp32=True, is_rms_norm=True), False, True),
    "layer_norm_bias": (dict(is_rms_norm=False), True, False),
    "final_rms_norm": (dict(is_rms_norm=True, eps=1e-5), False, False),
}


def _entries(plan, kernel: str, target: str = "sm_90"):
    return {e.variant: e for e in plan.entries if e.kernel == kernel and e.target == target}


def test_constexprs_by_position_configs_of_num_warps_and_a_type_variable_left_all_none(realworld_plan) -> None:
    kp = realworld_plan.kernels["add_norm_fwd"]
    assert [(c.meta, c.num_warps) for c in kp.space] == [({}, w) for w in (1, 2, 4, 8, 16, 32)]
    assert kp.axes[:2] == ["T", "R"] and {"IS_RMS_NORM", "BLOCK_N", "HAS_RESIDUAL"} <= set(kp.axes)
    fwd = _entries(realworld_plan, "add_norm_fwd")
    # the LayerNorm with bias and no residual: RESIDUAL and RESIDUAL_OUT both None, so no call says R; the build
    # put those calls in a variant of R's first listed dtype (no variant with their other values existed)
    unset = [v for v in fwd if "HAS_RESIDUAL=False,STORE_RESIDUAL_OUT=False" in v]
    assert unset and all(",R=fp16," in v for v in unset), unset
    # Mamba's first block stores the residual stream in fp32 without a residual: R from RESIDUAL_OUT
    assert any("R=fp32" in v and "HAS_RESIDUAL=False,STORE_RESIDUAL_OUT=True" in v for v in fwd)
    bwd = _entries(realworld_plan, "add_norm_bwd")
    assert any(v.startswith("R=fp32,T=bf16") and "STORE_DRESIDUAL=True" in v for v in bwd)


def test_a_call_with_a_type_variables_tensors_all_none_takes_the_first_built_variant_with_its_values() -> None:
    """Kernel.find_variant's rule, the one plan.resolve_unset_dtypes applies to traced calls."""
    from forge_aot.plan import resolve_unset_dtypes

    axes = ["T", "R", "FLAG"]
    variants = {rt.variant_id(a, axes): {"assign": a} for a in (
        {"T": "fp16", "R": "fp32", "FLAG": True}, {"T": "fp16", "R": "bf16", "FLAG": True},
        {"T": "bf16", "R": "fp32", "FLAG": False})}
    k = types.SimpleNamespace(axes=axes, variants=variants, type_vars=[("T", 0), ("R", 4)], function="k",
                              targets={}, spec={}, name="k")
    vid, assignment = rt.Kernel.find_variant(k, ("fp16", None, True))
    assert vid == "T=fp16,R=bf16,FLAG=True" and assignment["R"] == "bf16"  # the first by id of the two
    with pytest.raises(rt.NotBuiltError, match=r"no build for .*R of any dtype"):
        rt.Kernel.find_variant(k, ("bf16", None, True))
    # the build's side: the same variant for such a traced call, a new one of R's first dtype where none fits
    from forge_aot.plan import TracedCall

    kp = types.SimpleNamespace(axes=axes, entry=types.SimpleNamespace(dtypes={"T": ("fp16", "bf16"),
                                                                             "R": ("fp16", "bf16", "fp32")}))
    planned = {tuple(v["assign"].values()): (v["assign"], set()) for v in variants.values()}
    calls = [TracedCall("k", values, (i,), "", None) for i, values in enumerate(
        (("fp16", None, True), ("bf16", None, True), ("bf16", None, True)))]
    resolved = resolve_unset_dtypes(kp, calls, planned)
    assert [c.values for c in resolved] == [("fp16", "bf16", True), ("bf16", "fp16", True), ("bf16", "fp16", True)]


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dev():
    from forge_aot.dev import load_dev_ops

    return load_dev_ops(REALWORLD / "kernel_manifest.toml")


def _reference(x, w, b, residual, eps, is_rms_norm):
    import torch

    summed = x.double() + (residual.double() if residual is not None else 0)
    if is_rms_norm:
        y = summed * torch.rsqrt(summed.square().mean(-1, keepdim=True) + eps) * w.double()
    else:
        y = torch.nn.functional.layer_norm(summed, summed.shape[-1:], w.double(), None, eps)
    return (y + b.double() if b is not None else y), summed


def _run(fn, x, w, b, residual, kwargs, dy, dres):
    """Forward and backward of ``fn`` (layer_norm_fn) on fresh leaves: outputs and gradients."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (x, w, b, residual)]
    out = fn(*leaves[:3], residual=leaves[3], **kwargs)
    y, r = out if isinstance(out, tuple) else (out, None)
    loss = (y.float() * dy.float()).sum() + ((r.float() * dres.float()).sum() if r is not None else 0)
    loss.backward()
    return [t.detach() if t is not None else None for t in (y, r)], [t.grad if t is not None else None
                                                                     for t in leaves]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize(("rows", "n"), [(4, 768), (64, 2560), (3, 1000), (1, 4096), (129, 777)])
def test_add_norm_forward_backward_against_fp64_and_the_jit(realworld, dev, dtype, style, rows, n) -> None:
    import torch

    kwargs, has_bias, has_residual = STYLES[style]
    dt = torch_dtype(dtype)
    x = torch.randn(rows, n, device="cuda", dtype=dt)
    w = torch.randn(n, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt) if has_bias else None
    res = torch.randn(rows, n, device="cuda", dtype=torch.float32) if has_residual else None
    dy = torch.randn(rows, n, device="cuda", dtype=dt)
    dres = torch.randn(rows, n, device="cuda", dtype=torch.float32)
    if rows % 2:
        x = offset_view(x)  # an unaligned input (the host code keeps its strides: stride(-1) == 1)
    poison_allocator(rows * n * 4)
    (y, r), grads = _run(realworld.layer_norm_fn, x, w, b, res, kwargs, dy, dres)
    torch.cuda.synchronize()
    eps = kwargs.get("eps", 1e-6)
    ref_y, ref_r = _reference(x, w, b, res, eps, kwargs["is_rms_norm"])
    assert y.dtype == dt and relative_error(y, ref_y) < 2 * HALF_TOL[dtype]
    if kwargs.get("prenorm"):
        assert r.dtype == torch.float32 and relative_error(r, ref_r) < 1e-6
    # gradients against fp64 autograd of the same loss
    ref_leaves = [t.double().detach().requires_grad_(True) if t is not None else None for t in (x, w, b, res)]
    ry, rr = _reference(*ref_leaves, eps, kwargs["is_rms_norm"])
    ((ry * dy.double()).sum() + ((rr * dres.double()).sum() if kwargs.get("prenorm") else 0)).backward()
    for got, leaf in zip(grads, ref_leaves):
        if leaf is not None:
            assert relative_error(got, leaf.grad) < 4 * HALF_TOL[dtype] + 1e-3
    # bit for bit against the file's own host code under Triton's JIT with the wheel's configs
    (jy, jr), jgrads = _run(dev["layer_norm_fn"], x, w, b, res, kwargs, dy, dres)
    assert torch.equal(y, jy) and (r is None or torch.equal(r, jr))
    for got, want in zip(grads, jgrads):
        assert (got is None and want is None) or torch.equal(got, want)
    # again: the launches the Python path resolved, now through the C path, give the same
    (y2, _), _ = _run(realworld.layer_norm_fn, x, w, b, res, kwargs, dy, dres)
    assert torch.equal(y2, y)


@pytest.mark.gpu
def test_rms_norm_fn_keeps_its_signature_and_returns_the_input_as_the_residual_where_nothing_was_added(
        realworld) -> None:
    import torch

    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y, r = realworld.rms_norm_fn(x, w, None, prenorm=True)  # no residual, no fp32 stream: r is x itself
    assert r.data_ptr() == x.data_ptr() and y.shape == x.shape
    assert torch.equal(realworld.rms_norm_fn(x, w, None), y)


@pytest.mark.gpu
def test_a_block_compiles_fullgraph_through_both_result_structures_and_trains_through_the_manifests_backward(
        realworld) -> None:
    """Inference: torch.compile(fullgraph=True) of a block calling ``rms_norm_fn`` with ``prenorm=True`` (a pair;
    once with no residual, where the host code returns ``x`` itself) and ``layer_norm_fn`` without (one tensor):
    each is one custom op returning ``(Tensor, Tensor?)``, unpadded to the host code's structure, results equal to
    eager (the inputs-as-residual a copy). Training: torch.compile(fullgraph=True) differentiates them with the
    manifest's backward (``add_norm_grad``, which recomputes the statistics with the same kernels): gradients equal to
    eager's (the file's own autograd.Function) under AOTAutograd, within 1e-2 under Inductor (which fuses the
    loss's own ops)."""
    import torch

    x = torch.randn(37, 2560, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2560, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2560, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(37, 2560, device="cuda", dtype=torch.float32)

    def block(x, w, b, res):
        h, r = realworld.rms_norm_fn(x, w, None, residual=res, prenorm=True, residual_in_fp32=True)
        h2, r2 = realworld.rms_norm_fn(h, w, None, prenorm=True)  # r2 is h itself in eager code
        return realworld.layer_norm_fn(h2, w, b, eps=1e-5), r, r2

    graphs = []

    def recording(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    eager = block(x, w, b, res)
    for compiled in (torch.compile(block, fullgraph=True, backend=recording)(x, w, b, res),
                     torch.compile(block, fullgraph=True)(x, w, b, res)):
        assert isinstance(compiled[0], torch.Tensor) and len(compiled) == 3
        for got, want in zip(compiled, eager):
            assert got.dtype == want.dtype and torch.equal(got, want)
        assert compiled[2].data_ptr() != compiled[0].data_ptr()
    assert graphs[0].count("forge_realworld.rms_norm_fn") == 2 and "forge_realworld.layer_norm_fn" in graphs[0]

    def train_block(x, w, b, res):  # the differentiated calls the fixture builds: mamba's block, LayerNorm + bias
        h, r = realworld.rms_norm_fn(x, w, None, residual=res, prenorm=True, residual_in_fp32=True)
        return realworld.layer_norm_fn(h, w, b), r

    def step(fn, x=x, w=w, b=b, res=res):
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, w, b, res)]
        y, r = fn(*leaves)
        (y.float().square().sum() + r.sum()).backward()
        return [y.detach(), *(t.grad for t in leaves)]

    want = step(train_block)
    for backend, exact in (("aot_eager", True), ("inductor", False)):  # the backward: the manifest's add_norm_grad
        got = step(torch.compile(train_block, fullgraph=True, backend=backend))
        for g, e in zip(got, want):
            assert g is not None and g.dtype == e.dtype
            assert torch.equal(g, e) if exact else relative_error(g, e) < 1e-2, backend


@pytest.mark.gpu
def test_the_exported_rms_norm_module_runs_the_op_and_compiles_whole(realworld) -> None:
    """mamba's ``RMSNorm`` module, exported as it is (``[exports]``): its forward calls the file's ``rms_norm_fn``,
    which in the bound host module is the custom op's route, so the module gives the op's results eagerly,
    compiles with torch.compile(fullgraph=True) as one custom op, and trains through the manifest's backward."""
    import torch

    norm = realworld.RMSNorm(2560, eps=1e-5, device="cuda", dtype=torch.bfloat16)
    assert isinstance(norm, torch.nn.Module) and type(norm).__module__ == "forge_realworld._ops.add_norm"
    with torch.no_grad():
        norm.weight.copy_(torch.randn(2560, device="cuda"))
    x = torch.randn(37, 2560, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(37, 2560, device="cuda", dtype=torch.float32)
    with torch.no_grad():
        eager = norm(x)
        want = realworld.rms_norm_fn(x, norm.weight, None, eps=1e-5)
        h, r = norm(x, residual=res, prenorm=True, residual_in_fp32=True)
    assert torch.equal(eager, want)
    ref, summed = _reference(x, norm.weight, None, res, 1e-5, True)
    assert relative_error(h, ref) < 1e-2 and relative_error(r, summed) < 1e-6
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    with torch.no_grad():
        compiled = torch.compile(norm, fullgraph=True, backend=recording)(x)
    assert torch.equal(compiled, eager) and graphs[0].count("forge_realworld.rms_norm_fn") == 1
    leaves = [x.detach().clone().requires_grad_(True) for _ in range(2)]
    for i, module in enumerate((norm, torch.compile(norm, fullgraph=True, backend="aot_eager"))):
        norm.weight.grad = None
        module(leaves[i]).float().square().sum().backward()
        if i == 0:
            grads = (leaves[0].grad, norm.weight.grad)
    assert torch.equal(leaves[1].grad, grads[0]) and torch.equal(norm.weight.grad, grads[1])
