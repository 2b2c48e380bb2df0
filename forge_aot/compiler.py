"""Stage 3: compile. Parallel worker processes run triton.compile, one binary per request, with a timeout.

A config is usable when its generic binaries (those assuming nothing of the arguments) compile; if one fails
(error, crash, timeout, or more shared memory than the target has) the config is recorded with kernel,
variant, target and config, and left out, and the rows that preferred it move to their next choice. A
specialized binary that fails is reported and left out: its calls take a less specialized binary (a failed
one with arguments specialized to 1 is retried without that assumption). An entry fails only when one of its
rows has no config left.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CompileError
from .plan import BinarySpec, BuildPlan, CompileJob, ConfigChoice, EntryPlan, job_for
from .runtime import SPEC_INT_ONE, SPEC_ONE
from .server import spawn_module
from .targets import TARGETS

UNTRACED = "(a combination of None arguments no example passed)"
"""How a failure of a speculative binary (``BinarySpec.speculative``) is marked in ``CompileReport.failures``."""


def triton_version() -> str:
    """``triton.__version__``, read from the package's ``__init__`` where Triton is not imported yet: the parent
    process plans through a host shim and compiles in worker processes, so importing Triton only for its
    version (a third of a second here, more on busy GPU hosts) is wasted. The same text the import would give;
    the import itself where the file does not assign it literally."""
    loaded = sys.modules.get("triton")
    if loaded is not None:
        return str(loaded.__version__)
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        with contextlib.suppress(OSError, ValueError):
            found = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]\s*$""",
                              Path(spec.origin).read_text(encoding="utf-8"), re.MULTILINE)
            if found:
                return found.group(1)
    import triton

    return str(triton.__version__)

ProgressFn = Callable[[str, int, int, str], None]
"""progress(stage, done, total, message)."""


@dataclass(frozen=True)
class CompileResult:
    job: CompileJob
    ok: bool
    sidecar: dict[str, Any] | None = None
    error: str = ""
    seconds: float = 0.0


class _Worker:
    """One compile process, reused across jobs until it crashes or times out."""

    def __init__(self, env: dict[str, str], cwd: Path | None) -> None:
        self.proc = spawn_module("forge_aot._compile_worker", env, cwd)  # forked by a running server, if any
        self.results: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self.used = False
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _pump(self) -> None:
        from ._compile_worker import RESULT_MARK

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT_MARK):
                self.results.put(line[len(RESULT_MARK):])
        self.results.put(None)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            del self.stderr[:-50]

    def request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.used = True
        try:
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
            line = self.results.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            return {"ok": False, "error": f"timed out after {timeout:g} s", "dead": True}
        except (BrokenPipeError, OSError):
            line = None
        if line is None:
            self.kill()
            tail = "".join(self.stderr[-10:]).strip()
            return {"ok": False, "error": f"compiler process died (exit {self.proc.poll()}): {tail}"[-2000:],
                    "dead": True}
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def hang_up(self) -> None:
        """Close the job pipe: the worker exits once its current job is answered."""
        if self.proc.stdin is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def reap(self) -> None:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


class CompilePool:
    """Runs CompileJobs on up to ``jobs`` worker processes."""

    def __init__(self, jobs: int | None = None, cache_dir: Path | None = None, root: Path | None = None,
                 line_info: bool = True, nice: int = 0) -> None:
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.root = root  # workers run here: job sources are relative to the manifest
        self.env = dict(os.environ)
        if nice:
            self.env["FORGE_AOT_COMPILE_NICE"] = str(nice)
        if not line_info:
            self.env["TRITON_DISABLE_LINE_INFO"] = "1"
        if cache_dir is not None:
            self.env["TRITON_CACHE_DIR"] = str(cache_dir)
        # The worker imports forge_aot; make sure it resolves to this very installation.
        package_parent = str(Path(__file__).resolve().parent.parent)
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, self.env.get("PYTHONPATH")) if p)
        self._idle: list[_Worker] = []
        self._idle_lock = threading.Lock()

    def prestart(self, count: int | None = None) -> None:
        """Start ``count`` worker processes now (every one by default; each imports Triton while the caller does
        other work); jobs start the others when they need them."""
        with self._idle_lock:
            while len(self._idle) < min(self.jobs, count or self.jobs):
                self._idle.append(_Worker(self.env, self.root))

    def _take(self) -> _Worker:
        with self._idle_lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
        return _Worker(self.env, self.root)

    def close(self) -> None:
        """End the idle worker processes."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for worker in idle:  # all at once: each exit takes a moment
            if worker.used:
                worker.hang_up()
            else:
                worker.kill()  # started ahead of time and never given a job (nothing to compile): no state
        for worker in idle:
            worker.reap()

    def run(self, jobs: list[CompileJob], out_dir: Path, progress: ProgressFn | None = None,
            on_result: Callable[[CompileResult], None] | None = None) -> list[CompileResult]:
        """Compile every job (in order, on up to ``self.jobs`` processes); ``on_result`` is called with each result
        as it arrives (from the pool's threads), so a caller can use binaries while the rest compile."""
        pending: queue.Queue[tuple[int, CompileJob]] = queue.Queue()
        for item in enumerate(jobs):
            pending.put(item)
        results: list[CompileResult | None] = [None] * len(jobs)
        done = [0]
        lock = threading.Lock()

        def work() -> None:
            worker: _Worker | None = None
            try:
                while True:
                    try:
                        i, job = pending.get_nowait()
                    except queue.Empty:
                        return
                    if worker is None:
                        worker = self._take()
                    t = TARGETS[job.target]
                    payload = {**job.to_json(), "binary_stem": job.binary_stem, "out_dir": str(out_dir),
                               "target_info": {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}}
                    start = time.perf_counter()
                    try:
                        reply = worker.request(payload, job.timeout)
                    except Exception as exc:  # a job this process cannot send (or read back): failed, never
                        worker.kill()        # resubmitted; the worker's state is unknown, so a fresh one follows
                        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "dead": True}
                    if reply.get("dead"):
                        worker = None
                    results[i] = _check_result(job, reply, time.perf_counter() - start, out_dir)
                    if on_result is not None:
                        on_result(results[i])  # type: ignore[arg-type]
                    with lock:
                        done[0] += 1
                        if progress:
                            r = results[i]
                            status = "ok" if r and r.ok else "FAILED"
                            progress("compile", done[0], len(jobs), f"{job.binary_stem} {status}")
            finally:
                if worker is not None:
                    with self._idle_lock:  # kept for the next run (a build compiles in several rounds)
                        self._idle.append(worker)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(min(self.jobs, len(jobs)))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return [r for r in results if r is not None]


def _check_result(job: CompileJob, reply: dict[str, Any], seconds: float, out_dir: Path) -> CompileResult:
    if not reply.get("ok"):
        return CompileResult(job, False, error=str(reply.get("error", "unknown error")), seconds=seconds)
    sidecar = reply["sidecar"]
    limit = TARGETS[job.target].max_shared
    if sidecar["shared"] > limit:
        for ext in (sidecar["format"], "json"):
            (out_dir / f"{job.binary_stem}.{ext}").unlink(missing_ok=True)
        return CompileResult(job, False, error=f"out of resources: needs {sidecar['shared']} bytes of shared "
                             f"memory, {job.target} has {limit}", seconds=seconds)
    return CompileResult(job, True, sidecar=sidecar, seconds=seconds)


@dataclass
class CompiledEntry:
    """Outcome for one entry: the config each table row ended with, and its binaries."""

    entry: EntryPlan
    tables: dict[str, list[tuple[tuple[int, ...], str]]] = field(default_factory=dict)
    configs: dict[str, ConfigChoice] = field(default_factory=dict)
    binaries: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """config id → binary id → sidecar."""


@dataclass
class CompileReport:
    entries: list[CompiledEntry]
    failures: list[str]
    """One line per failed binary (kernel, variant, target, config, binary, reason)."""
    results: list[CompileResult]
    errors: list[CompileError]
    left_out: list[CompileError] = field(default_factory=list)
    """Build variants that compiled for no config on one of their kernel's ``optional-targets`` (and for some
    other target): left out of that target, not an error."""

    def to_json(self) -> dict[str, Any]:
        return {
            "failures": self.failures,
            "errors": [str(e) for e in self.errors],
            "binaries": [{"stem": r.job.binary_stem, "ok": r.ok, "seconds": round(r.seconds, 3),
                          "error": r.error, "sha256": (r.sidecar or {}).get("sha256")} for r in self.results],
            "entries": [{"kernel": c.entry.kernel, "variant": c.entry.variant, "target": c.entry.target,
                         "tables": {d: [[list(k), cid] for k, cid in rows] for d, rows in c.tables.items()}}
                        for c in self.entries],
        }


def compile_plan(plan: BuildPlan, out_dir: Path, pool: CompilePool,
                 progress: ProgressFn | None = None) -> CompileReport:
    """Compile every binary the tables need, walking down a row's preferences past configs that failed."""
    Key = tuple[str, str, str, str, BinarySpec]
    status: dict[Key, CompileResult] = {}
    all_results: list[CompileResult] = []

    def key(e: EntryPlan, c: ConfigChoice, b: BinarySpec) -> Key:
        return (e.kernel, e.variant, e.target, c.id, b)

    def needed_for(e: EntryPlan, row_key: tuple[int, ...], c: ConfigChoice) -> list[BinarySpec]:
        wanted = plan.binaries_for(e, row_key, c)
        # A failed binary that assumed integers equal to 1 is retried without that assumption.
        for b in list(wanted):
            r = status.get(key(e, c, b))
            if r is not None and not r.ok and (SPEC_ONE in b.spec or SPEC_INT_ONE in b.spec):
                wanted.append(b.relaxed([i for i, ch in enumerate(b.spec) if ch in (SPEC_ONE, SPEC_INT_ONE)]))
        return list(dict.fromkeys(wanted))

    def usable(e: EntryPlan, row_key: tuple[int, ...], c: ConfigChoice) -> bool | None:
        """True: every generic binary compiled; False: one failed; None: not all compiled yet."""
        outcome: bool | None = True
        for b in needed_for(e, row_key, c):
            r = status.get(key(e, c, b))
            if r is None:
                outcome = None
            elif not r.ok and b.generic and not b.speculative:
                return False
        return outcome

    while True:
        jobs: dict[Key, CompileJob] = {}
        for e in plan.entries:
            for rows in e.tables.values():
                for row in rows:
                    for c in row.preferences:
                        state = usable(e, row.key, c)
                        if state is False:
                            continue
                        if state is None:
                            for b in needed_for(e, row.key, c):
                                if key(e, c, b) not in status:
                                    jobs[key(e, c, b)] = job_for(plan, e, c, b)
                        break
        if not jobs:
            break
        results = pool.run(list(jobs.values()), out_dir, progress)
        answered = {id(r.job) for r in results}
        for job in jobs.values():  # every job gets an outcome, so each round makes progress and the loop ends
            if id(job) not in answered:
                results.append(CompileResult(job, False, error="the compile pool returned no result for it"))
        all_results += results
        for r in results:
            status[(r.job.kernel, r.job.variant, r.job.target, r.job.config.id, r.job.binary)] = r

    def describe(r: CompileResult) -> str:
        untraced = f" {UNTRACED}" if r.job.binary.speculative else ""
        return (f"{r.job.kernel} [{r.job.variant}] {r.job.target} {r.job.config.id} ({r.job.binary.id}){untraced}: "
                f"{r.error}")

    failed = [r for r in all_results if not r.ok]
    failures = [describe(r) for r in failed]
    entries: list[CompiledEntry] = []
    errors: list[CompileError] = []
    for e in plan.entries:
        ce = CompiledEntry(e)
        failed_entry = False
        for device, rows in e.tables.items():
            resolved = []
            for row in rows:
                chosen = next((c for c in row.preferences if usable(e, row.key, c)), None)
                if chosen is None:
                    failed_entry = True
                    break
                resolved.append((row.key, chosen.id))
                ce.configs[chosen.id] = chosen
                binaries = ce.binaries.setdefault(chosen.id, {})
                for b in needed_for(e, row.key, chosen):
                    r = status[key(e, chosen, b)]
                    if r.ok and r.sidecar is not None:
                        binaries[b.id] = r.sidecar
            ce.tables[device] = resolved
        if failed_entry:
            mine = [describe(r) for r in failed
                    if (r.job.kernel, r.job.variant, r.job.target) == (e.kernel, e.variant, e.target)]
            errors.append(CompileError(e.kernel, e.variant, e.target, mine))
        else:
            entries.append(ce)
    # A variant that failed on one of its kernel's optional targets is left out there, provided it compiled for
    # another target: a kernel that compiles nowhere is still the build's error.
    built = {(ce.entry.kernel, ce.entry.variant) for ce in entries}
    left_out = [err for err in errors if err.target in plan.kernels[err.kernel].entry.optional_targets
                and (err.kernel, err.variant) in built]
    errors = [err for err in errors if err not in left_out]
    dropped = {line for err in left_out for line in err.failures}  # reported with their variant, not as a fallback
    return CompileReport(entries, [f for f in failures if f not in dropped], all_results, errors, left_out)
