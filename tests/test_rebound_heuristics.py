"""``@triton.heuristics`` applied by rebinding the kernel after its def, as Cut Cross-Entropy and Unsloth write it
(``K = triton.heuristics({...})(K)``). Each rebinding wraps everything before it, so Triton runs it first: Cut
Cross-Entropy rebinds heuristics that set ``BLOCK_D`` over one that reads ``args["BLOCK_D"]``. The host copy
registered the rebound values after those before them, in the file's order, and the build refused the kernel
("the host copy ... gives ['EVEN', 'BLOCK', ...], the decorator ['BLOCK', ..., 'EVEN']"); a rebound heuristics now
registers before them, so the packaged host code runs every kernel's heuristics in Triton's order.

CPU: the split host code, the plan's heuristic order and its binaries. GPU: the wheel against torch, where each
heuristic reads the one set before it."""

from __future__ import annotations

from pathlib import Path

import pytest

KERNEL = '''\
import torch
import triton
import triton.language as tl


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _scale_kernel(X, Y, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(Y + offs, tl.load(X + offs) * 2)
    else:
        tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


# applied after the decorators, each wrapping what is above it: Triton runs BLOCK, then num_warps, then EVEN
_scale_kernel = triton.heuristics({"num_warps": lambda args: 4 if args["BLOCK"] <= 256 else 8})(_scale_kernel)
_scale_kernel = triton.heuristics({"BLOCK": lambda args: 128})(_scale_kernel)


def scale(x):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[lambda META: (triton.cdiv(n, META["BLOCK"]),)](x, y, n)
    return y


def examples(device="cuda"):
    for n in (1001, 1024):
        scale(torch.randn(n, device=device))
'''


def _project(root: Path) -> Path:
    from tests.test_localmods import one_file_project

    return one_file_project(root, "forge_test_rebound", KERNEL, "_scale_kernel", ["scale"], entry="scale")


def test_a_rebound_heuristics_registers_before_those_it_wraps(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan
    from forge_aot.sourcesplit import parse_source

    manifest = _project(tmp_path / "p")
    host = parse_source(manifest.parent / "k.py", {"scale"}).host_source.splitlines()
    assert host[5].startswith("__forge_heuristics__('_scale_kernel', {\"EVEN\"") and host[5].endswith("})")
    rebound = [line for line in host if line.startswith("__forge_heuristics__(") and line.endswith(", True)")]
    assert [line.split("{")[1].split(":")[0] for line in rebound] == ['"num_warps"', '"BLOCK"']
    plan = make_plan(load_manifest(manifest), ["sm_90"])
    kp = plan.kernels["scale"]
    assert [name for name, _ in kp.heuristics] == ["BLOCK", "num_warps", "EVEN"]
    binaries = {(dict(b.heur)["BLOCK"], dict(b.heur)["EVEN"], dict(b.heur)["num_warps"]) for e in plan.entries
                for rows in e.tables.values() for row in rows
                for b in plan.binaries_for(e, row.key, row.preferences[0])}
    assert binaries == {(128, False, 4), (128, True, 4)}


@pytest.mark.gpu
def test_the_wheel_runs_the_heuristics_in_tritons_order(tmp_path: Path) -> None:
    from tests.test_localmods import wheel_max_error

    assert wheel_max_error(_project(tmp_path / "p"), tmp_path, "forge_test_rebound", "scale", "x * 2",
                           (1001, 1024, 77, 4096)) == 0.0


TRY_REBOUND = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if EVEN:
        tl.store(y_ptr + offs, tl.load(x_ptr + offs))
    else:
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


try:  # TransformerEngine's permutation.py applies its autotuners so
    _copy_kernel = triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK_SIZE"] == 0})(_copy_kernel)
    _copy_kernel = triton.autotune(
        configs=[triton.Config({"BLOCK_SIZE": 128}), triton.Config({"BLOCK_SIZE": 256})],
        key=["n"],
    )(_copy_kernel)
except RuntimeError:
    pass


def copy(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _copy_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK_SIZE"]),)](x, y, x.numel())
    return y


def examples(device="cuda"):
    for n in (1000, 1024):
        copy(torch.randn(n, device=device))
'''


def test_decorators_rebound_inside_a_try_are_the_kernels(tmp_path: Path) -> None:
    """TransformerEngine wraps each rebinding in ``try:`` / ``except RuntimeError: pass``: the build read the kernel
    as a plain ``@triton.jit`` (its host functions blanked, "no host function 'examples'", then "missing the constexpr
    argument 'BLOCK_SIZE'"). A ``try`` whose body only rebinds kernels with Triton's decorators and whose handlers
    only pass applies them, as the build's own import does."""
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan
    from forge_aot.sourcesplit import parse_source
    from tests.test_localmods import one_file_project

    manifest = one_file_project(tmp_path / "p", "forge_test_try_rebound", TRY_REBOUND, "_copy_kernel", ["copy"],
                                entry="copy")
    src = parse_source(manifest.parent / "k.py", {"copy"})
    assert src.kernels["_copy_kernel"].decorators == ("autotune", "heuristics", "jit")
    assert "examples" in src.host_functions and "copy" in src.host_functions
    kp = make_plan(load_manifest(manifest), ["sm_90"]).kernels["copy"]
    assert [c.meta["BLOCK_SIZE"] for c in kp.space] == [128, 256] and kp.key == ["n"]
    assert [n for n, _ in kp.heuristics] == ["EVEN"]
    # a handler that does more than pass (another kernel, say) is no plain rebinding: left as it was
    other = TRY_REBOUND.replace("except RuntimeError:\n    pass", "except RuntimeError:\n    _copy_kernel = None")
    (manifest.parent / "k.py").write_text(other)
    assert parse_source(manifest.parent / "k.py", {"copy"}).kernels["_copy_kernel"].decorators == ("jit",)
