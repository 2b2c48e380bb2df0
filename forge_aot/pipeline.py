"""The build: manifest → plan → tune (tables from the database) → compile → package.

Each stage's output can be written as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compiler import CompilePool, CompileReport, ProgressFn, compile_plan, triton_version
from .errors import CompileError, ForgeError, ManifestError
from .manifest import check_wheel_platforms, load_manifest
from .package import build_wheel, platform_extensions, stage_package, stage_platform, wheel_platforms
from .plan import BuildPlan, make_plan
from .tune.apply import apply_tuning, load_database, row_counts


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    """The first wheel written (``project.wheel-platforms``' first entry)."""
    plan: BuildPlan
    report: CompileReport
    build_dir: Path
    wheels: tuple[Path, ...] = ()
    """Every wheel written, one per wheel platform, in the manifest's order."""


def _atomic_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def build(manifest_path: str | Path, *, targets: list[str] | None = None, out_dir: str | Path | None = None,
          build_dir: str | Path | None = None, jobs: int | None = None, progress: ProgressFn | None = None,
          platforms: Sequence[str] | None = None) -> BuildResult:
    """Build the wheels of a manifest (one per wheel platform: ``platforms``, else ``project.wheel-platforms``).
    Raises ForgeError subclasses; prints nothing."""
    loaded = load_manifest(manifest_path)
    if platforms:
        check_wheel_platforms(platforms, lambda message, suggestion=None: ManifestError(
            message, key_path="--wheel-platform", suggestion=suggestion))
    root = loaded.root
    out = Path(out_dir) if out_dir else root / "dist"
    work = Path(build_dir) if build_dir else root / "build" / "forge-aot"
    plan = make_plan(loaded, targets)
    # the C launch path of every wheel platform first: one that cannot be built fails before any kernel compiles
    extensions = platform_extensions(wheel_platforms(platforms or loaded.manifest.project.wheel_platforms),
                                     work / "extensions")
    tuning = apply_tuning(plan, load_database(loaded), triton_version())
    _atomic_json(work / "plan.json", plan.to_json())
    if progress:
        total = sum(len(rows) for e in plan.entries for rows in e.tables.values())
        progress("plan", 1, 1, f"{len(plan.kernels)} kernels, {len(plan.entries)} entries, {total} table rows, "
                 f"targets {', '.join(plan.targets)}")
        for target in plan.targets:
            rows = tuning.rows.get(target, {})
            models = ", ".join(tuning.devices.get(target, [])) or "no GPU model"
            progress("tune", 1, 1, f"{target}: {rows.get('tuned', 0)} rows tuned ({models}), "
                     f"{rows.get('aliased', 0)} aliased, {rows.get('untuned', 0)} untuned")
    binaries = work / "binaries"
    if binaries.exists():
        shutil.rmtree(binaries)
    pool = CompilePool(jobs, cache_dir=(work / "triton-cache").resolve(), root=root,
                       line_info=loaded.manifest.project.line_info)
    try:
        report = compile_plan(plan, binaries.resolve(), pool, progress)
    finally:
        pool.close()
    _atomic_json(work / "compile_report.json", report.to_json())
    if report.errors:
        raise BuildFailed(report.errors, report.failures)
    left_out = {(err.kernel, err.variant, err.target) for err in report.left_out}
    tuning.rows = row_counts(e for e in plan.entries if (e.kernel, e.variant, e.target) not in left_out)
    if progress:
        progress("package", 0, 1, "writing the package")
    stage = stage_package(plan, report, binaries, work / "package", triton_version())
    wheels: list[Path] = []
    built: set[str] = set()
    for ext in extensions.values():
        if ext.tag in built:  # a native build without a C compiler is the pure wheel `any` also asks for
            continue
        built.add(ext.tag)
        stage_platform(stage, ext)
        if progress:
            progress("package", 0, 1, ext.note)
        wheel = build_wheel(stage, out)
        wheels.append(wheel)
        if progress:
            progress("package", 1, 1, str(wheel))
    return BuildResult(wheels[0], plan, report, work, tuple(wheels))


class BuildFailed(ForgeError):
    """Some entries have no config that compiled."""

    def __init__(self, errors: list[CompileError], failures: list[str]) -> None:
        self.errors = errors
        self.failures = failures
        super().__init__("\n".join(str(e) for e in errors))
