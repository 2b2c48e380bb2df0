"""The projects the benchmarks generate stay valid as the repository's kernels change: a kernel file the
benchmark copies may launch kernels the benchmark does not tune (kernels/matmul.py's op also launches
matmul_tma_kernel on Hopper), and its manifest must still check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from forge_aot.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench_tuning():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_tuning

        yield bench_tuning
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.mark.parametrize("space", ["small_space", "space_260"])
def test_bench_tuning_project_checks(bench_tuning, tmp_path, monkeypatch, space) -> None:
    proj = bench_tuning.project(tmp_path / "proj", getattr(bench_tuning, space)(), bench_tuning.SHAPES, "exhaustive")
    monkeypatch.chdir(proj)
    result = CliRunner().invoke(main, ["check", "--manifest", str(proj / "kernel_manifest.toml")])
    assert result.exit_code == 0, result.output
    assert "matmul_kernel" in result.output and "matmul_tma_kernel" in result.output
