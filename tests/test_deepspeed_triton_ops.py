"""DeepSpeed's ``ops/triton_ops`` (tests/fixtures/realworld/dslike, DeepSpeed 0.19.8's files unchanged but for the
package name): SwiGLU (plain and packed), the fused RMSNorm and the autotuned grouped GEMM, forward and backward.

Every kernel there is defined under ``if _TRITON_AVAILABLE:``, a flag the kernel files import from
``_triton.py``, which computes it in a ``try`` that asks Triton's backends for an active GPU and sets it False
``except Exception``. The build refused the files ("a @triton.jit function inside the if block ... move them out"),
and the wheel's copy of ``_triton.py`` would have said False (its ``try`` has Triton imports only the build has),
so ``swiglu`` would have run its eager fallback, silently. The build now reads that ``try`` as it runs it, the
flag True (``sourcesplit._triton_guard``), and follows the flag into the kernel files' ``if`` blocks.

CPU: the guard's reading, the plan, a wheel whose shipped flag is True and whose op launches. GPU: each op against
fp64 on odd shapes and a misaligned input, forward and backward, the kernels seen launching."""

from __future__ import annotations

import ast
import itertools
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REALWORLD, launched_specs, offset_view, reset_handle

DSLIKE = REALWORLD / "dslike" / "ops" / "triton_ops"
KERNELS = {"swiglu_triton": ["_swiglu_fwd_kernel", "_swiglu_bwd_kernel", "_swiglu_packed_fwd_kernel",
                             "_swiglu_packed_bwd_kernel"],
           "fused_rms_norm": ["_rms_norm_forward_kernel", "_rms_norm_dx_kernel", "_rms_norm_dweight_partial_kernel"],
           "group_gemm_triton": ["_group_gemm_kernel", "_group_gemm_dw_kernel", "_group_meta_kernel"]}


def test_an_availability_flag_computed_in_a_try_reads_as_the_build_runs_it() -> None:
    """``_TRITON_AVAILABLE = any(b.driver.is_active() ...)`` in a ``try`` whose handler sets it False: the body,
    the flag written True on its own line (every line keeps its number)."""
    from forge_aot.sourcesplit import _triton_guard

    path = DSLIKE / "_triton.py"
    text = path.read_text()
    shipped, _, _ = _triton_guard(text, ast.parse(text), path)
    assert len(shipped.splitlines()) == len(text.splitlines())
    assert "_TRITON_AVAILABLE = (True)\n" in shipped and "try:" not in shipped and "except" not in shipped
    assert "_TRITON_AVAILABLE = False" not in shipped


@pytest.mark.parametrize("handlers", [["except Exception:", "    _HAS = None"],
                                      ["except ImportError:", "    _HAS = False", "except Exception:", "    pass"],
                                      ["except Exception:", "    pass"]])
def test_a_computed_name_not_set_false_by_every_handler_is_no_flag(tmp_path: Path, handlers: list[str]) -> None:
    """A name a handler sets to None (an object, not a flag), or that one of the handlers leaves unset: the ``try``
    is not read as the build's, and the file's ``if`` on the name is not decided."""
    from forge_aot.sourcesplit import _triton_guard

    text = "\n".join(["try:", "    import triton", "    _HAS = callable(triton.jit) and bool(len(__name__))",
                      *handlers, "if _HAS:", "    x = 1", ""])
    shipped, tree, decide = _triton_guard(text, ast.parse(text), tmp_path / "m.py")
    assert "try:" in shipped and decide(tree.body[-1].test) is None


def test_a_flag_imported_from_a_project_module_decides_the_kernel_block(tmp_path: Path) -> None:
    """``from ._triton import _TRITON_AVAILABLE`` (relative) and ``from pkg._triton import ...`` (absolute): the
    flag's value in that module as the build reads it; a flag that module leaves undecided decides nothing."""
    from forge_aot.sourcesplit import _triton_guard

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_triton.py").write_text((DSLIKE / "_triton.py").read_text() + "OTHER = len(__name__) > 0\n")
    for module in ("._triton", "pkg._triton"):
        text = f"from {module} import _TRITON_AVAILABLE, OTHER\n" \
            "if _TRITON_AVAILABLE:\n    x = 1\nif not _TRITON_AVAILABLE:\n    y = 1\nif OTHER:\n    z = 1\n"
        _, tree, decide = _triton_guard(text, ast.parse(text), pkg / "k.py")
        assert [decide(s.test) for s in tree.body[1:]] == [True, False, None]


def test_every_kernel_under_the_flag_is_read_at_module_level() -> None:
    from forge_aot.sourcesplit import parse_source

    for stem, kernels in KERNELS.items():
        source = parse_source(DSLIKE / f"{stem}.py")
        assert sorted(source.kernels) == sorted(kernels), stem
        assert "_TRITON_AVAILABLE = (True)" not in source.shipped_source(set())  # the kernel files' own flag is read


def test_the_plan_takes_deepspeeds_ops_with_their_call_site_values(realworld_plan) -> None:
    for stem, kernels in KERNELS.items():
        assert sorted(realworld_plan.modules[stem]["kernels"]) == sorted(kernels)
    assert {e.assignment["NUM_GROUPS"] for e in realworld_plan.entries if e.kernel == "ds_group_gemm"} == {4}
    assert {e.assignment["n_cols"] for e in realworld_plan.entries if e.kernel == "ds_rms_norm_fwd"} == {300, 2048}


def _ds_project(root: Path) -> Path:
    """The fixture's dslike package with the realworld manifest's DeepSpeed entries, as a project of its own."""
    import shutil

    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib

    shutil.copytree(REALWORLD / "dslike", root / "dslike")
    entries = tomllib.loads((REALWORLD / "kernel_manifest.toml").read_text())["kernels"]
    text = '[project]\nname = "forge_ds"\nversion = "0.1.0"\ntargets = ["sm_90"]\n'
    for name, entry in entries.items():
        if name.startswith("ds_"):
            text += f"\n[kernels.{name}]\n" + "".join(
                f"{k} = {_toml(v)}\n" for k, v in entry.items() if k != "targets")
    (root / "kernel_manifest.toml").write_text(text)
    return root / "kernel_manifest.toml"


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f'"{value}"'


def test_the_wheels_flag_is_the_builds_and_its_ops_launch_their_kernels(tmp_path: Path) -> None:
    """The shipped ``_triton.py`` says True, and in a process without Triton ``swiglu`` goes to its kernel (which
    refuses a CPU tensor, naming the kernel) rather than to the eager fallback, which would have returned."""
    from tests.test_localmods import _installed, _run_fresh

    site = _installed(_ds_project(tmp_path / "p"), tmp_path)
    shipped = (site / "forge_ds" / "_ops" / "_local" / "dslike" / "ops" / "triton_ops" / "_triton.py").read_text()
    assert "_TRITON_AVAILABLE = (True)\n" in shipped, shipped
    check = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_ds
        try:
            forge_ds.swiglu(torch.randn(3, 5), torch.randn(3, 5))
            refused = ""
        except Exception as exc:
            refused = f"{type(exc).__name__}: {exc}"
        flags = [sys.modules[m]._TRITON_AVAILABLE for m in ("forge_ds._ops.swiglu_triton",
                                                            "forge_ds._ops._local.dslike.ops.triton_ops._triton")]
        half = dict(device="meta", dtype=torch.float16)
        meta = torch.ops.forge_ds.group_gemm_triton(torch.empty(77, 64, **half), torch.empty(4, 64, 80, **half),
                                                    torch.empty(4, dtype=torch.int32, device="meta"))
        print(json.dumps({"flags": flags, "refused": refused, "meta": list(meta.shape)}))
        ''')
    out = _run_fresh(check, site)
    assert out["flags"] == [True, True], out
    assert out["refused"].startswith("UnsupportedDeviceError: _swiglu_fwd_kernel()"), out
    assert out["meta"] == [77, 80]


# -- GPU ---------------------------------------------------------------------------------------------------------


def _swiglu_ref(gate, up):
    import torch

    g, u = gate.double(), up.double()
    return torch.nn.functional.silu(g) * u


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("misaligned", [False, True])
def test_swiglu_and_packed_against_fp64_forward_and_backward(realworld, dtype, misaligned) -> None:
    import torch

    from tests.conftest import torch_dtype

    dt = torch_dtype(dtype)
    tol = {"fp16": 4e-3, "bf16": 3e-2, "fp32": 1e-5}[dtype]
    g = torch.Generator(device="cuda").manual_seed(7)
    gate = torch.randn(7, 3, 37, device="cuda", dtype=dt, generator=g)
    up = torch.randn(7, 3, 37, device="cuda", dtype=dt, generator=g)
    gate, up = (offset_view(gate), offset_view(up)) if misaligned else (gate, up)
    gate.requires_grad_(True)
    up.requires_grad_(True)
    module = "forge_realworld._ops.swiglu_triton"
    for fn in KERNELS["swiglu_triton"]:
        reset_handle(module, fn)
    out = realworld.swiglu(gate, up)
    grad = torch.randn_like(out)
    out.backward(grad)
    g64, u64 = gate.detach().double().requires_grad_(True), up.detach().double().requires_grad_(True)
    ref = _swiglu_ref(g64, u64)
    ref.backward(grad.double())
    assert out.dtype == dt and torch.allclose(out.double(), ref, rtol=tol, atol=tol)
    assert torch.allclose(gate.grad.double(), g64.grad, rtol=tol, atol=tol)
    assert torch.allclose(up.grad.double(), u64.grad, rtol=tol, atol=tol)
    gate_up = torch.cat([gate.detach(), up.detach()], dim=-1)  # the packed layout, I = 37 as built
    gate_up = (offset_view(gate_up) if misaligned else gate_up).requires_grad_(True)
    packed = realworld.swiglu_packed(gate_up)
    packed.backward(grad)
    gu64 = gate_up.detach().double().requires_grad_(True)
    ref_packed = _swiglu_ref(*gu64.chunk(2, dim=-1))
    ref_packed.backward(grad.double())
    assert torch.allclose(packed.double(), ref_packed, rtol=tol, atol=tol)
    assert torch.allclose(gate_up.grad.double(), gu64.grad, rtol=tol, atol=tol)
    for fn in KERNELS["swiglu_triton"]:  # the kernels ran, not the eager fallback
        assert launched_specs(module, fn), fn


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "n_cols", "misaligned"), [("fp16", 300, True), ("bf16", 2048, False),
                                                             ("bf16", 300, False)])
def test_fused_rms_norm_against_fp64_forward_and_backward(realworld, dtype, n_cols, misaligned) -> None:
    import torch

    from tests.conftest import torch_dtype

    dt = torch_dtype(dtype)
    tol = 2e-2 if dtype == "bf16" else 4e-3
    g = torch.Generator(device="cuda").manual_seed(n_cols)
    hidden = torch.randn(3, 13, n_cols, device="cuda", dtype=dt, generator=g)
    hidden = (offset_view(hidden) if misaligned else hidden).requires_grad_(True)
    weight = torch.randn(n_cols, device="cuda", dtype=dt, generator=g).requires_grad_(True)
    module = "forge_realworld._ops.fused_rms_norm"
    for fn in KERNELS["fused_rms_norm"]:
        reset_handle(module, fn)
    out = realworld.fused_rms_norm(hidden, weight, 1e-6)
    grad = torch.randn_like(out)
    out.backward(grad)
    h64, w64 = hidden.detach().double().requires_grad_(True), weight.detach().double().requires_grad_(True)
    ref = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    ref.backward(grad.double())
    assert out.shape == hidden.shape and torch.allclose(out.double(), ref, rtol=tol, atol=tol)
    assert torch.allclose(hidden.grad.double(), h64.grad, rtol=tol, atol=tol)
    assert (weight.grad.double() - w64.grad).abs().max() <= tol * w64.grad.abs().max()
    for fn in KERNELS["fused_rms_norm"]:
        assert launched_specs(module, fn), fn


@pytest.mark.gpu
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_group_gemm_against_fp64_forward_and_backward(realworld, trans_b, dtype) -> None:
    """Four groups (the built NUM_GROUPS) of 0, 31, 1 and 45 rows: an empty group and a one-row group; the autotuned
    kernels take the wheel's table."""
    import torch

    from tests.conftest import torch_dtype

    dt = torch_dtype(dtype)
    g = torch.Generator(device="cuda").manual_seed(3)
    offs = torch.tensor([0, 31, 32, 77], device="cuda", dtype=torch.int32)
    mat_a = torch.randn(77, 64, device="cuda", dtype=dt, generator=g).requires_grad_(True)
    shape = (4, 80, 64) if trans_b else (4, 64, 80)
    mat_b = (torch.randn(*shape, device="cuda", dtype=dt, generator=g) / 8).requires_grad_(True)
    module = "forge_realworld._ops.group_gemm_triton"
    for fn in KERNELS["group_gemm_triton"]:
        reset_handle(module, fn)
    out = realworld.group_gemm_triton(mat_a, mat_b, offs, trans_b=trans_b)
    grad = torch.randn_like(out)
    out.backward(grad)
    a64, b64 = mat_a.detach().double().requires_grad_(True), mat_b.detach().double().requires_grad_(True)
    bounds = [0, *offs.tolist()]
    ref = torch.cat([a64[s:e] @ (b64[i].T if trans_b else b64[i])
                     for i, (s, e) in enumerate(itertools.pairwise(bounds))])
    ref.backward(grad.double())
    tol = 3e-2 if dtype == "bf16" else 5e-3
    for got, want in ((out, ref), (mat_a.grad, a64.grad), (mat_b.grad, b64.grad)):
        assert (got.double() - want).abs().max() <= tol * max(want.abs().max().item(), 1.0)
    for fn in KERNELS["group_gemm_triton"]:
        assert launched_specs(module, fn), fn
