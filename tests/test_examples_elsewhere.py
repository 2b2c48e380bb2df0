"""A kernel whose examples are another file's: Liger-Kernel keeps ``element_mul_kernel`` in ``ops/utils.py`` and
launches it from its cross entropy's host code (``ops/cross_entropy.py``), so the examples that launch it are that
file's. ``examples = "path/to/file.py:function"`` names them (session 39's hunt had to type the kernel by hand, and its
specializations were guessed: Liger's bias path passes stride 1 and n_cols 1).

CPU: the plan types the kernel from the other file's calls and builds what they pass. GPU: the wheel against torch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

UTILS = '''\
import triton
import triton.language as tl


def calculate_settings(n):
    return triton.next_power_of_2(n), 4


@triton.jit
def element_mul_kernel(X_ptr, X_stride, grad_output_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    program_id = tl.program_id(0).to(tl.int64)
    X_ptr += program_id * X_stride
    grad_output = tl.load(grad_output_ptr)
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols)
        tl.store(X_ptr + X_offsets, X_block * grad_output, mask=X_offsets < n_cols)
'''

SQUARE = '''\
import torch
import triton
import triton.language as tl

from pkg.ops.utils import calculate_settings, element_mul_kernel


@triton.jit
def _square_kernel(X_ptr, Y_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    x = tl.load(X_ptr + row * n_cols + offs, mask=offs < n_cols)
    tl.store(Y_ptr + row * n_cols + offs, x * x, mask=offs < n_cols)


def square_scaled(x: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    n_rows, n_cols = x.shape
    BLOCK_SIZE, num_warps = calculate_settings(n_cols)
    y = torch.empty_like(x)
    _square_kernel[(n_rows,)](x, y, n_cols, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    element_mul_kernel[(n_rows,)](y, y.stride(-2), grad_output, n_cols, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    return y


def examples(device="cuda"):
    for n_rows, n_cols in ((4, 1000), (3, 4096), (1, 1)):
        square_scaled(torch.randn(n_rows, n_cols, device=device), torch.tensor(0.5, device=device))
'''


def _project(root: Path) -> Path:
    (root / "pkg" / "ops").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "ops" / "__init__.py").write_text("")
    (root / "pkg" / "ops" / "utils.py").write_text(UTILS)
    (root / "pkg" / "ops" / "square.py").write_text(SQUARE)
    (root / "kernel_manifest.toml").write_text(textwrap.dedent('''\
        [project]
        name = "forge_test_elsewhere"
        version = "0.1.0"
        targets = ["sm_90"]

        [kernels.square]
        source = "pkg/ops/square.py:_square_kernel"
        ops = ["square_scaled"]
        examples = "examples"

        [kernels.element_mul]
        source = "pkg/ops/utils.py:element_mul_kernel"
        examples = "pkg/ops/square.py:examples"
    '''))
    return root / "kernel_manifest.toml"


def test_the_kernel_is_typed_and_built_from_the_other_files_examples(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    plan = make_plan(load_manifest(_project(tmp_path / "p")), ["sm_90"])
    kp = plan.kernels["element_mul"]
    assert kp.params[:4] == [("X_ptr", "*fp32"), ("X_stride", "i32"), ("grad_output_ptr", "*fp32"), ("n_cols", "i32")]
    assert {e.variant for e in plan.entries if e.kernel == "element_mul"} == {
        "BLOCK_SIZE=1,num_warps=4", "BLOCK_SIZE=1024,num_warps=4", "BLOCK_SIZE=4096,num_warps=4"}
    # the specializations the calls pass: stride and n_cols divisible by 16, or equal to 1 (the one-column rows)
    specs = {b.spec for e in plan.entries if e.kernel == "element_mul" for b in plan.binaries_for(
        e, e.tables["default"][0].key, e.tables["default"][0].preferences[0])}
    assert any("1" in s for s in specs) and any(s.count("D") >= 3 for s in specs), specs


def test_examples_of_a_file_outside_the_package_are_named(tmp_path: Path) -> None:
    from forge_aot.errors import ManifestError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    manifest = _project(tmp_path / "p")
    manifest.write_text(manifest.read_text().replace('"pkg/ops/square.py:examples"', '"pkg/other.py:examples"'))
    with pytest.raises(ManifestError, match=r"pkg/other.py is no file of the project"):
        make_plan(load_manifest(manifest), ["sm_90"])
    manifest.write_text(manifest.read_text().replace('"pkg/other.py:examples"', '"pkg/ops/square.py:exampels"'))
    with pytest.raises(ManifestError, match=r"no host function 'exampels' in pkg/ops/square.py"):
        make_plan(load_manifest(manifest), ["sm_90"])


@pytest.mark.gpu
def test_the_wheel_launches_both_kernels(tmp_path: Path) -> None:
    from tests.test_localmods import _installed, _run_fresh

    target = _installed(_project(tmp_path / "p"), tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = sys.modules["pkg"] = None
        import torch, forge_test_elsewhere
        errs = []
        for n_rows, n_cols in ((4, 1000), (3, 4096), (7, 1000)):
            x = torch.randn(n_rows * n_cols + 1, device="cuda")[1:].view(n_rows, n_cols)  # 4 bytes past
            g = torch.tensor(0.5, device="cuda")
            y = forge_test_elsewhere.square_scaled(x, g)
            errs.append((y.double() - x.double() ** 2 * 0.5).abs().max().item())
        print(json.dumps({"max_err": max(errs)}))
        ''')
    assert _run_fresh(code, target)["max_err"] < 1e-5
