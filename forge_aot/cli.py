"""The ``forge-aot`` command: a thin layer over the library that turns ForgeError into messages and exit codes."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import ForgeError
from .manifest import WHEEL_PLATFORMS

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


def _shard(value: str | None) -> tuple[int, int]:
    if not value:
        return (0, 1)
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise click.BadParameter("give it as i/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise click.BadParameter(f"{value}: i must be in 0..N-1")
    return (i, n)


def _gpus(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter("a comma-separated list of GPU indices, e.g. 0,1") from None


def _run_tune(manifest: Path, options: Any, quiet: bool) -> Any:
    from .tune.runner import tune

    run = tune(manifest, options, _Progress(quiet))
    counts: dict[str, int] = {}
    for item in run.items:
        counts[item.status] = counts.get(item.status, 0) + 1
    click.echo(f"tuned on {len(run.gpus)}x {run.device['name']} ({run.target}): "
               f"{', '.join(f'{n} {s}' for s, n in sorted(counts.items())) or 'no rows'} "
               f"in {run.wall:.1f} s (compile {run.compile_seconds:.1f} CPU-s, benchmark "
               f"{run.benchmark_wall:.1f} s)")
    for item in run.items:
        if item.status == "tuned" and item.speedup:
            click.echo(f"  {item.row}: {item.winner} {item.winner_ms * 1e3:.1f} us, {item.speedup:.2f}x the default")
        elif item.status == "failed":
            click.echo(f"  {item.row}: FAILED: {'; '.join(item.notes)[-400:]}", err=True)
    for note in run.notes:
        click.echo(f"  note: {note}")
    click.echo(f"database: {run.database}" + (f"; report: {run.report}" if run.report else ""))
    return run


@main.command("tune")
@click.option("--manifest", "manifest", default=DEFAULT_MANIFEST, show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The kernel manifest.")
@click.option("--kernel", "kernels", multiple=True, help="Tune only this kernel entry (repeatable).")
@click.option("--shard", help="i/N: tune only shard i of N (for a CI matrix; join with forge-aot merge).")
@click.option("--gpus", help="Visible GPU indices to use, e.g. 0,1 [default: all].")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Parallel compile processes [default: CPUs].")
@click.option("--strategy", type=click.Choice(["auto", "exhaustive", "guided"]),
              help="Search strategy over the manifest's tune.search.")
@click.option("--budget", type=click.FloatRange(0, 1, min_open=True), help="Guided search budget (fraction).")
@click.option("--force", is_flag=True, help="Measure again what the database already has.")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Work directory [default: build/forge-aot/ beside the manifest].")
@click.option("--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds one candidate may run before its worker is killed.")
@click.option("--no-report", is_flag=True, help="Write run.json but not the Markdown/PNG report.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def tune_cmd(manifest: Path, kernels: tuple[str, ...], shard: str | None, gpus: str | None, jobs: int | None,
             strategy: str | None, budget: float | None, force: bool, build_dir: Path | None, timeout: float,
             no_report: bool, quiet: bool) -> None:
    """Tune every manifest entry on the local GPUs into the tuning database."""
    from .tune.runner import TuneOptions

    options = TuneOptions(kernels=kernels, shard=_shard(shard), gpus=_gpus(gpus), jobs=jobs, strategy=strategy,
                          budget=budget, force=force, build_dir=build_dir, candidate_timeout=timeout,
                          report=not no_report)
    try:
        _run_tune(manifest, options, quiet)
    except ForgeError as exc:
        _fail(exc)


@main.command("merge")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--into", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The tuning directory to merge into (created if missing).")
def merge_cmd(sources: tuple[Path, ...], into: Path) -> None:
    """Join tuning databases (directories or .jsonl files) into one, each record once."""
    from .tune.database import merge_databases

    try:
        stats = merge_databases(list(sources), into)
    except ForgeError as exc:
        _fail(exc)
    click.echo(f"{into}: {stats['records']} records in {stats['files']} files ({stats['duplicates']} duplicates "
               f"dropped, {stats['unreadable']} unreadable lines skipped)")


@main.command("prune")
@click.option("--manifest", "manifest", default=DEFAULT_MANIFEST, show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The kernel manifest.")
@click.option("--dry-run", is_flag=True, help="Count what would be dropped; write nothing.")
def prune_cmd(manifest: Path, dry_run: bool) -> None:
    """Drop the tuning records measured on another version of their kernel's code (no build uses them again)."""
    from .manifest import load_manifest
    from .plan import make_plan
    from .tune.apply import database_dir, prune_stale

    try:
        loaded = load_manifest(manifest)
        directory = database_dir(loaded)
        if directory is None or not directory.is_dir():
            click.echo(f"{manifest}: no tuning database (project.tuning-data)")
            return
        dropped = prune_stale(make_plan(loaded), directory, dry_run=dry_run)
    except ForgeError as exc:
        _fail(exc)
    verb = "would drop" if dry_run else "dropped"
    for kernel, n in dropped.items():
        click.echo(f"  {kernel}: {verb} {n} record{'s' if n > 1 else ''} of another version of its code")
    click.echo(f"{directory}: {verb} {sum(dropped.values())} records")


@main.command("report")
@click.argument("run_json", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="[default: report/ beside RUN_JSON]")
def report_cmd(run_json: Path, out: Path | None) -> None:
    """Render the report of a tuning run (its run.json) as Markdown with PNG plots."""
    from .tune.report import write_report

    path = write_report(json.loads(run_json.read_text(encoding="utf-8")), out or run_json.parent / "report")
    click.echo(str(path))


@main.command("build")
@click.option("--manifest", "manifest", default=DEFAULT_MANIFEST, show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The kernel manifest.")
@click.option("--target", "targets", multiple=True, help="Build only these targets (repeatable).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the wheel goes [default: dist/ beside the manifest].")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Work directory [default: build/forge-aot/ beside the manifest].")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Parallel compile processes [default: CPUs].")
@click.option("--tune", "tune_first", is_flag=True, help="Tune on the local GPUs first (forge-aot tune).")
@click.option("--wheel-platform", "platforms", multiple=True, type=click.Choice(WHEEL_PLATFORMS),
              help="Write this platform's wheel (repeatable) [default: project.wheel-platforms].")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def build_cmd(manifest: Path, targets: tuple[str, ...], out_dir: Path | None, build_dir: Path | None,
              jobs: int | None, tune_first: bool, platforms: tuple[str, ...], quiet: bool) -> None:
    """Compile every kernel entry for every target and package the wheel."""
    from .pipeline import BuildFailed, build

    try:
        if tune_first:
            from .tune.runner import TuneOptions

            _run_tune(manifest, TuneOptions(jobs=jobs, build_dir=build_dir), quiet)
        result = build(manifest, targets=list(targets) or None, out_dir=out_dir, build_dir=build_dir, jobs=jobs,
                       progress=_Progress(quiet), platforms=list(dict.fromkeys(platforms)) or None)
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
    for err in report.left_out:
        click.echo(f"warning: {err.kernel} [{err.variant}] did not compile for {err.target} and is left out there "
                   f"(kernels.{err.kernel}.optional-targets)", err=True)
    # Binaries of None combinations no example passed (FLA passes cu_seqlens and chunk_indices together, and
    # cu_seqlens alone does not compile): counted per kernel with the compiler's last line, not a traceback each.
    speculative: dict[str, list[Any]] = {}
    for r in report.results:
        if not r.ok and r.job.binary.speculative:
            speculative.setdefault(r.job.kernel, []).append(r)
    from .compiler import UNTRACED

    failures = [line for line in report.failures if UNTRACED not in line]
    if speculative:
        click.echo(f"warning: {sum(map(len, speculative.values()))} binaries for combinations of None arguments no "
                   "example passed did not compile and were left out (a call of one raises NotBuiltError; "
                   "every-none-combination = false builds only the traced combinations):", err=True)
        for kernel, failed in sorted(speculative.items()):
            first = failed[0]
            reason = (str(first.error).strip().splitlines() or [""])[-1]
            click.echo(f"  - {kernel}: {len(failed)}, e.g. [{first.job.variant}] ({first.job.binary.id}): {reason}",
                       err=True)
    if failures:
        click.echo(f"warning: {len(failures)} binaries failed and were left out "
                   "(their table rows use the next config):", err=True)
        for line in failures:
            click.echo(f"  - {line}", err=True)
    tuning = result.plan.tuning
    for line in tuning.stale + tuning.warnings:
        click.echo(f"warning: tuning database: {line}", err=True)
    _plan_warnings(result.plan)
    from .plan import data_like_constexprs, size_constexprs

    for name, kp in result.plan.kernels.items():
        entries = [e for e in result.plan.entries if e.kernel == name]
        for line in _data_like_notes({"function": kp.function, "data_like_constexprs": data_like_constexprs(
                kp, entries), "size_constexprs": size_constexprs(kp, entries)}):
            click.echo(f"warning: {line}", err=True)
    ok = sum(1 for r in report.results if r.ok)
    for wheel in result.wheels:
        click.echo(f"built {wheel} ({ok} binaries, {wheel.stat().st_size / 1e6:.2f} MB)")
    for target in result.plan.targets:
        rows = tuning.rows.get(target, {})
        models = ", ".join(tuning.devices.get(target, [])) or "no GPU model"
        click.echo(f"  {target}: {rows.get('tuned', 0)} table rows tuned ({models}), {rows.get('aliased', 0)} "
                   f"aliased, {rows.get('untuned', 0)} untuned")


def _plan_warnings(plan: Any) -> None:
    """The plan's warnings and the imports the wheel does not require."""
    from .host_deps import undeclared_imports

    for line in [*plan.warnings, *undeclared_imports(plan)]:
        click.echo(f"warning: {line}", err=True)


def _data_like_notes(summary: dict[str, Any]) -> list[str]:
    """What ``plan.data_like_constexprs`` and ``plan.size_constexprs`` found for one kernel, as lines a person
    reads."""
    sizes = summary.get("size_constexprs", {})
    return [*(f"{summary['function']}: constexpr {name} equals {arg}.shape[{dim}] in every traced call "
              f"({', '.join(map(str, values[:8]))}{', ...' if len(values) > 8 else ''}): each value is a binary of its "
              "own, and a value no example passes raises NotBuiltError at run time (Triton's JIT compiles a binary "
              "for each new one); where it follows a size that varies per call (a batch, a length), pass every size "
              "the deployment uses in the examples, or make it a runtime argument"
              for name, (arg, dim, values) in sizes.items()),
            *(f"{summary['function']}: constexpr {name} takes {len(values)} values in the traced calls "
              f"({', '.join(map(str, values[:8]))}{', ...' if len(values) > 8 else ''}): each is a binary of its own, "
              "and a value no example passes fails at run time (Triton's JIT compiles a binary for each new one); if "
              "it is per-call data (a length, a stride), make it a runtime argument"
              for name, values in summary["data_like_constexprs"].items() if name not in sizes)]


@main.command()
@click.option("--manifest", "manifest", default=DEFAULT_MANIFEST, show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The kernel manifest.")
@click.option("--plan", "show_plan", is_flag=True, help="Print the build plan as JSON.")
def check(manifest: Path, show_plan: bool) -> None:
    """Validate the manifest and the kernel sources (compiles nothing)."""
    from .manifest import load_manifest
    from .pipeline import triton_version
    from .plan import make_plan
    from .tune.apply import apply_tuning, load_database

    try:
        # what host code prints while its examples are traced goes to stderr where stdout is the plan's JSON
        with contextlib.redirect_stdout(sys.stderr) if show_plan else contextlib.nullcontext():
            loaded = load_manifest(manifest)
            plan = make_plan(loaded)
            tuning = apply_tuning(plan, load_database(loaded), triton_version())
    except ForgeError as exc:
        _fail(exc)
    for line in tuning.stale + tuning.warnings:
        click.echo(f"warning: tuning database: {line}", err=True)
    _plan_warnings(plan)
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
            where = f" in {site['file']}" if "file" in site else ""
            click.echo(f"    launched in {site['function']}(){where} line {site['line']}: passes {passed}{more}")
        if k["axis_values_from"]:
            click.echo(f"    call-site values from: {', '.join(k['axis_values_from'])}"
                       + (f" ({k['traced_calls']} traced calls)" if k["traced_calls"] else ""))
        if k["inferred"]:
            typed = ", ".join(f'{n} = "{ty}"' for n, ty in k["inferred"].items())
            click.echo(f"    signature from the traced calls (as Triton's JIT types them): {{ {typed} }}")
        if k["writes"]:
            click.echo(f"    writes through: {', '.join(k['writes'])}")
        if k["launch_heuristics"]:  # (Cut Cross-Entropy's: the space's w4-s3 is not what its binaries run with)
            click.echo(f"    {', '.join(k['launch_heuristics'])}: computed by @triton.heuristics for each binary, "
                       "whatever the configs of the space say")
        if k["optional"]:
            click.echo(f"    passed as None by traced calls: {', '.join(k['optional'])} (each combination with the "
                       "values other calls of the same variant pass there is built, at every row)")
        if k.get("optional_per_variant"):
            names = ", ".join(k["optional_per_variant"])
            click.echo(f"    note: {names}: None in all traced calls of some variants, passed in all of others; each "
                       "is built as its calls pass it, and another combination raises NotBuiltError (trace it in the "
                       "examples if it occurs)")
        for line in [*_data_like_notes(k), *k["notes"]]:
            click.echo(f"    note: {line}")
        if "examples" not in k["axis_values_from"] and not k["tuning_inputs"] and k["unkeyed_ints"]:
            click.echo(f"    note: no examples function: {', '.join(k['unkeyed_ints'])} are assumed divisible by 16; "
                       "a call where one equals 1 (a unit stride) takes a less specialized binary")
    package = plan.loaded.manifest.project.name
    ops = sorted((mod.get("export_as", {}).get(op, op), mod["schemas"].get(op), mod["schema_notes"].get(op, ""))
                 for mod in plan.modules.values() for op in mod["ops"])
    click.echo(f"  ops ({len(ops)}; a custom op is what torch.compile(fullgraph=True) and torch.export trace):")
    for op, schema, note in ops:
        if schema:
            click.echo(f"    {op}: torch.ops.{package}.{op}{schema} ({note})")
        else:
            click.echo(f"    {op}: Python calls only, no custom op ({note}): torch.compile breaks its graph there")
    exports = sorted((name, os.path.relpath(mod["path"], plan.loaded.root.resolve()))
                     for mod in plan.modules.values() for name in mod.get("exports", ()))
    if exports:
        click.echo(f"  exported as they are ({len(exports)}; {package}.NAME binds its file on first access):")
        for name, file in exports:
            click.echo(f"    {name} <- {file}")
    if plan.data_files:
        click.echo(f"  data files host code reads, shipped with it ({len(plan.data_files)}):")
        for shipped, source in sorted(plan.data_files.items()):
            click.echo(f"    {shipped} <- {os.path.relpath(source, plan.loaded.root.resolve())}")


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
    c_launch = bi.get("c_launch")
    click.echo(f"C launch path: {c_launch['file']} ({c_launch['wheel_tag']})" if c_launch else
               "C launch path: none (pure Python: launches through ctypes)")
    click.echo(f"ops: {', '.join(info['ops'])}")
    if info.get("exports"):
        click.echo(f"exported as they are: {', '.join(info['exports'])}")
    for target, t in sorted(info["tuning"].items()):
        click.echo(f"{target}: {t['tuned']} rows tuned ({', '.join(t['devices']) or 'no GPU model'}), "
                   f"{t['aliased']} aliased, {t['untuned']} untuned")
    headers = ["kernel", "variant", "target", "config", "rows", "binaries", "shared", "size"]
    table: list[list[Any]] = [[r["kernel"], r["variant"], r["target"], r["config"] + (
        f" ({'/'.join(r['launch_heuristics'])} by heuristics)" if r.get("launch_heuristics") else ""), r["rows"],
        _specializations(r["specializations"]), r["shared"], _fmt_size(r["bytes"])] for r in info["rows"]]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *table)]
    for row in [headers, *table]:
        click.echo("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


def _specializations(specs: list[str], shown: int = 3) -> str:
    """A config's specializations, the first few (Cut Cross-Entropy's rows had dozens, 16 kB a line)."""
    return "+".join(specs) if len(specs) <= shown else f"{'+'.join(specs[:shown])}+… ({len(specs)})"


@main.group("server")
def server_group() -> None:
    """A warm process that forge-aot forks its commands and workers from (torch and Triton imported once).

    While it runs, every forge-aot command of this installation runs in a fork of it, and so do the compile and
    benchmark workers: a warm `forge-aot tune` skips three `import torch`s. Each command still starts from a clean
    fork (nothing one command loads reaches the next). It exits after --idle-timeout seconds unused."""


@server_group.command("start")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=900.0, show_default=True,
              help="Exit after this many seconds with nothing to do.")
def server_start(idle_timeout: float) -> None:
    """Start this installation's server (nothing happens where it runs already)."""
    from .server import start

    try:
        info = start(idle_timeout)
    except ForgeError as exc:
        _fail(exc)
    state = "already running" if info.get("already") else "started"
    click.echo(f"forge-aot server {state}: pid {info['pid']}, socket {info['socket']}")


@server_group.command("stop")
def server_stop() -> None:
    """Stop this installation's server (it exits once the processes it forked have ended)."""
    from .server import stop

    click.echo("forge-aot server stopped" if stop() else "no forge-aot server was running")


@server_group.command("status")
def server_status() -> None:
    """Say whether this installation's server runs (exit status 1 where it does not)."""
    from .server import fingerprint, server_info, socket_path

    info = server_info()
    if info is None:
        click.echo(f"no forge-aot server (socket {socket_path()})")
        sys.exit(1)
    click.echo(f"forge-aot server: pid {info['pid']}, up {time.time() - info['started']:.0f} s, "
               f"{info['processes']} processes running, {info['forked']} forked in all, socket {info['socket']}")
    if info.get("fingerprint") != fingerprint():
        click.echo(f"  it runs other code than this installation (fingerprint {info.get('fingerprint')}, here "
                   f"{fingerprint()}): commands here start their own processes")
        sys.exit(1)


@main.command()
def schema() -> None:
    """Print the JSON schema of kernel_manifest.toml."""
    from .manifest import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


def entry() -> None:
    """The console script: ``main`` (click), then the process ends. Where a command imported torch (tune, build:
    the kernel files import it), the interpreter's teardown of torch takes a third of a second on the build
    machine and more on GPU hosts, after every result is written; once the output is flushed the process ends
    without it. Library callers and ``main`` itself are unaffected.

    Where this installation's ``forge-aot server`` runs, the command runs in a fork of it instead (see server.py).
    """
    if sys.argv[1:2] not in (["server"], ["-h"], ["--help"], []):
        from .server import forward

        forwarded = forward(sys.argv[1:])
        if forwarded is not None:
            sys.exit(forwarded)
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    if "torch" not in sys.modules:
        sys.exit(code)
    from .server import exit_without_teardown

    exit_without_teardown(code)


if __name__ == "__main__":
    entry()
