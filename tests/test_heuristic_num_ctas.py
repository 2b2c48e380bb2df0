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


@pytest.mark.gpu
def test_the_wheel_launches_the_kernel(tmp_path: Path) -> None:
    from tests.test_localmods import wheel_max_error

    assert wheel_max_error(_project(tmp_path / "p"), tmp_path, "forge_test_num_ctas", "scale", "x * 2",
                           (1001, 4096, 77)) == 0.0
