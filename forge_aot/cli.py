"""The ``forge-aot`` command: a thin layer over the library that turns ForgeError into messages and exit codes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import ForgeError

DEFAULT_MANIFEST = "kernel_manifest.toml"


def _fail(exc: ForgeError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(exc.exit_code)


class _Progress:
    """Progress lines on stderr for long steps (one line per finished binary)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.start = time.perf_counter()

    def __call__(self, stage: str, done: int, total: int, message: str) -> None:
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.start
        click.echo(f"[{elapsed:6.1f}s] {stage:8s} {done:>4}/{total:<4} {message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="forge-aot")
def main() -> None:
    """Build Triton kernels ahead of time into wheels that run with no Triton, JIT or autotune."""


@main.command("build")
@click.option("--manifest", "manifest", default=DEFAULT_MANIFEST, show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The kernel manifest.")
@click.option("--target", "targets", multiple=True, help="Build only these targets (repeatable).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the wheel goes [default: dist/ beside the manifest].")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Work directory [default: build/forge-aot/ beside the manifest].")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Parallel compile processes [default: CPUs].")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def build_cmd(manifest: Path, targets: tuple[str, ...], out_dir: Path | None, build_dir: Path | None,
              jobs: int | None, quiet: bool) -> None:
    """Compile every kernel entry for every target and package the wheel."""
    from .pipeline import BuildFailed, build

    try:
        result = build(manifest, targets=list(targets) or None, out_dir=out_dir, build_dir=build_dir, jobs=jobs,
                       progress=_Progress(quiet))
    except BuildFailed as exc:
        click.echo("error: the build failed; configs that did not compile:", err=True)
        for line in exc.failures:
            click.echo(f"  - {line}", err=True)
        for err in exc.errors:
            click.echo(f"error: {err.kernel} [{err.variant}] for {err.target}: no config compiled", err=True)
        sys.exit(exc.exit_code)
    except ForgeError as exc:
        _fail(exc)
    report = result.report
    if report.failures:
        click.echo(f"warning: {len(report.failures)} binaries failed and were left out "
                   "(their table rows use the next config):", err=True)
        for line in report.failures:
            click.echo(f"  - {line}", err=True)
    ok = sum(1 for r in report.results if r.ok)
    click.echo(f"built {result.wheel} ({ok} binaries, {result.wheel.stat().st_size / 1e6:.2f} MB)")


@main.command()
@click.option("--manifest", "manifest", default=DEFAULT_MANIFEST, show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The kernel manifest.")
@click.option("--plan", "show_plan", is_flag=True, help="Print the build plan as JSON.")
def check(manifest: Path, show_plan: bool) -> None:
    """Validate the manifest and the kernel sources (compiles nothing)."""
    from .manifest import load_manifest
    from .plan import make_plan

    try:
        plan = make_plan(load_manifest(manifest))
    except ForgeError as exc:
        _fail(exc)
    if show_plan:
        click.echo(json.dumps(plan.to_json(), indent=1))
        return
    from .plan import plan_summary

    summary = plan_summary(plan)
    total = sum(k["binaries"] for k in summary.values())
    click.echo(f"{manifest}: ok ({len(plan.kernels)} kernels, {len(plan.entries)} kernel×variant×target "
               f"entries, {total} binaries to compile for {', '.join(plan.targets)})")
    for name, k in summary.items():
        decorated = f" [{', '.join('@triton.' + d for d in k['decorators'])}]" if k["decorators"] else ""
        click.echo(f"  {name}: {k['function']}{decorated}: {k['variants']} variants over "
                   f"({', '.join(k['axes']) or 'nothing'}), {k['space']} configs in the space, "
                   f"key ({', '.join(k['key']) or 'none'}), {k['binaries']} binaries")
        for site in k["launches"]:
            passed = ", ".join(site["keywords"]) or "no keywords"
            more = " (and *args/**kwargs forge-aot cannot see)" if site["unknown"] else ""
            click.echo(f"    launched in {site['function']}() line {site['line']}: passes {passed}{more}")
        if k["axis_values_from"]:
            click.echo(f"    call-site values from: {', '.join(k['axis_values_from'])}"
                       + (f" ({k['traced_calls']} traced calls)" if k["traced_calls"] else ""))
        if "examples" not in k["axis_values_from"] and k["unkeyed_ints"]:
            click.echo(f"    note: no examples function: {', '.join(k['unkeyed_ints'])} are assumed divisible by 16; "
                       "a call where one equals 1 (a unit stride) takes a less specialized binary")


def _fmt_size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@main.command("inspect")
@click.argument("wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect_cmd(wheel: Path, as_json: bool) -> None:
    """List a wheel's kernels × variants × targets × configs and their sizes."""
    from .package import read_wheel

    try:
        info = read_wheel(wheel)
    except ForgeError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(info, indent=1))
        return
    bi = info["build_info"]
    click.echo(f"{wheel.name}: package {info['package']} {bi['version']}, {_fmt_size(info['size'])} "
               f"(binaries {_fmt_size(info['binary_bytes'])}, {_fmt_size(info['binary_bytes_compressed'])} "
               "compressed)")
    click.echo(f"built by forge-aot {bi['forge_aot_version']} with triton {bi['triton_version']}; manifest "
               f"sha256 {bi['manifest_sha256'][:16]}…; targets {', '.join(bi['targets'])}")
    click.echo(f"ops: {', '.join(info['ops'])}")
    headers = ["kernel", "variant", "target", "config", "rows", "binaries", "shared", "size"]
    table: list[list[Any]] = [[r["kernel"], r["variant"], r["target"], r["config"], r["rows"],
                               "+".join(r["specializations"]), r["shared"], _fmt_size(r["bytes"])]
                              for r in info["rows"]]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *table)]
    for row in [headers, *table]:
        click.echo("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


@main.command()
def schema() -> None:
    """Print the JSON schema of kernel_manifest.toml."""
    from .manifest import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


if __name__ == "__main__":
    main()
