"""A ``@triton.heuristics`` that computes ``num_ctas``, as Cut Cross-Entropy's do: it builds its heuristics from
``triton.Config.all_kwargs()``, which in Triton 3.x always holds ``num_ctas: 1``. The build refused the kernel ("neither
a tl.constexpr parameter nor a launch option it may set"); now ``num_ctas`` is one like ``num_warps``, each value part
of the binary's identity (a value other than 1, thread-block clusters, fails that binary's compile: the loader cannot
launch clusters).

CPU: the plan's launch heuristics and binaries. GPU: the wheel against torch."""

from __future__ import annotations

from pathlib import Path

import pytest

KERNEL = '''\
import torch
import triton
import triton.language as tl

# what Cut Cross-Entropy's heuristics hold: a config's all_kwargs(), num_ctas included
@triton.heuristics({"BLOCK": lambda args: 128, "num_warps": lambda args: 4, "num_stages": lambda args: 2,
                    "num_ctas": lambda args: 1})
@triton.jit
def _scale_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[lambda META: (triton.cdiv(n, META["BLOCK"]),)](x, y, n)
    return y


def examples(device="cuda"):
    for n in (1001, 4096):
        scale(torch.randn(n, device=device))
'''


def _project(root: Path) -> Path:
    from tests.test_localmods import one_file_project

    return one_file_project(root, "forge_test_num_ctas", KERNEL, "_scale_kernel", ["scale"], entry="scale")


def test_a_heuristic_may_compute_num_ctas(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    plan = make_plan(load_manifest(_project(tmp_path / "p")), ["sm_90"])
    kp = plan.kernels["scale"]
    assert "num_ctas" in kp.launch_heuristics and "num_warps" in kp.launch_heuristics
    heur = {dict(b.heur).get("num_ctas") for e in plan.entries for rows in e.tables.values() for row in rows
            for b in plan.binaries_for(e, row.key, row.preferences[0])}
    assert heur == {1}


def test_check_and_inspect_say_the_heuristics_give_warps_and_stages(tmp_path: Path) -> None:
    """Cut Cross-Entropy's binaries run with the warps and stages its heuristics compute, while ``check --plan`` and
    ``inspect`` showed only the space's config (``w4-s3``) and ``inspect`` joined a row's dozens of
    specializations into one 16 kB cell. Both say where warps and stages come from; ``inspect`` shows three."""
    import json

    from click.testing import CliRunner

    from forge_aot.cli import _specializations, main
    from forge_aot.package import read_wheel
    from forge_aot.pipeline import build

    manifest = _project(tmp_path / "p")
    check = CliRunner().invoke(main, ["check", "--manifest", str(manifest)])
    assert "num_warps, num_stages, num_ctas: computed by @triton.heuristics for each binary" in check.output, \
        check.output
    wheel = build(manifest, out_dir=tmp_path / "dist", build_dir=tmp_path / "work").wheel
    rows = read_wheel(wheel)["rows"]
    assert rows and all(r["launch_heuristics"] == ["num_warps", "num_stages", "num_ctas"] for r in rows)
    shown = CliRunner().invoke(main, ["inspect", str(wheel)]).output
    assert "(num_warps/num_stages/num_ctas by heuristics)" in shown, shown
    assert json.loads(CliRunner().invoke(main, ["inspect", "--json", str(wheel)]).output)["rows"] == rows
    assert _specializations(["a", "b"]) == "a+b" and _specializations(list("abcde")) == "a+b+c+… (5)"


@pytest.mark.gpu
def test_the_wheel_launches_the_kernel(tmp_path: Path) -> None:
    from tests.test_localmods import wheel_max_error

    assert wheel_max_error(_project(tmp_path / "p"), tmp_path, "forge_test_num_ctas", "scale", "x * 2",
                           (1001, 4096, 77)) == 0.0
