"""An op exported under another name of its host function, as SGLang keeps an old name for its quantization op
(``per_token_group_quant_fp8 = _per_token_group_quant_8bit_raw``): the alias was no host function, and the manifest's
``ops`` entry naming it was refused ("no host function 'per_token_group_quant_fp8'").

CPU: the plan's op, its schema and the shipped lines. GPU: the wheel's op against torch in a fresh process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

KERNEL = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3, mask=offs < n)


def _scale_raw(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
    return y


# backward compatibility
scale_by_three = _scale_raw


def examples(device="cuda"):
    scale_by_three(torch.randn(1000, device=device))
'''


def _project(root: Path) -> Path:
    from tests.test_localmods import one_file_project

    return one_file_project(root, "forge_test_alias", KERNEL, "_scale_kernel", ["scale_by_three"])


def test_an_op_may_be_another_name_of_a_host_function(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    plan = make_plan(load_manifest(_project(tmp_path / "p")), ["sm_90"])
    (mod,) = plan.modules.values()
    assert mod["ops"] == ["scale_by_three"]
    assert mod["schemas"]["scale_by_three"] == "(Tensor x) -> Tensor"
    assert "scale_by_three = _scale_raw\n" in mod["host_source"] and "def _scale_raw(" in mod["host_source"]
    assert "def examples" not in mod["host_source"]


@pytest.mark.gpu
def test_the_wheel_exports_the_op_under_its_other_name(tmp_path: Path) -> None:
    from tests.test_localmods import _installed, _run_fresh

    target = _installed(_project(tmp_path / "p"), tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        import torch, forge_test_alias
        x = torch.randn(4097, device="cuda")
        errs = [(forge_test_alias.scale_by_three(x) - x * 3).abs().max().item(),
                (torch.ops.forge_test_alias.scale_by_three(x) - x * 3).abs().max().item()]
        print(json.dumps({"max_err": max(errs)}))
        ''')
    assert _run_fresh(code, target)["max_err"] == 0.0
