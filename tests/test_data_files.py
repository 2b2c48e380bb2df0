"""Data files host code reads at run time (vLLM's tuned-config JSON beside its kernel file): the build records the
files host code opens while traced, takes ``project.package-data`` globs for the rest, and ships each where the
host code's ``__file__`` finds it. CPU: the plan's mapping, the manifest's checks, a built wheel in a fresh process.
GPU: tests/test_block_fp8_matmul.py (the tuned file's config is what the wheel launches)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from forge_aot.errors import ManifestError, SourceError
from tests.conftest import REALWORLD
from tests.test_localmods import _installed, _run_fresh

KERNEL = '''\
"""Block sizes from a JSON table beside this file, read at import; the helper reads its own limits."""

import json
import os

import torch
import triton
import triton.language as tl
from mylib.limits import max_block

with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "configs", "blocks.json")) as f:
    BLOCKS = {int(k): v for k, v in json.load(f).items()}


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def scale(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    BLOCK = min(BLOCKS[min(BLOCKS, key=lambda m: abs(m - n))], max_block())
    scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out


def examples(device="cpu"):
    for n in (1000, 100000):
        scale(torch.randn(n, device=device, dtype=torch.float16))
'''

MANIFEST = '''\
[project]
name = "forge_datafiles"
version = "0.1.0"
targets = ["sm_90"]
{extra}

[kernels.scale]
source = "kernels/scale.py:scale_kernel"
ops = ["scale"]
signature = {{ x_ptr = "*fp16", out_ptr = "*fp16", n = "i32" }}
examples = "examples"
'''


def _project(root: Path, extra: str = 'package-data = ["kernels/configs/other-gpu.json"]') -> Path:
    (root / "kernels" / "configs").mkdir(parents=True)
    (root / "mylib" / "data").mkdir(parents=True)
    (root / "kernels" / "scale.py").write_text(KERNEL)
    (root / "kernels" / "configs" / "blocks.json").write_text('{"1024": 256, "65536": 1024}\n')
    (root / "kernels" / "configs" / "other-gpu.json").write_text('{"1024": 128}\n')  # read by no trace
    (root / "kernels" / "configs" / "notes.txt").write_text("neither read nor listed: not shipped\n")
    (root / "mylib" / "__init__.py").write_text("")
    (root / "mylib" / "limits.py").write_text(textwrap.dedent('''\
        from pathlib import Path


        def max_block():
            return int((Path(__file__).parent / "data" / "max_block.txt").read_text())
        '''))
    (root / "mylib" / "data" / "max_block.txt").write_text("512\n")
    manifest = root / "kernel_manifest.toml"
    manifest.write_text(MANIFEST.format(extra=extra))
    return manifest


def _plan(manifest: Path):
    from forge_aot.manifest import load_manifest
    from forge_aot.plan import make_plan

    return make_plan(load_manifest(manifest))


def test_files_host_code_reads_are_shipped_where_its_file_finds_them(tmp_path: Path) -> None:
    root = tmp_path / "p"
    plan = _plan(_project(root))
    assert plan.data_files == {
        "_ops/configs/blocks.json": str((root / "kernels/configs/blocks.json").resolve()),  # read at import
        "_ops/configs/other-gpu.json": str((root / "kernels/configs/other-gpu.json").resolve()),  # package-data
        "_ops/_local/mylib/data/max_block.txt": str((root / "mylib/data/max_block.txt").resolve()),  # by pathlib
    }
    assert {e.assignment["BLOCK"] for e in plan.entries} == {256, 512}  # the table, capped by the helper's limit
    assert plan.to_json()["data_files"] == plan.data_files


def test_package_data_must_match_files_inside_the_project(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"matches no file") as info:
        _plan(_project(tmp_path / "a", 'package-data = ["kernels/configs/*.yaml"]'))
    assert info.value.key_path == "project.package-data[0]"
    with pytest.raises(ManifestError, match=r"inside its folder"):
        _plan(_project(tmp_path / "b", 'package-data = ["../elsewhere/*.json"]'))


def test_two_kernel_folders_with_a_data_file_of_one_name_cannot_ship(tmp_path: Path) -> None:
    root = tmp_path / "p"
    manifest = _project(root)
    (root / "more" / "configs").mkdir(parents=True)
    (root / "more" / "twice.py").write_text(KERNEL.replace("scale", "twice"))
    (root / "more" / "configs" / "blocks.json").write_text('{"1024": 256}\n')
    kernel_section = MANIFEST.format(extra="").split("\n\n", 1)[1]
    manifest.write_text(manifest.read_text() + "\n" + kernel_section.replace("scale", "twice").replace(
        "kernels/twice.py", "more/twice.py"))
    with pytest.raises(SourceError, match=r"would both be shipped as _ops/configs/blocks.json"):
        _plan(manifest)


@pytest.mark.slow
def test_the_wheel_reads_its_shipped_data_in_a_fresh_process(tmp_path: Path) -> None:
    target = _installed(_project(tmp_path / "project"), tmp_path)
    pkg = target / "forge_datafiles"
    data = [p for p in (pkg / "_ops").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert sorted(str(p.relative_to(pkg)) for p in data) == [
        "_ops/_local/mylib/data/max_block.txt", "_ops/configs/blocks.json", "_ops/configs/other-gpu.json"]
    # Neither the project nor forge-aot nor Triton importable: the custom op's meta implementation runs the host
    # code, which reads the shipped table and the helper's shipped limit.
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["mylib"] = None
        import torch, forge_datafiles
        out = torch.ops.forge_datafiles.scale(torch.empty(3000, device="meta", dtype=torch.float16))
        import forge_datafiles._ops.scale as host
        print(json.dumps({"shape": list(out.shape), "blocks": host.BLOCKS, "max": host.max_block(),
                          "file": host.__file__}))
        ''')
    res = _run_fresh(code, target)
    assert res["shape"] == [3000] and res["blocks"] == {"1024": 256, "65536": 1024} and res["max"] == 512
    assert res["file"] == str(pkg / "_ops" / "scale.py")


def test_the_realworld_block_fp8_matmul_ships_its_tuned_config_file(realworld_plan) -> None:
    name = "N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert realworld_plan.data_files == {f"_ops/configs/{name}": str((REALWORLD / "kernels/configs" / name).resolve())}


HELPER_CONFIG_KERNEL = '''\
import torch
import triton
import triton.language as tl
from mylib.cfg import get_config


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def scale(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    BLOCK = get_config(n)["BLOCK"]
    scale_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out


def examples(device="cpu"):
    scale(torch.randn(4099, device=device, dtype=torch.float16))
'''


def _helper_reads_beside_itself(root: Path) -> Path:
    """lightllm's layout: a package whose kernel file asks a helper module of the same folder
    (``common/kernel_config.py``) for its config, which the helper reads from a JSON file beside itself."""
    (root / "mylib" / "configs").mkdir(parents=True)
    (root / "mylib" / "__init__.py").write_text("")
    (root / "mylib" / "cfg.py").write_text(textwrap.dedent('''\
        import json
        import os


        def get_config(n):
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", f"n={n}.json")
            if os.path.exists(path):
                with open(path) as f:
                    return json.load(f)
            return {"BLOCK": 128}  # the library's fallback: never traced, never built
        '''))
    (root / "mylib" / "configs" / "n=4099.json").write_text('{"BLOCK": 1024}\n')
    (root / "mylib" / "scale.py").write_text(HELPER_CONFIG_KERNEL)
    manifest = root / "kernel_manifest.toml"
    manifest.write_text(MANIFEST.format(extra="").replace("kernels/scale.py", "mylib/scale.py"))
    return manifest


def test_a_file_a_helper_reads_beside_itself_in_a_kernel_folder_ships_beside_both(tmp_path: Path) -> None:
    """Session 47's lightllm hunt: a data file in a kernel file's folder was shipped beside the host module only
    (``_ops/configs/``), while the helper module of that folder that reads it ships as ``_ops/_local/mylib/cfg.py``
    and looked for ``_ops/_local/mylib/configs/``: the wheel's helper fell back to a config the build never built."""
    root = tmp_path / "p"
    plan = _plan(_helper_reads_beside_itself(root))
    source = str((root / "mylib/configs/n=4099.json").resolve())
    assert plan.data_files == {"_ops/configs/n=4099.json": source, "_ops/_local/mylib/configs/n=4099.json": source}
    assert {e.assignment["BLOCK"] for e in plan.entries} == {1024}


@pytest.mark.slow
def test_a_helper_of_a_kernel_folder_reads_its_shipped_data_in_a_fresh_process(tmp_path: Path) -> None:
    target = _installed(_helper_reads_beside_itself(tmp_path / "project"), tmp_path)
    code = textwrap.dedent('''\
        import json, sys
        sys.modules["triton"] = None
        sys.modules["mylib"] = None
        import torch, forge_datafiles
        out = torch.ops.forge_datafiles.scale(torch.empty(4099, device="meta", dtype=torch.float16))
        import forge_datafiles._ops.scale as host
        print(json.dumps({"shape": list(out.shape), "config": host.get_config(4099)}))
        ''')
    res = _run_fresh(code, target)
    assert res == {"shape": [4099], "config": {"BLOCK": 1024}}
