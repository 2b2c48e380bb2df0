"""Decorators a project helper module returns, applied to a kernel after its def, as Cut Cross-Entropy writes
them (``tl_autotune.py`` in cut-cross-entropy 25.1.1): ``K = triton.jit(K)``, ``K = triton.heuristics({...})(K)``,
then ``K = cce_forward_autotune()(K)``, where the helper returns ``triton.autotune(configs=..., prune_configs_by=
{"perf_model": ...})`` if ``CCE_AUTOTUNE`` is set and else ``triton.heuristics`` built from the fixed best
``triton.Config``'s ``all_kwargs()``. The helper's return annotations name ``triton.runtime.autotuner`` and its
perf model uses ``triton.testing``. The build stopped at the first ``running the host code failed: 'TraceKernel'
object has no attribute 'arg_names'`` (Triton's own ``heuristics`` applied to the recording handle), and the helper
module could not be shipped (host code reaching ``triton.testing``, annotations evaluated at the def).

Now the build reads the decorators from the kernel Triton builds; the packaged host code applies the helper's
heuristics through the runtime's ``triton.heuristics`` / ``triton.Config``, outermost, so they run in Triton's
order; what only the ``triton.autotune(...)`` call's arguments name stays Triton code (stand-ins), the annotations
naming Triton ship as strings, and the packaged ``triton.autotune`` raises a clear error if the environment asks
for it at run time. A build whose environment took the autotune branch is refused with what to do.

CPU: the split helper, the plan, the wheel's host module in a fresh process without Triton (its heuristics and
their order, the autotune branch's error), the refused build. GPU: the wheel against torch."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

HELPER = '''\
# Copyright notice and style of cut_cross_entropy/tl_autotune.py: no ``from __future__ import annotations``
import os
from typing import Callable

import triton
from triton import Config
from triton.runtime import autotuner
from triton.testing import get_dram_gbps

_AUTOTUNE: bool = os.getenv("FORGE_TEST_AUTOTUNE", "0") != "0"


def estimate_time(num_warps, num_stages, n, **kwargs) -> float:
    return n * 2 / get_dram_gbps() + num_warps * 1e-6  # a perf model: Triton's testing helpers


def get_autotune_config():
    return [Config(dict(BLOCK=b), num_warps=w, num_stages=2) for b in (64, 128) for w in (2, 4)]


def _heuristics_from_config(config: Config) -> Callable[..., autotuner.Heuristics]:
    return triton.heuristics({k: (lambda args, _v=v: _v) for k, v in config.all_kwargs().items()})


def _best_config() -> Config:
    return Config(dict(BLOCK=128), num_warps=4, num_stages=2)


def scale_autotune() -> Callable[..., autotuner.Autotuner | autotuner.Heuristics]:
    if _AUTOTUNE:
        return triton.autotune(configs=get_autotune_config(), key=["n"],
                               prune_configs_by={"perf_model": estimate_time, "top_k": 2})
    return _heuristics_from_config(_best_config())
'''

KERNEL = '''\
import torch
import triton
import triton.language as tl

from tl_helpers import scale_autotune


def _scale_kernel(X, Y, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(Y + offs, tl.load(X + offs) * 2)
    else:
        tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


_scale_kernel = triton.jit(_scale_kernel)
_scale_kernel = triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})(_scale_kernel)
_scale_kernel = scale_autotune()(_scale_kernel)  # outermost: sets BLOCK before EVEN reads it


def scale(x):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[lambda META: (triton.cdiv(n, META["BLOCK"]),)](x, y, n)
    return y


def examples(device="cuda"):
    for n in (1001, 1024):
        scale(torch.randn(n, device=device))
'''

NAME = "forge_test_helper_decorators"


def _project(root: Path) -> Path:
    from tests.test_localmods import one_file_project

    manifest = one_file_project(root, NAME, KERNEL, "_scale_kernel", ["scale"], entry="scale")
    (root / "tl_helpers.py").write_text(HELPER)
    return manifest


def test_the_helpers_decorators_are_read_from_the_kernel_triton_builds(tmp_path: Path) -> None:
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan
    from forge_aot.sourcesplit import parse_source

    manifest = _project(tmp_path / "p")
    src = parse_source(manifest.parent / "k.py", {"scale"})
    assert src.kernels["_scale_kernel"].rewrapped and src.kernels["_scale_kernel"].decorators == ("heuristics", "jit")
    helper = parse_source(manifest.parent / "tl_helpers.py", {"scale_autotune"}, helper=True).host_source
    assert "estimate_time = __forge_kernel_side__('estimate_time', __name__)" in helper  # named by autotune(...) only
    assert "def scale_autotune() -> 'Callable[..., autotuner.Autotuner | autotuner.Heuristics]':" in helper
    assert "get_autotune_config = __forge_kernel_side__('get_autotune_config', __name__)" in helper
    assert "        return triton.autotune()\n\n    return _heuristics_from_config(_best_config())" in helper
    assert "get_dram_gbps" not in helper.replace("# a perf", "")
    assert len(helper.splitlines()) == len(HELPER.splitlines())
    kp = make_plan(load_manifest(manifest), ["sm_90"]).kernels["scale"]
    assert [n for n, _ in kp.heuristics] == ["BLOCK", "num_warps", "num_ctas", "num_stages", "EVEN"]
    # Triton's own Heuristics still builds in this process once the build is done (a library that builds and then
    # imports kernels with Triton; it once raised "object.__new__() takes exactly one argument")
    import triton
    import triton.language as tl

    @triton.jit
    def _jit_kernel(X, BLOCK: tl.constexpr):
        pass

    wrapped = triton.heuristics({"BLOCK": lambda args: 64})(_jit_kernel)
    assert type(wrapped).__name__ == "Heuristics" and wrapped.fn is _jit_kernel


@pytest.mark.slow
def test_the_wheel_applies_the_helpers_heuristics_without_triton(tmp_path: Path) -> None:
    from tests.test_localmods import _installed, _run_fresh

    target = _installed(_project(tmp_path / "p"), tmp_path)
    code = textwrap.dedent(f'''\
        import json, os, sys
        sys.modules["triton"] = None
        import {NAME}._ops.k as host
        out = {{"heuristics": [n for n, _ in host._scale_kernel.heuristics]}}
        print(json.dumps(out))
        ''')
    assert _run_fresh(code, target)["heuristics"] == ["BLOCK", "num_warps", "num_ctas", "num_stages", "EVEN"]
    # The environment asks for the autotune branch at run time: the packaged triton.autotune says what happened.
    os.environ["FORGE_TEST_AUTOTUNE"] = "1"
    try:
        with pytest.raises(Exception) as raised:
            _run_fresh(code, target)
    finally:
        del os.environ["FORGE_TEST_AUTOTUNE"]
    assert "packaged host code called triton.autotune" in raised.value.stderr  # type: ignore[attr-defined]


def test_a_build_that_took_the_autotune_branch_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from forge_aot.errors import SourceError
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    monkeypatch.setenv("FORGE_TEST_AUTOTUNE", "1")
    with pytest.raises(SourceError, match=r"host code applies triton\.autotune to _scale_kernel after its def"):
        make_plan(load_manifest(_project(tmp_path / "p")), ["sm_90"])


@pytest.mark.gpu
def test_the_wheel_launches_the_kernel_with_the_helpers_config(tmp_path: Path) -> None:
    from tests.test_localmods import wheel_max_error

    assert wheel_max_error(_project(tmp_path / "p"), tmp_path, NAME, "scale", "x * 2", (1001, 1024, 77, 4096)) == 0.0


def test_the_runtimes_config_heuristics_and_autotune_behave_as_host_code_needs() -> None:
    import triton

    from forge_aot.runtime import ForgeRuntimeError, host_triton
    from forge_aot.runtime.host_triton import KernelSide

    for args, kwargs in (((dict(BLOCK=128),), dict(num_warps=8, num_stages=3)),
                         (({"B": 1},), dict(num_ctas=2, maxnreg=128, pre_hook=print))):
        ours, theirs = host_triton.Config(*args, **kwargs), triton.Config(*args, **kwargs)
        assert ours.all_kwargs() == theirs.all_kwargs()
        for field in ("kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg", "pre_hook"):
            assert getattr(ours, field) == getattr(theirs, field)
    side = KernelSide("k", "m")  # a kernel the package has no binary of: left as it is
    assert host_triton.heuristics({"B": lambda a: 1})(side) is side
    with pytest.raises(ForgeRuntimeError, match="to the package's kernels only"):
        host_triton.heuristics({"B": lambda a: 1})(print)
    with pytest.raises(ForgeRuntimeError, match=r"packaged host code called triton\.autotune"):
        host_triton.autotune(configs=[], key=[])
