"""Constexpr defaults the source computes, as vLLM's prefix_prefill writes them: ``FP8_MIN: tl.constexpr =
float8_info.min`` with ``float8_info = torch.finfo(...)`` at import, and a default naming a module value that is no
literal (``2 ** 10``). The build read only literal defaults, so such a parameter had none: the library's own launch,
which leaves it out, failed in the examples ("missing the constexpr argument 'FP8_MIN'"). Now the plan takes the
value the imported kernel's function holds.

CPU: the plan's defaults and variants. GPU: the wheel in a fresh process against torch."""

from __future__ import annotations

from pathlib import Path

import pytest

KERNEL = '''\
import torch
import triton
import triton.language as tl

float8_info = torch.finfo(torch.float8_e4m3fn)
DEFAULT_BLOCK = 2 ** 8
ACC_TYPE = tl.float32


@triton.jit
def clamp_kernel(x, out, n, BLOCK: tl.constexpr = DEFAULT_BLOCK,
                 FP8_MIN: tl.constexpr = float8_info.min,
                 FP8_MAX: tl.constexpr = float8_info.max,
                 ACC: tl.constexpr = ACC_TYPE):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.clamp(tl.load(x + offs, mask=m).to(ACC), FP8_MIN, FP8_MAX)
    tl.store(out + offs, y, mask=m)


def clamp_fp8_range(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    clamp_kernel[(triton.cdiv(n, DEFAULT_BLOCK),)](x, out, n)
    return out


def examples(device="cuda"):
    for n in (1000, 4099):
        clamp_fp8_range(torch.randn(n, device=device) * 1000)
'''


def _project(root: Path) -> Path:
    from tests.test_localmods import one_file_project

    return one_file_project(root, "forge_test_defaults", KERNEL, "clamp_kernel", ["clamp_fp8_range"],
                            'signature = { x = "*fp32" }\n')


def test_defaults_the_source_computes_are_the_imported_kernels() -> None:
    import tempfile

    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    with tempfile.TemporaryDirectory() as tmp:
        plan = make_plan(load_manifest(_project(Path(tmp) / "p")), ["sm_90"])
    (kernel,) = plan.kernels.values()
    assert kernel.constexpr_defaults == {"BLOCK": 256, "FP8_MIN": -448.0, "FP8_MAX": 448.0, "ACC": "tl.float32"}
    assert {e.variant for e in plan.entries} == {"BLOCK=256,FP8_MIN=-448.0,FP8_MAX=448.0,ACC=tl.float32"}


def test_a_default_of_another_kind_is_named(tmp_path: Path) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    manifest = _project(tmp_path / "p")
    k = tmp_path / "p" / "k.py"
    k.write_text(k.read_text().replace("float8_info.min,", "float8_info,"))
    with pytest.raises(SourceError, match=r"constexpr parameter 'FP8_MIN' is a finfo"):
        make_plan(load_manifest(manifest), ["sm_90"])


@pytest.mark.gpu
def test_the_wheel_launches_with_the_computed_defaults(tmp_path: Path) -> None:
    from tests.test_localmods import wheel_max_error

    # 4 bytes past the allocation; values beyond the clamp
    assert wheel_max_error(_project(tmp_path / "p"), tmp_path, "forge_test_defaults", "clamp_fp8_range",
                           "x.clamp(-448.0, 448.0)", (1000, 4099, 77), scale=" * 1000") == 0.0
