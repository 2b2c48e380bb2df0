"""Liger-Kernel-style cross entropy (tests/fixtures/realworld/ligerlike/ops/liger_cross_entropy.py): the forward kernel
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

from tests.conftest import REALWORLD, assert_manifest_errors, import_fixture_file, relative_error, torch_dtype

SCHEMA = ("(Tensor(a!) input, Tensor target, int ignore_index=-100, float lse_square_scale=0.0, "
          "float label_smoothing=0.0, str reduction='mean', float? softcap=None, bool return_z_loss=False) "
          "-> (Tensor, Tensor)")


def test_the_op_is_a_mutating_custom_op_despite_its_host_sync(realworld_plan) -> None:
    module = realworld_plan.modules["liger_cross_entropy"]
    assert module["schemas"]["liger_cross_entropy"] == SCHEMA, module["schema_notes"]
    rule = module["results"]["liger_cross_entropy"]
    assert rule["argument"] == "return_z_loss" and rule["fill"]  # padded with empty tensors: see the next test
    kp = realworld_plan.kernels["liger_cross_entropy"]
    assert ("n_non_ignore", "i32") in kp.params  # what .item() read: a runtime argument of the launch
    built = {(e.assignment["reduction"], e.assignment["label_smoothing"], e.assignment["HAS_SOFTCAPPING"],
              e.assignment["RETURN_Z_LOSS"], e.assignment["num_warps"])
             for e in realworld_plan.entries if e.kernel == "liger_cross_entropy"}
    assert built == {("mean", 0.0, False, False, 32), ("sum", 0.0, False, False, 32),
                     ("mean", 0.1, True, True, 32), ("none", 0.1, True, True, 32)}


def test_untyped_runtime_parameters_are_typed_from_the_traced_calls(realworld_plan) -> None:
    """The manifest types only X_ptr: the others take the types Triton's JIT gives the examples' values."""
    kp = realworld_plan.kernels["liger_cross_entropy"]
    assert kp.inferred == {"X_stride": "i32", "Y_ptr": "*i64", "Y_stride": "i32", "loss_ptr": "*fp32",
                           "z_loss_ptr": "*fp32", "loss_stride": "i32", "n_cols": "i32", "n_non_ignore": "i32",
                           "ignore_index": "i32", "softcap": "fp32"}
    assert dict(kp.params)["X_stride"] == "i32" and "X_stride" in kp.spec_params
    for e in realworld_plan.entries:
        for calls in e.calls.values():
            assert all(len(c.spec) == len(realworld_plan.kernels[e.kernel].spec_params) for c in calls)


INFER = """\
import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, out_ptr, n, big, scale, flag, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x_ptr + offs, mask=m) * scale + tl.load(y_ptr + offs, mask=m) + big
    tl.store(out_ptr + offs, tl.where(flag, v, 0), mask=m)


def op(x, y, big=2**40, mixed=False):
    out = torch.empty_like(x)
    if mixed:  # y's dtype the other one of x's: no type variable of the manifest follows it
        y = y.float() if x.dtype == torch.float16 else y.half()
    k[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), big, 0.5, True, BLOCK=256)
    return out


def examples(device="cpu"):
    for dtype in (torch.float16, torch.float32):
        op(torch.randn(1000, device=device, dtype=dtype), torch.randn(1000, device=device, dtype=dtype))
"""


@pytest.mark.parametrize(("edit", "error"), [
    (None, None),
    ("mixed=True", "its tensors are fp16, fp32: give it a type variable of dtypes"),
    ("big=1.5", "the traced calls pass int and float (Triton's JIT compiles a binary for each"),
])
def test_untyped_parameters_take_triton_types_or_a_clear_error(tmp_path, edit, error) -> None:
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    text = INFER if edit is None else INFER.replace("torch.randn(1000, device=device, dtype=dtype))",
                                                    f"torch.randn(1000, device=device, dtype=dtype), {edit})", 1)
    if edit == "big=1.5":
        text = text.replace("    for dtype in", "    op(torch.randn(8, device=device), torch.randn(8, device=device))\n"
                                               "    for dtype in")
    (tmp_path / "k.py").write_text(text)
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
        'ops = ["op"]\nsignature = { x_ptr = "*T" }\ndtypes = { T = ["fp16", "fp32"] }\nexamples = "examples"\n')
    if error is None:
        kp = make_plan(load_manifest(tmp_path / "kernel_manifest.toml")).kernels["k"]
        assert kp.inferred == {"y_ptr": "*T", "out_ptr": "*T", "n": "i32", "big": "i64", "scale": "fp32", "flag": "i1"}
        assert kp.spec_params == ["x_ptr", "y_ptr", "out_ptr", "n", "big"]
        return
    with pytest.raises(ManifestError) as info:
        make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    assert "kernels.k.signature." in str(info.value) and error in str(info.value), str(info.value)


ALWAYS_NONE = """\
import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, out_ptr, cu_seqlens, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bos = 0
    if cu_seqlens is not None:
        bos = tl.load(cu_seqlens)
    tl.store(out_ptr + offs, tl.load(x_ptr + bos + offs, mask=offs < n), mask=offs < n)


def op(x, cu_seqlens=None):
    out = torch.empty_like(x)
    k[(triton.cdiv(x.numel(), 256),)](x, out, cu_seqlens, x.numel(), BLOCK=256)
    return out


def examples(device="cpu"):
    op(torch.randn(1000, device=device))
"""


def test_a_parameter_every_traced_call_passes_as_none_is_the_constant_none(tmp_path) -> None:
    """flash-linear-attention's ops take ``cu_seqlens=None`` unless a batch is packed; examples that never pack one
    left the parameter with no type (a build error asking for one). Triton compiles None as the constant None
    whatever the type, so the build does too: typed ``*i8`` for the signature, every binary taking it as None, a
    note saying a call passing a value raises NotBuiltError. Compiled for real (sm_90)."""
    from click.testing import CliRunner

    from forge_aot.cli import main
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import job_for, make_plan

    (tmp_path / "k.py").write_text(ALWAYS_NONE)
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
        'ops = ["op"]\nsignature = { x_ptr = "*fp32" }\nexamples = "examples"\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    kp = plan.kernels["k"]
    assert kp.inferred["cu_seqlens"] == "*i8" and any("cu_seqlens: None in every traced call" in n for n in kp.notes)
    at = kp.spec_params.index("cu_seqlens")
    (entry,) = plan.entries
    (row,) = entry.tables["default"]
    binaries = plan.binaries_for(entry, row.key, row.preferences[0])
    assert binaries and all(b.spec[at] == "N" for b in binaries)
    job = job_for(plan, entry, row.preferences[0], binaries[0])
    assert job.signature["cu_seqlens"] == "constexpr" and job.constexprs["cu_seqlens"] is None
    out = CliRunner().invoke(main, ["check", "--manifest", str(tmp_path / "kernel_manifest.toml")]).output
    assert "cu_seqlens: None in every traced call" in out, out
    built = CliRunner().invoke(main, ["build", "-q", "-j", "1", "--manifest", str(tmp_path / "kernel_manifest.toml"),
                                      "--out", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "build")])
    assert built.exit_code == 0 and list((tmp_path / "dist").glob("p-0.1.0-*.whl")), built.output


def test_a_float_passed_as_none_is_compiled_as_the_constant_none(realworld_plan) -> None:
    """``softcap=None`` to a float parameter: Triton compiles any None as a constant, so the build specializes the
    parameter (``N`` or ``x``) and compiles both; the runtime reads a None scalar as ``N`` and a float as ``x``."""
    from forge_aot import runtime as rt
    from forge_aot.plan import job_for

    kp = realworld_plan.kernels["liger_cross_entropy"]
    assert kp.spec_params[-1] == "softcap" and "ignore_index" in kp.spec_params
    at = len(kp.spec_params) - 1
    codes = {}
    for e in realworld_plan.entries:
        if e.kernel == "liger_cross_entropy":
            for row in (r for rows in e.tables.values() for r in rows):
                for b in realworld_plan.binaries_for(e, row.key, row.preferences[0]):
                    job = job_for(realworld_plan, e, row.preferences[0], b)
                    codes.setdefault(e.assignment["HAS_SOFTCAPPING"], set()).add(b.spec[at])
                    if b.spec[at] == "N":
                        assert job.signature["softcap"] == "constexpr" and job.constexprs["softcap"] is None
                    else:
                        assert job.signature["softcap"] == "fp32" and kp.params.index(("softcap", "fp32")) \
                            not in job.divisible
    assert codes == {False: {"N"}, True: {"x"}}
    assert rt.argument_spec([(0, False), (1, False), (2, False), (3, False)], [None, 16.0, 1, 7]) == "Nx1x"


SCALE_NONE = """\
import torch
import triton
import triton.language as tl


@triton.heuristics({"HAS_SCALE": lambda args: args["scale"] is not None})
@triton.jit
def k(x, y, scale, n, BLOCK: tl.constexpr, HAS_SCALE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0)
    if HAS_SCALE:
        v *= scale
    tl.store(y + offs, v, mask=offs < n)


def op(x, scale=None):
    y = torch.empty_like(x)
    k[(triton.cdiv(x.numel(), 1024),)](x, y, scale, x.numel(), BLOCK=1024)
    return y


def examples(device="cpu"):
    op(torch.randn(4096, device=device))
    op(torch.randn(4096, device=device), 0.5)
"""


def test_a_heuristic_on_whether_a_float_is_none_is_never_flipped(tmp_path) -> None:
    """flash-linear-attention's cumsum: ``HAS_SCALE: args['scale'] is not None`` over a float that calls pass as None
    or not. A binary with ``scale`` None and ``HAS_SCALE`` True reads the constant None and does not compile: the
    build had planned one, and its failure took the config, and the build, down."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    (tmp_path / "k.py").write_text(SCALE_NONE)
    (tmp_path / "kernel_manifest.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
        'ops = ["op"]\nsignature = { x = "*fp32", y = "*fp32", scale = "fp32", n = "i32" }\nexamples = "examples"\n')
    plan = make_plan(load_manifest(tmp_path / "kernel_manifest.toml"))
    kp = plan.kernels["k"]
    at = kp.spec_params.index("scale")
    pairs = {(b.spec[at] == "N", dict(b.heur)["HAS_SCALE"]) for e in plan.entries for rows in e.tables.values()
             for row in rows for c in row.preferences for b in plan.binaries_for(e, row.key, c)}
    assert pairs == {(True, False), (False, True)}


def test_a_none_no_binary_takes_is_named_before_packing_fails() -> None:
    from forge_aot.runtime.packing import out_of_range

    with pytest.raises(TypeError, match=r"k\(\): eps=None, and this build has no binary taking None there"):
        out_of_range("k", [], [0, None], [("x", "*fp32"), ("eps", "fp32")])


def test_an_op_file_without_kernels_launches_the_kernel_files_kernels(realworld_plan) -> None:
    """``[ops.liger_fused_linear_cross_entropy]``: its file defines no kernel and imports the cross-entropy module's
    (Liger's layout, ``ligerlike/ops/``); its op is a host module of its own, traced by its examples, whose
    launches are the imported kernels' (the kernel file is bound under the name it is imported by)."""
    flce = realworld_plan.modules["fused_linear_cross_entropy"]
    assert flce["kernels"] == [] and flce["ops"] == ["liger_fused_linear_cross_entropy"]
    assert flce["schemas"]["liger_fused_linear_cross_entropy"] == (
        "(Tensor input, Tensor weight, Tensor target, int ignore_index=-100, str reduction='mean') -> Tensor")
    assert "ligerlike.ops.liger_cross_entropy" in realworld_plan.modules["liger_cross_entropy"]["imported_as"]
    assert "from ligerlike.ops.liger_cross_entropy import" in flce["host_source"]
    built = {e.assignment["BLOCK_SIZE"] for e in realworld_plan.entries if e.kernel == "liger_element_mul"}
    assert built == {256, 32768}  # the FLCE backward scales (hidden 256) beside the CE backward (32000 columns)


def test_an_ops_entry_is_checked(tmp_path) -> None:
    (tmp_path / "k.py").write_text("import triton\n\n@triton.jit\ndef k(x):\n    pass\n\n\n"
                                   "def op(x):\n    k[(1,)](x)\n")
    (tmp_path / "op.py").write_text("def op2(x):\n    return x\n")
    head = ('[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.k]\nsource = "k.py:k"\n'
            'ops = ["op"]\nsignature = { x = "*fp32" }\n\n')
    assert_manifest_errors(tmp_path, head, (
        ('[ops.op]\nsource = "op.py"\n', "ops.op", "also exported by kernels.k"),
        ('[ops.op2]\nsource = "k.py"\n', "ops.op2.source", "defines kernels of this manifest"),
        ('[ops.op2]\nsource = "none.py"\n', "ops.op2.source", "is not a Python file"),
        ('[ops.op2]\nsource = "op.py"\nexampels = "e"\n', "ops.op2", "exampels")))


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
        assert loss.shape == () and loss.dtype == torch.float32 and z.shape == (0,)  # the padding
        loss, z = op(x, t, -100, 1e-4, 0.1, "none", 30.0, True)
        assert loss.shape == (6,) and z.shape == (6,)
        # the op file without kernels, bound by the runtime: its import of the kernel file reaches the bound module
        h, w = torch.empty(6, 256, device="cuda"), torch.empty(32000, 256, device="cuda")
        assert torch.ops.forge_test_liger_ce.liger_fused_linear_cross_entropy(h, w, t).shape == ()

    class Loss(torch.nn.Module):
        def forward(self, x, t):
            return torch.ops.forge_test_liger_ce.liger_cross_entropy(x, t)[0] * 2

    exported = torch.export.export(Loss(), (torch.randn(5, 32000), torch.randint(0, 32000, (5,))))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "forge_test_liger_ce.liger_cross_entropy.default" in targets, targets
    # functionalized (as torch.compile's AOTAutograd does): possible only because every result is a Tensor
    functional = exported.run_decompositions()
    targets = [str(n.target) for n in functional.graph.nodes if n.op == "call_function"]
    assert "auto_functionalized_v2" in targets, targets


def test_a_mutating_op_pads_with_empty_tensors_and_refuses_an_optional_result() -> None:
    """torch functionalizes a mutating custom op only where every result is a ``Tensor``: results padded by a rule
    are padded with empty tensors (the exported function drops them), and a result that is None in its own right
    leaves the op without a custom op."""
    import torch

    from forge_aot.schema import op_schema

    def op(x, flag=False):
        pass

    x = torch.zeros(3)
    padded = [((x,), {"flag": False}, torch.ones(1), [x]), ((x,), {"flag": True}, (torch.ones(1), torch.ones(2)), [x])]
    schema, _, rule = op_schema(op, padded)
    assert schema == "(Tensor(a!) x, bool flag=False) -> (Tensor, Tensor)" and rule["fill"] is True
    optional = [((x,), {}, (torch.ones(1), None), [x]), ((x,), {"flag": True}, (torch.ones(1), torch.ones(2)), [x])]
    schema, note, rule = op_schema(op, optional)
    assert schema is None and rule is None and "optional result" in note, note


# -- GPU ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jit():
    return import_fixture_file(REALWORLD / "ligerlike" / "ops" / "liger_cross_entropy.py", "_liger_cross_entropy_jit")


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


@pytest.fixture(scope="module")
def flce_jit():
    return import_fixture_file(REALWORLD / "ligerlike" / "ops" / "fused_linear_cross_entropy.py", "_liger_flce_jit")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(("rows", "scale"), [(1, 1.0), (7, 2.0), (333, 2.0), (4096, 1.0)])
def test_fused_linear_cross_entropy_against_torch_and_the_jit(realworld, flce_jit, dtype, rows, scale) -> None:
    """Chunks of rows through the imported kernel, torch's matmuls between; grad_output 2 runs the in-place
    scaling of both saved gradients (hidden 256: the built block)."""
    import torch

    torch.manual_seed(rows)
    x = torch.randn(rows, 256, device="cuda", dtype=torch_dtype(dtype)) * 0.3
    w = torch.randn(32000, 256, device="cuda", dtype=torch_dtype(dtype)) * 0.3
    t = torch.randint(0, 32000, (rows,), device="cuda")
    if rows > 1:
        t[::5] = -100
    grads = {}
    for name, fn in (("wheel", realworld.liger_fused_linear_cross_entropy),
                     ("jit", flce_jit.liger_fused_linear_cross_entropy)):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = fn(xg, wg, t)
        (loss * scale).backward()
        grads[name] = (loss, xg.grad, wg.grad)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xr @ wr.t(), t, ignore_index=-100)
    (ref * scale).backward()
    torch.cuda.synchronize()
    loss, gx, gw = grads["wheel"]
    tol = 1e-4 if dtype == "fp32" else 2e-2
    assert relative_error(loss.reshape(1), ref.reshape(1)) < tol
    assert relative_error(gx, xr.grad) < tol and relative_error(gw, wr.grad) < tol
    assert all(torch.equal(a, b) for a, b in zip(grads["wheel"], grads["jit"]))


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [{}, dict(label_smoothing=0.1, softcap=30.0, return_z_loss=True, lse_square_scale=1e-4)],
                         ids=["plain", "softcap-z-loss"])
def test_the_c_path_serves_ligers_kernels_despite_their_parameter_order(realworld, kw) -> None:
    """Liger's kernel declares constexprs between its runtime parameters (``reduction`` before ``softcap``) and is
    called by keyword; from its second call on the C path launches it (Kernel.run, the Python path, is not called)
    with the Python path's results."""
    import importlib

    import torch

    fastpath = importlib.import_module("forge_realworld._runtime.fastpath")
    if fastpath.c is None:
        pytest.skip("the installed wheel has no C launch path")
    module = importlib.import_module("forge_realworld._ops.liger_cross_entropy")
    handles = [module.liger_cross_entropy_kernel, module.element_mul_kernel]
    base = torch.randn(45, 32000, device="cuda", dtype=torch.bfloat16) * 4
    target = torch.randint(0, 32000, (45,), device="cuda")
    target[::5] = -100

    def step():
        logits = base.clone().requires_grad_()
        loss = realworld.liger_cross_entropy(logits, target, **kw)
        loss = loss[0] + loss[1] if isinstance(loss, tuple) else loss
        (loss * 3).backward()  # grad_output 3: the element-wise scaling kernel runs too
        return loss.detach(), logits.grad

    for h in handles:
        fastpath.use_c_launch(h, False)
    python_path = step()
    runs = []
    try:
        for h in handles:
            assert fastpath.use_c_launch(h, True)
            h.run = lambda g, a, k, h=h: (runs.append(h.function), type(h).run(h, g, a, k))[1]
        step()  # the first call of each (dtypes, call-site values) is the Python path's: the C path remembers it
        first = len(runs)
        c_path = step()
    finally:
        for h in handles:
            h.__dict__.pop("run", None)
    torch.cuda.synchronize()
    assert first == 2 and len(runs) == first  # the third step: every launch from C
    assert torch.equal(c_path[0], python_path[0]) and torch.equal(c_path[1], python_path[1])


@pytest.mark.gpu
def test_the_exported_loss_modules_give_the_functional_ops_results(realworld) -> None:
    """Liger's public loss modules, exported as they are from a file of their own (``[exports]``): the module and
    the functional op give the same losses and gradients, bit for bit; the z-loss comes as Liger's named tuple."""
    import torch

    loss_module = realworld.LigerCrossEntropyLoss(reduction="sum")
    assert isinstance(loss_module, torch.nn.Module) and type(loss_module).__module__ == "forge_realworld._ops.loss"
    base = torch.randn(61, 32000, device="cuda", dtype=torch.bfloat16) * 3
    target = torch.randint(0, 32000, (61,), device="cuda")
    target[::4] = -100
    by_module, by_op = base.clone().requires_grad_(), base.clone().requires_grad_()
    a = loss_module(by_module, target)
    b = realworld.liger_cross_entropy(by_op, target, reduction="sum")
    (a * 2).backward()
    (b * 2).backward()
    assert torch.equal(a, b) and torch.equal(by_module.grad, by_op.grad)
    ref, _ = _reference(base, target, "sum", 0.0, None, 0.0)
    assert relative_error(a.reshape(1), ref.reshape(1)) < 1e-5
    kw = dict(label_smoothing=0.1, softcap=30.0, return_z_loss=True, lse_square_scale=1e-4)
    out = realworld.LigerCrossEntropyLoss(**kw)(base.clone(), target)
    loss, z_loss = realworld.liger_cross_entropy(base.clone(), target, **kw)
    assert type(out).__name__ == "CrossEntropyOutput"
    assert torch.equal(out.loss, loss) and torch.equal(out.z_loss, z_loss)
    with pytest.raises(AssertionError, match="label_smoothing must be between"):
        realworld.LigerCrossEntropyLoss(label_smoothing=2.0)

    x = torch.randn(333, 256, device="cuda", dtype=torch.bfloat16)  # a hidden size the examples build
    weight = torch.randn(32000, 256, device="cuda", dtype=torch.bfloat16) * 0.05
    target = torch.randint(0, 32000, (333,), device="cuda")
    flce = realworld.LigerFusedLinearCrossEntropyLoss()
    results = []
    for call in (lambda x, w: flce(w, x, target),
                 lambda x, w: realworld.liger_fused_linear_cross_entropy(x, w, target)):
        xl, wl = x.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = call(xl, wl)
        (loss * 2).backward()
        results.append((loss.detach(), xl.grad, wl.grad))
    for got, want in zip(*results):
        assert torch.equal(got, want)


def test_launches_in_an_op_file_choose_and_are_checked_like_the_kernel_files_own(tmp_path) -> None:
    """An op file launching a kernel it imports (Liger's fused linear cross entropy runs element_mul_kernel): its
    launches count for the kernel as the kernel file's own do. A ``num_warps=`` there makes num_warps a call-site
    option (it had been left out, and the wheel refused the call at run time with NotBuiltError); a keyword the
    kernel has not is refused at build time, naming the op file; ``check`` lists the site with its file."""
    from click.testing import CliRunner

    from forge_aot.cli import main
    from forge_aot.errors import ForgeError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan, plan_summary

    (tmp_path / "k.py").write_text("import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                                   "def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):\n    pass\n\n\n"
                                   "def scale(x: torch.Tensor) -> torch.Tensor:\n"
                                   "    scale_kernel[(1,)](x, x.numel(), BLOCK=1024)\n    return x\n")
    op_file = ("import torch\n\nfrom k import scale_kernel as kern\n\n\n"
               "def scale_wide(x: torch.Tensor) -> torch.Tensor:\n"
               "    kern[(1,)](x, x.numel(), BLOCK=1024, {launch})\n    return x\n")
    head = ('[project]\nname = "p"\nversion = "0.1.0"\ntargets = ["sm_90"]\n\n[kernels.scale]\n'
            'source = "k.py:scale_kernel"\nops = ["scale"]\nsignature = {{ x_ptr = "*fp32", n = "i32" }}\n'
            'constexprs = {{ BLOCK = [1024]{warps} }}\n\n[ops.scale_wide]\nsource = "o.py"\n')
    manifest = tmp_path / "kernel_manifest.toml"
    manifest.write_text(head.format(warps=""))
    (tmp_path / "o.py").write_text(op_file.format(launch="num_warps=8"))
    with pytest.raises(ForgeError) as info:
        make_plan(load_manifest(manifest))
    assert "num_warps" in str(info.value) and "scale_wide() in o.py line 7" in str(info.value), str(info.value)
    manifest.write_text(head.format(warps=", num_warps = [4, 8]"))
    plan = make_plan(load_manifest(manifest))
    assert "num_warps" in plan.kernels["scale"].axes
    sites = plan_summary(plan)["scale"]["launches"]
    assert [(s["function"], s.get("file")) for s in sites] == [("scale", None), ("scale_wide", "o.py")]
    result = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert "launched in scale_wide() in o.py line 7: passes BLOCK, num_warps" in result.output, result.output
    (tmp_path / "o.py").write_text(op_file.format(launch="nmu_warps=8"))
    with pytest.raises(ForgeError) as info:
        make_plan(load_manifest(manifest))
    assert f"{tmp_path / 'o.py'}:7: scale_wide() passes nmu_warps= to scale_kernel" in str(info.value)
    # through the module: ``import k as kmod`` then ``kmod.scale_kernel[grid](...)``
    (tmp_path / "o.py").write_text(op_file.replace("from k import scale_kernel as kern", "import k as kmod")
                                   .replace("kern[(1,)]", "kmod.scale_kernel[(1,)]").format(launch="nmu_warps=8"))
    with pytest.raises(ForgeError) as info:
        make_plan(load_manifest(manifest))
    assert f"{tmp_path / 'o.py'}:7: scale_wide() passes nmu_warps= to scale_kernel" in str(info.value)
