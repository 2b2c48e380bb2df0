"""The packaged host code's imports that the wheel does not require: flash-linear-attention's ops ``import einops``,
which pip does not install with a wheel that requires only torch; the build says so, where, and what to write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

KERNEL = '''\
import json
import os.path

import click  # a package outside the standard library that the manifest may or may not require
import torch
import triton
import triton.language as tl

try:  # an optional dependency the code does without
    import yaml_optional_for_the_test
except ImportError:
    yaml_optional_for_the_test = None


@triton.jit
def _scale_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


def scale(x):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[(triton.cdiv(n, 256),)](x, y, n, BLOCK=256)
    return y


def plot(x):
    import not_installed_plotting_lib  # only where it is called: still needed where the wheel runs

    return not_installed_plotting_lib.show(x)


def examples(device="cuda"):
    scale(torch.randn(1000, device=device))
'''


def _project(root: Path, dependencies: str | None = None) -> Path:
    from tests.test_localmods import one_file_project

    manifest = one_file_project(root, "forge_test_host_deps", KERNEL, "_scale_kernel", ["scale"], entry="scale")
    if dependencies is not None:
        targets = 'targets = ["sm_90"]\n'
        manifest.write_text(manifest.read_text().replace(targets, f"{targets}dependencies = {dependencies}\n"))
    return manifest


def test_imports_the_wheel_does_not_require_are_named_with_where_and_what_to_write(tmp_path: Path) -> None:
    from forge_aot.host_deps import undeclared_imports
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    lines = undeclared_imports(make_plan(load_manifest(_project(tmp_path / "p")), ["sm_90"]))
    assert len(lines) == 2, lines
    assert lines[0].startswith("the packaged host code imports click (distribution click), imported at k.py:4, "
                               "which the wheel does not require")
    assert "add it to [project] dependencies in the manifest" in lines[0]
    assert lines[1].startswith("the packaged host code imports not_installed_plotting_lib (not installed here), "
                               "imported at k.py:")


def test_a_declared_dependency_is_not_named(tmp_path: Path) -> None:
    from forge_aot.host_deps import undeclared_imports
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    manifest = _project(tmp_path / "p", '["torch>=2.1", "Click >= 8; python_version >= \\"3.9\\"", '
                                        '"not-installed_plotting.lib"]')
    assert undeclared_imports(make_plan(load_manifest(manifest), ["sm_90"])) == []


def test_forge_aot_check_prints_the_warning(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "forge_aot.cli", "check", "--manifest", str(_project(tmp_path / "p"))],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "warning: the packaged host code imports click (distribution click), imported at k.py:4" in out.stderr


def test_an_import_under_a_condition_is_named_with_it(tmp_path: Path) -> None:
    """SGLang's ``environ.py``: ``if envs.SGLANG_CUDA_COREDUMP.get(): import sglang.srt...`` was warned about as an
    import every process makes; the warning now gives the condition (an import also made unconditionally keeps the
    plain warning)."""
    from forge_aot.host_deps import undeclared_imports
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan
    from tests.test_localmods import one_file_project

    source = KERNEL.replace("import os.path\n", "import os.path\n\nif os.environ.get(\"WANT_DEBUG\"):\n"
                            "    import guarded_debug_lib  # noqa: F401\nelse:\n    import click as other_click\n", 1)
    manifest = one_file_project(tmp_path / "p", "forge_test_guarded", source, "_scale_kernel", ["scale"],
                                entry="scale")
    lines = undeclared_imports(make_plan(load_manifest(manifest), ["sm_90"]))
    guarded = [line for line in lines if "guarded_debug_lib" in line]
    assert guarded == ["the packaged host code imports guarded_debug_lib (not installed here), imported at k.py:5 "
                       "only where `os.environ.get('WANT_DEBUG')` holds, which the wheel does not require: pip will "
                       "not install it with the wheel; where that holds, add it to [project] dependencies in the "
                       "manifest (torch is there by default)"], lines
    # click: under the else branch and at line 9 unconditionally: the unconditional one is named
    assert any(line.startswith("the packaged host code imports click (distribution click), imported at k.py:9, "
                               "which the wheel does not require") for line in lines), lines


def test_requirement_names() -> None:
    from forge_aot.host_deps import requirement_name

    assert requirement_name("einops>=0.6; python_version > '3.8'") == "einops"
    assert requirement_name("PyYAML") == "pyyaml"
    assert requirement_name("flash_attn[full] @ https://x") == "flash-attn"
    assert requirement_name("  torch ") == "torch"
