"""A tuning run (``forge-aot tune``): plan → rows and candidates → compile on every CPU core *while* one
benchmark worker per GPU measures what has compiled → database → report.

Per row: every candidate not yet in the database is probed (one run: its result checked against the reference,
what its binary says read), the compiled metadata prunes some (``static_prune``), the search strategy
benchmarks the rest or part of it, the finalists are re-measured interleaved, and the winner is verified on
fresh inputs before it enters the database. A candidate that faults or hangs costs one worker process: it is
recorded as crashed (or timed out) and a fresh worker goes on with the rest.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import queue
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from .. import __version__
from ..compiler import CompilePool, CompileResult, ProgressFn, triton_version
from ..errors import ForgeError, ManifestError
from ..manifest import load_manifest
from ..plan import BuildPlan, ConfigChoice, job_for, make_plan
from ..runtime import Expression, pick_cuda_target, pick_hip_target
from ..server import spawn_module
from ..targets import TARGETS
from .apply import database_dir, source_hashes
from .bench_worker import RESULT_MARK
from .candidates import TuneItem, make_items, static_prune
from .database import Provenance, Record, TuningDatabase
from .search import Candidate, Ceilings, SearchContext, make_strategy
from .timing import EXTRA_ROUNDS, INTERLEAVE_ROUNDS, TIMING_RULES, TimingStats, decide, reversed_by_rounds

_T = TypeVar("_T")

FINALISTS = 3
"""At most this many of the best are re-measured interleaved before a winner is named."""
FINALIST_WINDOW = 1.05
"""Candidates within this factor of the best are finalists."""


class TuneError(ForgeError):
    """The tuning run cannot go on (no GPU, a worker that cannot start, inputs that fail)."""


@dataclass(frozen=True)
class TuneOptions:
    kernels: tuple[str, ...] = ()
    """Tune only these kernel entries (default: every entry with tuning inputs)."""
    shard: tuple[int, int] = (0, 1)
    """``(i, N)``: tune only the rows whose stable hash falls in shard i of N."""
    gpus: tuple[int, ...] | None = None
    """Visible GPU indices to benchmark on (default: all), one worker process each."""
    jobs: int | None = None
    """Compile processes (default: CPU cores)."""
    strategy: str | None = None
    """``exhaustive``, ``guided`` or ``auto``, over the manifest's ``tune.search``."""
    budget: float | None = None
    """Over the manifest's ``tune.budget``."""
    force: bool = False
    """Measure again what the database already has."""
    build_dir: Path | None = None
    candidate_timeout: float = 60.0
    """Seconds one candidate may run (probe, timing) before its worker is killed and it is recorded as timed out."""
    seed: int = 0
    report: bool = True


@dataclass
class CandidateResult:
    cid: str
    status: str
    median_ms: float | None = None
    stats: dict[str, Any] | None = None
    rel_err: float | None = None
    error: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    cached: bool = False


@dataclass
class ItemResult:
    """What one row's tuning found (for the report and the CLI)."""

    row: str
    kernel: str
    variant: str
    key: dict[str, int]
    status: str
    """``tuned``, ``up to date`` or ``failed``."""
    winner: str | None = None
    winner_ms: float | None = None
    default: str | None = None
    default_ms: float | None = None
    candidates: list[CandidateResult] = field(default_factory=list)
    space: int = 0
    benchmarked: int = 0
    bound: str | None = None
    bytes: float | None = None
    flops: float | None = None
    strategy: str = ""
    seconds: float = 0.0
    ready_at: float | None = None
    """Seconds from the start of the run to the row's binaries all compiled (None: not compiled this run)."""
    started_at: float | None = None
    """Seconds from the start of the run to a GPU taking the row."""
    gpu: str | None = None
    """The GPU (CUDA_VISIBLE_DEVICES id) whose worker tuned the row."""
    phases: dict[str, float] = field(default_factory=dict)
    """Wall seconds of the row's worker commands: ``inputs``, ``probe``, ``time``, ``interleave``, ``verify``
    (where a run with several GPUs does not scale, they say which part waits)."""
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.winner_ms and self.default_ms:
            return self.default_ms / self.winner_ms
        return None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "candidates"}
        out["speedup"] = self.speedup
        out["candidates"] = [c.__dict__ for c in self.candidates]
        return out


@dataclass
class TuneRun:
    """A whole run: device, items, time split; written as JSON beside the report."""

    device: dict[str, Any]
    target: str
    gpus: list[str]
    items: list[ItemResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    """CPU seconds spent compiling (all processes)."""
    compile_wall: float = 0.0
    benchmark_seconds: float = 0.0
    """GPU-worker seconds spent on rows (all GPUs)."""
    benchmark_wall: float = 0.0
    wall: float = 0.0
    """The run, start to database (the report's rendering after it is ``report_seconds``)."""
    boot_wall: float = 0.0
    """Start of the run to every benchmark worker up (torch imported, CUDA up, ceilings measured)."""
    compile_started_at: float = 0.0
    """Start of the run to the first compile job handed out (after planning: the tuning inputs are traced with
    torch, and the kernel files imported, in this process)."""
    boot_stages: dict[str, float] = field(default_factory=dict)
    """Start of the run to the end of each step before compiling: ``manifest`` read, compile workers
    ``prestarted``, GPU ``described`` through the driver, ``planned`` (kernel files imported, tuning inputs
    traced), rows ``sorted`` into new and up to date."""
    first_row_at: float = 0.0
    """Start of the run to the first row's benchmark (its binaries compiled, a worker set up)."""
    gpu_idle_seconds: float = 0.0
    """Time the benchmark workers spent waiting for compiled rows after set-up (all GPUs)."""
    close_seconds: float = 0.0
    """Ending the worker processes after the last row."""
    report_seconds: float = 0.0
    binaries: int = 0
    database: str = ""
    report: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "items"}
        out["items"] = [i.to_json() for i in self.items]
        return out


# ---------------------------------------------------------------------------------------------------------
# One GPU worker process, seen from the parent
# ---------------------------------------------------------------------------------------------------------

_TIMEOUT = object()


class WorkerError(TuneError):
    pass


class WorkerClient:
    """Starts, feeds and restarts one benchmark worker process bound to one GPU."""

    def __init__(self, gpu: str, root: Path, timeout: float) -> None:
        self.gpu = gpu
        self.root = root
        self.timeout = timeout
        self.proc: Any = None  # subprocess.Popen or server.ServerProcess
        self.events: queue.Queue[Any] = queue.Queue()
        self.stderr: deque[str] = deque(maxlen=60)
        self.setup_cmd: dict[str, Any] | None = None
        self.item_cmd: dict[str, Any] | None = None
        self.device: dict[str, Any] = {}
        self.restarts = 0
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env["PYTHONUNBUFFERED"] = "1"
        package_parent = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        self.env = env

    def _spawn(self) -> None:
        self.events = queue.Queue()
        events = self.events
        # FORGE_AOT_TUNE_WORKER swaps the worker module (the CPU tests use a simulated GPU that speaks the protocol).
        module = os.environ.get("FORGE_AOT_TUNE_WORKER", "forge_aot.tune.bench_worker")
        proc = spawn_module(module, self.env, self.root)  # forked by a running `forge-aot server`, if any
        self.proc = proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(RESULT_MARK):
                    events.put(json.loads(line[len(RESULT_MARK):]))
            events.put(None)

        def drain() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.stderr.append(line)

        threading.Thread(target=pump, daemon=True).start()
        threading.Thread(target=drain, daemon=True).start()

    def _send(self, cmd: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(cmd, default=str) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader sees the process end

    def _next(self, timeout: float) -> Any:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return _TIMEOUT

    def tail(self) -> str:
        return "".join(list(self.stderr)[-12:]).strip()[-3000:]

    def _expect(self, name: str, timeout: float) -> dict[str, Any]:
        ev = self._next(timeout)
        if ev is _TIMEOUT or ev is None or ev.get("event") != name:
            detail = ev.get("error", ev) if isinstance(ev, dict) else ("timed out" if ev is _TIMEOUT else "exited")
            self.kill()
            raise WorkerError(f"benchmark worker on GPU {self.gpu}: expected {name}, got {detail}\n{self.tail()}")
        return ev

    def start(self) -> dict[str, Any]:
        self._spawn()
        self._send({"cmd": "device"})
        self.device = self._expect("device", 600)["device"]
        if self.setup_cmd is not None:
            self._send(self.setup_cmd)
            self._expect("ready", 900)
        if self.item_cmd is not None:
            self._send({"cmd": "item", "item": self.item_cmd})
            self._expect("item", 900)
        return self.device

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _ensure(self) -> None:
        if not self.alive():
            self.kill()
            self.restarts += 1
            self.start()

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self.proc = None

    def hang_up(self) -> None:
        """Close the command pipe: the worker exits after its current command."""
        if self.proc is not None and self.proc.stdin is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def close(self) -> None:
        self.hang_up()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self.kill()

    def setup(self, cmd: dict[str, Any]) -> None:
        self.setup_cmd = cmd
        self._ensure()
        self._send(cmd)
        self._expect("ready", 900)

    def set_item(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.item_cmd = cmd
        self._ensure()
        self._send({"cmd": "item", "item": cmd})
        return self._expect("item", 900)

    def run(self, cmd: str, cands: list[dict[str, Any]], **extra: Any) -> dict[str, dict[str, Any]]:
        """Run ``probe`` or ``time`` over candidates; a candidate that kills or hangs the worker is recorded
        (``crashed`` / ``timeout``) and the rest go on in a fresh worker."""
        results: dict[str, dict[str, Any]] = {}
        pending = list(cands)
        while pending:
            self._ensure()
            self._send({"cmd": cmd, "candidates": pending, **extra})
            current: str | None = None
            while True:
                ev = self._next(self.timeout)
                if ev is _TIMEOUT or ev is None:
                    status = "timeout" if ev is _TIMEOUT else "crashed"
                    tail = self.tail()
                    proc = self.proc
                    self.kill()
                    if current is None:
                        raise WorkerError(f"benchmark worker on GPU {self.gpu} {status} outside any candidate:\n{tail}")
                    code = proc.returncode if proc is not None else None
                    results[current] = {"status": status, "error": (
                        f"no answer within {self.timeout:g} s: the worker was killed" if status == "timeout"
                        else f"the worker process died (exit code {code}): {tail}")}
                    pending = [c for c in pending if c["cid"] != current]
                    break
                kind = ev.get("event")
                if kind == "start":
                    current = ev["cid"]
                elif kind == "result":
                    results[ev["cid"]] = ev
                    pending = [c for c in pending if c["cid"] != ev["cid"]]
                    current = None
                    if ev.get("status") == "crashed":
                        self.kill()  # it exits by itself: its context may be poisoned
                        break
                elif kind == "done":
                    pending = []
                    break
                elif kind == "error":
                    raise WorkerError(f"benchmark worker on GPU {self.gpu}: {ev['error']}")
        return results

    def single(self, cmd: dict[str, Any], answer: str) -> dict[str, Any] | None:
        """A command with one answer (``interleave``, ``verify``); None if the worker died or hung on it."""
        self._ensure()
        self._send(cmd)
        while True:
            ev = self._next(self.timeout * 4)
            if ev is _TIMEOUT or ev is None:
                self.kill()
                return None
            if ev.get("event") == answer:
                return ev
            if ev.get("event") == "error":
                raise WorkerError(f"benchmark worker on GPU {self.gpu}: {ev['error']}")


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=1)
def _local_cuda_driver() -> Any:
    """libcuda in this process (loaded and initialised once), or None where it does not load or has no GPU."""
    try:
        from ..runtime.cuda import open_driver

        return open_driver()
    except Exception:
        return None


def _device_count() -> int:
    """GPUs the driver sees: through libcuda alone where it loads (importing torch here would hold back the
    start of the benchmark workers by seconds), else through torch (ROCm)."""
    drv = _local_cuda_driver()
    if drv is not None:
        with contextlib.suppress(Exception):
            return int(drv.device_count())
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:
        return 0


def _visible_gpus(requested: tuple[int, ...] | None) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    else:
        ids = [str(i) for i in range(_device_count())]
    if not ids:
        raise TuneError("forge-aot tune needs a GPU: the driver sees none (no GPU, or CUDA_VISIBLE_DEVICES hides them)")
    if requested:
        bad = [g for g in requested if g >= len(ids)]
        if bad:
            raise TuneError(f"--gpus {bad[0]}: only {len(ids)} GPUs are visible")
        ids = [ids[g] for g in requested]
    return ids


def _local_target(device: dict[str, Any], targets: list[str]) -> str:
    built = {t: {"backend": TARGETS[t].backend, "arch": TARGETS[t].arch, "arch_specific": TARGETS[t].arch_specific}
             for t in targets}
    if device["backend"] == "cuda":
        major, minor = (int(x) for x in device["capability"].split("."))
        target = pick_cuda_target((major, minor), built)
    else:
        target = pick_hip_target(device["arch"], built)
    if target is None:
        raise TuneError(f"the local GPU {device['name']} ({device['arch']}) runs none of the manifest's targets "
                        f"({', '.join(targets)}); add its target to project.targets")
    return target


def _type_sizes(item: TuneItem) -> dict[str, int]:
    sizes = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u8": 1,
             "u16": 2, "u32": 4, "u64": 8, "i1": 1, "fp8e4nv": 1, "fp8e5": 1}
    return {tv: sizes[item.entry.assignment[tv]] for tv in item.kernel.entry.dtypes}


def _expression(text: str | None, item: TuneItem) -> float | None:
    if not text:
        return None
    return float(Expression(text).value({**item.key_dict, **_type_sizes(item)}))


def _tolerance(item: TuneItem) -> float:
    t = item.kernel.entry.tune.tolerance
    if t is not None:
        return t
    small = any(v in ("fp16", "bf16", "fp8e4nv", "fp8e5", "i8", "u8") for v in item.entry.assignment.values())
    return 2e-2 if small else 2e-3


class _Tuner:
    """The state of one run, shared by the compile thread and the GPU threads."""

    def __init__(self, plan: BuildPlan, db: TuningDatabase, options: TuneOptions,
                 device: dict[str, Any], target: str, run: TuneRun, progress: ProgressFn | None,
                 compiles: _Compiles, source: dict[str, dict[str, str]]) -> None:
        self.plan = plan
        self.db = db
        self.options = options
        self.device = device
        self.target = target
        self.run = run
        self.progress = progress
        self.bin_dir = compiles.bin_dir
        self.lock = threading.Lock()
        self.compiled = compiles.compiled
        self.ceilings = Ceilings(float(device["peak_bytes_per_s"]), float(device["peak_flops"]), int(device["sms"]))
        # source: each kernel's source_hashes, computed once when tune() sorted the rows
        self.provenance = {
            name: Provenance(gpu=device["name"], capability=device["capability"], target=target,
                             triton=triton_version(), driver=device.get("driver", ""), cuda=device.get("cuda", ""),
                             torch=device.get("torch", ""), forge_aot=__version__, **source[name])
            for name in plan.kernels}

    def payload(self, item: TuneItem, c: ConfigChoice) -> dict[str, Any] | None:
        """What the worker needs of a candidate: its config and its compiled binaries (None if none compiled)."""
        binaries = {}
        for b in item.binaries(c):
            job = job_for(self.plan, item.entry, c, b)
            r = self.compiled.get(job.binary_stem)
            if r is None or not r.ok or r.sidecar is None:
                continue
            ext = r.sidecar["format"]
            binaries[b.id] = {**r.sidecar, "path": str(self.bin_dir / f"{job.binary_stem}.{ext}")}
        return {"cid": c.id, "config": c.to_json(), "binaries": binaries} if binaries else None

    def compile_error(self, item: TuneItem, c: ConfigChoice) -> str:
        errors = [r.error for b in item.binaries(c)
                  if (r := self.compiled.get(job_for(self.plan, item.entry, c, b).binary_stem)) is not None
                  and not r.ok]
        return errors[-1] if errors else "no binary compiled"

    # -- one row ----------------------------------------------------------------------------------------
    def record(self, item: TuneItem, c: ConfigChoice, status: str, *, time_: dict[str, Any] | None = None,
               **extra: Any) -> Record:
        r = Record("measurement", item.entry.kernel, item.entry.variant, item.key_dict, c.id,
                   _flat(c), self.provenance[item.entry.kernel], status, time_,
                   {k: v for k, v in extra.items() if v not in (None, "", {})}, _now())
        with self.lock:
            self.db.append(r)
        return r

    def tune_item(self, client: WorkerClient, item: TuneItem) -> ItemResult:
        start = time.perf_counter()
        k = item.entry.kernel
        prov = self.provenance[k]
        t = item.kernel.entry.tune
        res = ItemResult(item.id, k, item.entry.variant, item.key_dict, "tuned", space=item.space,
                         flops=_expression(t.flops, item), gpu=client.gpu)
        phases = res.phases

        def timed(phase: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - began
        by_id = {c.id: c for c in item.candidates}
        known = {} if self.options.force else self.db.measurements(k, item.entry.variant, item.key_dict, prov)
        results: dict[str, CandidateResult] = {}
        for cid, why in item.pruned.items():
            results[cid] = CandidateResult(cid, "pruned", error=why)
        payloads: dict[str, dict[str, Any]] = {}
        for c in item.candidates:
            p = self.payload(item, c)
            if p is None:
                if c.id not in known:
                    self.record(item, c, "failed", error=self.compile_error(item, c)[-2000:])
                results[c.id] = CandidateResult(c.id, "failed", error=self.compile_error(item, c)[-300:])
            else:
                payloads[c.id] = p
        # A compiled candidate recorded as ``failed`` raised in the worker (no verdict on the config, as wrong,
        # crashed, timed out or pruned are): the failure may have been the inputs' or the tuner's, so it is probed
        # again. (Session 25: every candidate of rows with a pointer passed as None had failed in the timer.)
        known = {cid: r for cid, r in known.items() if r.status != "failed" or cid not in payloads}
        usable = [c for c in item.candidates if c.id in payloads]
        if not usable:
            res.status, res.candidates = "failed", list(results.values())
            res.notes.append("no candidate compiled")
            return res
        default = usable[0]
        res.default = item.default.id
        seed = int(hashlib.sha256(f"{item.id}:{self.options.seed}".encode()).hexdigest()[:8], 16)
        cmd = {"kernel": k, "module": item.kernel.module, "assignment": item.entry.assignment,
               "type_vars": list(item.kernel.entry.dtypes), "key": item.key_dict, "target": self.target,
               "inputs": t.inputs, "op": t.op or item.kernel.entry.ops[0], "reference": t.reference,
               "tolerance": _tolerance(item), "reset": item.kernel.reset_to_zero, "l2": item.kernel.entry.tune.l2,
               "restore": item.kernel.restore_value, "seed": seed, "default": payloads[default.id]}
        try:
            info = timed("inputs", client.set_item, cmd)
        except WorkerError as exc:
            res.status = "failed"
            res.notes.append(f"the tuning inputs or the reference failed: {exc}")
            return res
        # 1. Probe what the database does not have: result checked, binary read.
        features: dict[str, dict[str, Any]] = {}
        cached: dict[str, TimingStats] = {}
        for cid, r in known.items():
            if cid not in payloads:
                continue
            if r.status == "ok" and r.time:
                cached[cid] = TimingStats.from_json(r.time)
                features[cid] = r.extra.get("attrs", {})
            results[cid] = CandidateResult(cid, r.status, r.median_ms, r.time, r.extra.get("rel_err"),
                                           r.extra.get("error", ""), r.extra.get("attrs", {}), cached=True)
        to_probe = [payloads[c.id] for c in usable if c.id not in known]
        probed = timed("probe", client.run, "probe", to_probe) if to_probe else {}
        for cid, ev in probed.items():
            status = ev["status"]
            attrs = ev.get("attrs", {})
            if status == "ok":
                features[cid] = attrs
            else:
                self.record(item, by_id[cid], status, rel_err=ev.get("rel_err"), error=ev.get("error", ""),
                            attrs=attrs)
            results[cid] = CandidateResult(cid, status, rel_err=ev.get("rel_err"), error=ev.get("error", ""),
                                           attrs=attrs)
        res.bytes = _expression(t.bytes, item) or next(
            (float(f["tensor_bytes"]) for f in features.values() if f.get("tensor_bytes")), None) \
            or float(info.get("input_bytes") or 0) or None
        probed_ok = set(features)
        # 2. What the compiled binaries rule out.
        fresh = {cid: f for cid, f in features.items() if cid not in cached}
        for cid, why in static_prune(fresh, int(self.device["max_shared"])).items():
            self.record(item, by_id[cid], "pruned", error=why, attrs=fresh[cid])
            results[cid] = CandidateResult(cid, "pruned", error=why, attrs=fresh[cid])
            features.pop(cid)
        # 3. Search.
        cands = [Candidate(c.id, c, features[c.id]) for c in usable if c.id in features]
        if not cands:
            res.status, res.candidates = "failed", list(results.values())
            res.notes.append("every candidate failed, gave a wrong result or was pruned")
            return res
        strategy = make_strategy(self.options.strategy or t.search, len(item.candidates),
                                 self.options.budget or t.budget)
        res.strategy = strategy.name

        def measure(batch: list[Candidate], best: float | None) -> dict[str, TimingStats | None]:
            out: dict[str, TimingStats | None] = {}
            todo = []
            for c in batch:
                if c.cid in cached:
                    out[c.cid] = cached[c.cid]
                else:
                    todo.append(payloads[c.cid])
            for cid, ev in (timed("time", client.run, "time", todo, best_ms=best) if todo else {}).items():
                prev = results.get(cid) or CandidateResult(cid, "ok")
                if ev["status"] == "ok":
                    stats = TimingStats.from_json(ev["time"])
                    out[cid] = stats
                    self.record(item, by_id[cid], "ok", time_=ev["time"], rel_err=prev.rel_err,
                                attrs=features.get(cid))
                    results[cid] = CandidateResult(cid, "ok", stats.median_ms, ev["time"], prev.rel_err,
                                                   attrs=features.get(cid, {}))
                else:
                    out[cid] = None
                    self.record(item, by_id[cid], ev["status"], error=ev.get("error", ""), rel_err=ev.get("rel_err"),
                                attrs=features.get(cid))
                    results[cid] = CandidateResult(cid, ev["status"], rel_err=ev.get("rel_err"),
                                                   error=ev.get("error", ""))
            return out

        ctx = SearchContext(item.space, self.ceilings, measure, res.bytes, res.flops)
        outcome = strategy.search(cands, ctx)
        res.bound = outcome.bound
        res.notes += outcome.notes
        res.benchmarked = outcome.benchmarked
        for cid, why in outcome.pruned.items():
            results.setdefault(cid, CandidateResult(cid, "pruned", error=why))
        ok = {cid: s for cid, s in outcome.times.items() if not s.early_exit}
        if not ok:
            res.status, res.candidates = "failed", list(results.values())
            bad = sorted({r.status for r in results.values() if r.status not in ("ok", "unbenchmarked")})
            res.notes.append(f"no candidate was timed (the others: {', '.join(bad) or 'none'})")
            return res
        # 4. Finalists re-measured interleaved, the untuned default beside them (even where it is pruned or was
        # not benchmarked: it is the baseline the winner is compared with, in the same measurement).
        best = min(s.median_ms for s in ok.values())
        finalists = sorted((cid for cid, s in ok.items() if s.median_ms <= best * FINALIST_WINDOW),
                           key=lambda cid: ok[cid].median_ms)[:FINALISTS]
        runnable = default.id in probed_ok and default.id not in finalists
        measured = finalists + ([default.id] if runnable else [])
        final = {cid: ok[cid] for cid in finalists}
        rounds: dict[str, list[float]] = {}
        modes: dict[str, str] = {}

        def interleave(n: int) -> bool:
            ev = timed("interleave", client.single,
                       {"cmd": "interleave", "candidates": [payloads[c] for c in measured], "rounds": n},
                       "interleaved")
            if ev is not None:
                for cid, meds in ev["rounds"].items():
                    rounds.setdefault(cid, []).extend(meds)
                modes.update(ev["modes"])
            return ev is not None

        if interleave(INTERLEAVE_ROUNDS):
            if reversed_by_rounds(ok, rounds, finalists):
                # The rounds and the first pass disagree on the leader: more evidence before a winner is named.
                res.notes.append(f"the interleaved rounds reversed the first pass's leader: {EXTRA_ROUNDS} more")
                interleave(EXTRA_ROUNDS)
            final = decide(ok, rounds, modes)
        else:
            res.notes.append("the interleaved re-measurement failed; first-pass times decide")
        eligible = [cid for cid in final if cid in ok]
        # 5. The winner, verified on fresh inputs (the next best where it fails).
        order = sorted(eligible, key=lambda cid: final[cid].median_ms) + \
            sorted((c for c in ok if c not in eligible), key=lambda cid: ok[cid].median_ms)
        winner = None
        verified: dict[str, Any] = {}
        for cid in order[:FINALISTS + 2]:
            ev = timed("verify", client.single, {"cmd": "verify", "candidate": payloads[cid],
                                                 "default": payloads[default.id], "seed": seed + 1}, "verified")
            if ev is not None and ev.get("ok"):
                winner, verified = cid, {"rel_err": ev["rel_err"], "tolerance": cmd["tolerance"], "seed": seed + 1}
                break
            why = ("crashed on fresh inputs" if ev is None
                   else f"wrong on fresh inputs: relative error {ev['rel_err']:.3g}")
            self.record(item, by_id[cid], "wrong" if ev is not None else "crashed", error=why,
                        rel_err=None if ev is None else ev["rel_err"])
            results[cid] = CandidateResult(cid, "wrong" if ev is not None else "crashed", error=why)
            res.notes.append(f"{cid} rejected: {why}")
        res.candidates = [results.get(c.id, CandidateResult(c.id, "unbenchmarked")) for c in item.candidates]
        baseline = final.get(default.id) or ok.get(default.id)
        res.default_ms = baseline.median_ms if baseline else None
        if item.default.id != default.id:
            res.notes.append(f"the untuned default {item.default.id} did not compile; {default.id} stands in")
        if winner is None:
            res.status = "failed"
            res.notes.append("no finalist passed verification on fresh inputs")
            return res
        w = final.get(winner) or ok[winner]
        res.winner, res.winner_ms = winner, w.median_ms
        throughput = {}
        if res.bytes:
            throughput["bytes_per_s"] = res.bytes / (w.median_ms / 1e3)
            throughput["bandwidth_fraction"] = throughput["bytes_per_s"] / self.ceilings.bytes_per_s
        if res.flops:
            throughput["flops_per_s"] = res.flops / (w.median_ms / 1e3)
            throughput["flops_fraction"] = throughput["flops_per_s"] / self.ceilings.flops
        rec = Record("winner", k, item.entry.variant, item.key_dict, winner, _flat(by_id[winner]), prov, "ok",
                     w.to_json(), {"verified": verified,
                                   "default": {"config_id": default.id, "median_ms": res.default_ms,
                                               "eligible": default.id in ok},
                                   "finalists": {cid: s.to_json() for cid, s in final.items()},
                                   "rounds": {cid: [round(m, 6) for m in r] for cid, r in rounds.items()},
                                   "search": {"strategy": strategy.name, "benchmarked": outcome.benchmarked,
                                              "space": item.space, "candidates": len(item.candidates),
                                              "candidates_sha256": _candidates_sha256(item)},
                                   "bound": outcome.bound, "throughput": throughput,
                                   "timing_rules": TIMING_RULES}, _now())
        with self.lock:
            self.db.append(rec)
        res.seconds = time.perf_counter() - start
        return res


def decided_under_current_rules(winner: Record) -> bool:
    """Whether the winner was decided under the current timing rules (timing.TIMING_RULES) and its finalists
    were all timed the same way. Otherwise (a tuner that compared an event timing with a graph replay, or whose
    event timings of short kernels included the host's latency) the row is decided again: the candidates'
    measurements are kept, the finalists re-measured."""
    return (int(winner.extra.get("timing_rules", 1)) >= TIMING_RULES
            and len({s.get("mode") for s in winner.extra.get("finalists", {}).values()}) <= 1)


def _from_database(item: TuneItem, winner: Record, known: dict[str, Record]) -> ItemResult:
    """A row the database already has, as the report shows it."""
    default = winner.extra.get("default", {})
    search = winner.extra.get("search", {})
    res = ItemResult(item.id, item.entry.kernel, item.entry.variant, item.key_dict, "up to date", winner.config_id,
                     winner.median_ms, default.get("config_id"), default.get("median_ms"), space=item.space,
                     benchmarked=int(search.get("benchmarked", 0)), bound=winner.extra.get("bound"),
                     strategy=str(search.get("strategy", "")))
    res.candidates = [CandidateResult(cid, r.status, r.median_ms, r.time, r.extra.get("rel_err"),
                                      r.extra.get("error", ""), r.extra.get("attrs", {}), cached=True)
                      for cid, r in known.items()]
    return res


def _flat(c: ConfigChoice) -> dict[str, Any]:
    out: dict[str, Any] = {**c.meta, "num_warps": c.num_warps, "num_stages": c.num_stages}
    if c.maxnreg is not None:
        out["maxnreg"] = c.maxnreg
    if c.pre_hook is not None:
        out["pre_hook"] = c.pre_hook
    return out


def _setup_command(plan: BuildPlan, root: Path) -> dict[str, Any]:
    from ..index import build_index

    index = build_index(plan, None, "jit", {m: str(spec["path"]) for m, spec in plan.modules.items()})
    return {"cmd": "setup", "root": str(root), "index": index,
            "modules": {m: [spec["path"], spec["full_host_source"]] for m, spec in plan.modules.items()},
            "kernel_files": {name: [str(kp.source), kp.function] for name, kp in plan.kernels.items()}}


def _candidates_sha256(item: TuneItem) -> str:
    return hashlib.sha256("\n".join(sorted(c.id for c in item.candidates)).encode()).hexdigest()


def _describe_locally(gpu_index: int) -> dict[str, Any] | None:
    """Name, compute capability and shared-memory limit of a visible GPU through the driver alone (no torch,
    no context): enough to plan and start compiling while the workers boot. None where that is unavailable."""
    drv = _local_cuda_driver()
    try:
        info = drv.describe(gpu_index) if drv is not None else None
    except Exception:
        info = None
    if info is None:
        return None
    major, minor = info["capability"]
    return {"name": info["name"], "capability": f"{major}.{minor}", "arch": info["arch"], "backend": "cuda",
            "max_shared": info["max_shared"]}


def item_jobs(plan: BuildPlan, item: TuneItem) -> dict[str, Any]:
    """The compile jobs of a row's candidates, by binary stem."""
    out = {}
    for c in item.candidates:
        for b in item.binaries(c):
            job = job_for(plan, item.entry, c, b)
            out[job.binary_stem] = job
    return out


class _Compiles:
    """Every binary of the rows to tune, compiled on all cores in a background thread; a row is ``ready`` once
    its binaries are all there (binaries of an earlier run of the same sources and Triton are reused)."""

    def __init__(self, plan: BuildPlan, todo: list[TuneItem], pool: CompilePool, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.compiled: dict[str, CompileResult] = {}
        self.ready: queue.Queue[int] = queue.Queue()
        self.seconds = 0.0
        self.wall = 0.0
        self.lock = threading.Lock()
        self.ready_clock: dict[int, float] = {}
        """Row index → time.perf_counter() when its last binary arrived."""
        needs: dict[int, set[str]] = {}
        all_jobs: dict[str, Any] = {}
        for i, item in enumerate(todo):
            jobs = item_jobs(plan, item)
            needs[i] = set(jobs)
            for stem, job in jobs.items():
                all_jobs.setdefault(stem, job)
        fresh = {}
        for stem, job in all_jobs.items():
            sidecar_path = bin_dir / f"{stem}.json"
            if sidecar_path.is_file():
                sidecar = json.loads(sidecar_path.read_text(encoding="utf-8"))
                if (bin_dir / f"{stem}.{sidecar['format']}").is_file():
                    self.compiled[stem] = CompileResult(job, True, sidecar)
                    continue
            fresh[stem] = job
        self.binaries = len(all_jobs)
        self.waiting = {i: s - set(self.compiled) for i, s in needs.items()}
        for i in [i for i, left in self.waiting.items() if not left]:
            self.ready_clock[i] = time.perf_counter()
            self.ready.put(i)
            self.waiting.pop(i)
        self.thread = threading.Thread(target=self._run, args=(pool, list(fresh.values())), daemon=True)
        self.thread.start()

    def _on_result(self, r: CompileResult) -> None:
        with self.lock:
            self.compiled[r.job.binary_stem] = r
            self.seconds += r.seconds
            for i in list(self.waiting):
                self.waiting[i].discard(r.job.binary_stem)
                if not self.waiting[i]:
                    self.waiting.pop(i)
                    self.ready_clock[i] = time.perf_counter()
                    self.ready.put(i)

    def _run(self, pool: CompilePool, jobs: list[Any]) -> None:
        start = time.perf_counter()
        try:
            if jobs:
                pool.run(jobs, self.bin_dir, None, self._on_result)
        finally:
            self.wall = time.perf_counter() - start
            pool.close()
            with self.lock:
                for i in list(self.waiting):  # anything left never compiled: release it (its candidates fail)
                    self.waiting.pop(i)
                    self.ready.put(i)


def tune(manifest_path: str | Path, options: TuneOptions | None = None,
         progress: ProgressFn | None = None) -> TuneRun:
    """Tune every manifest entry with tuning inputs on the local GPUs into the tuning database. Raises
    ForgeError subclasses; prints nothing.

    The order saves wall time: the GPU workers boot (import torch, measure the device's ceilings) while the
    parent reads the GPU's model through the driver, plans, and starts compiling on every core; each worker
    then binds the host modules while the first binaries compile."""
    options = options or TuneOptions()
    wall_start = time.perf_counter()
    stages: dict[str, float] = {}

    def stage(name: str) -> None:
        stages[name] = round(time.perf_counter() - wall_start, 4)

    loaded = load_manifest(manifest_path)
    stage("manifest")
    root = loaded.root
    db_dir = database_dir(loaded)
    if db_dir is None:
        raise ManifestError("forge-aot tune writes into the tuning database: set project.tuning-data (for example "
                            '"tuning") and create that directory', file=str(loaded.path),
                            key_path="project.tuning-data")
    gpus = _visible_gpus(options.gpus)
    work = Path(options.build_dir) if options.build_dir else root / "build" / "forge-aot"
    clients = [WorkerClient(g, root, options.candidate_timeout) for g in gpus]
    devices: list[dict[str, Any] | BaseException] = [None] * len(clients)  # type: ignore[list-item]

    def start(i: int) -> None:
        try:
            devices[i] = clients[i].start()
        except BaseException as exc:
            devices[i] = exc

    starters = [threading.Thread(target=start, args=(i,), daemon=True) for i in range(len(clients))]
    for th in starters:
        th.start()
    # Compiles run niced: the benchmark workers' host code (and their boot) must not queue behind them.
    pool = CompilePool(options.jobs, cache_dir=(work / "triton-cache").resolve(), root=root,
                       line_info=loaded.manifest.project.line_info, nice=COMPILE_NICE)
    compiles: _Compiles | None = None
    db: TuningDatabase | None = None
    try:
        # Compile workers import triton and torch while the parent plans: a first run compiles from the plan's end.
        # A re-run finds most binaries built (tune/binaries-*), and sixteen concurrent `import torch`s would only
        # slow the parent's and the benchmark worker's own (on the H100 host 3.3 - 4.2 s for three at once, 4.6 -
        # 6.8 s for eighteen; benchmarks/results/session24/r7): two start ahead, compiles start the others.
        rerun = next((work / "tune").glob("binaries-*/**/*.json"), None) is not None
        pool.prestart(PRESTART_ON_RERUN if rerun else None)
        stage("prestarted")
        first = options.gpus[0] if options.gpus else 0
        local = _describe_locally(first) if os.environ.get("FORGE_AOT_TUNE_WORKER") is None else None
        stage("described")
        plan_targets = list(loaded.manifest.project.targets)
        target = _local_target(local, plan_targets) if local else None
        plan = make_plan(loaded, [target] if target else None)
        stage("planned")
        db = TuningDatabase(db_dir)
        notes: list[str] = []
        state: dict[str, Any] = {}

        def prepare(target: str, gpu_name: str) -> None:
            plan.entries = [e for e in plan.entries if e.target == target]
            plan.targets = [target]
            items = make_items(plan, kernels=options.kernels, shard=options.shard, notes=notes)
            triton = triton_version()
            source = {name: source_hashes(kp) for name, kp in plan.kernels.items()}
            todo, current = [], []
            for item in items:
                prov = Provenance(gpu=gpu_name, capability="", target=target, triton=triton,
                                  **source[item.entry.kernel])
                known = db.measurements(item.entry.kernel, item.entry.variant, item.key_dict, prov)
                winner = db.winner(item.entry.kernel, item.entry.variant, item.key_dict, prov)
                searched = (winner.extra.get("search", {}).get("candidates_sha256") if winner else None)
                fresh = winner is not None and decided_under_current_rules(winner) and (
                    searched == _candidates_sha256(item) or all(c.id in known for c in item.candidates))
                if not options.force and fresh:
                    current.append(_from_database(item, winner, known))  # type: ignore[arg-type]
                else:
                    todo.append(item)
            stage("sorted")
            hashes = sorted((h["source_sha256"], h["code_sha256"]) for h in source.values())
            fingerprint = hashlib.sha256(json.dumps([triton, hashes]).encode()).hexdigest()[:16]
            state.update(todo=todo, current=current, source=source,
                         compiles=_Compiles(plan, todo, pool, (work / "tune" / f"binaries-{fingerprint}").resolve()),
                         compile_start=time.perf_counter() - wall_start)

        if target is not None and local is not None:
            prepare(target, local["name"])
            compiles = state["compiles"]
    finally:
        for th in starters:
            th.join()
    boot_wall = time.perf_counter() - wall_start
    try:
        failed = [d for d in devices if isinstance(d, BaseException)]
        if failed:
            raise TuneError(f"a benchmark worker did not start: {failed[0]}")
        device = devices[0]
        assert isinstance(device, dict)
        names = {d["name"] for d in devices if isinstance(d, dict)}
        if len(names) > 1:
            keep = [i for i, d in enumerate(devices) if isinstance(d, dict) and d["name"] == device["name"]]
            for i, c in enumerate(clients):
                if i not in keep:
                    c.close()
            notes.append(f"GPUs of several models ({', '.join(sorted(names))}): tuning on the {device['name']}s only")
            clients = [clients[i] for i in keep]
            gpus = [gpus[i] for i in keep]
        if target is None:
            target = _local_target(device, plan_targets)
            prepare(target, device["name"])
            compiles = state["compiles"]
        elif device["name"] != local["name"]:  # type: ignore[index]
            raise TuneError(f"GPU {gpus[0]} is a {local['name']} to the driver but a {device['name']} to "  # type: ignore[index]
                            "its worker")
        assert compiles is not None
        run = TuneRun(device, target, gpus, notes=notes + db.warnings, database=str(db_dir), boot_wall=boot_wall,
                      compile_started_at=state["compile_start"], boot_stages=stages)
        run.items += state["current"]
        tuner = _Tuner(plan, db, options, device, target, run, progress, compiles, state["source"])
        _pipeline(tuner, compiles, state["todo"], clients, run, _setup_command(plan, root), wall_start)
    finally:
        closing = time.perf_counter()
        for c in clients:  # hang up on all first: they exit in parallel
            c.hang_up()
        for c in clients:
            c.close()
        if compiles is None:
            pool.close()
        if db is not None:
            db.close()
    run.close_seconds = time.perf_counter() - closing
    run.wall = time.perf_counter() - wall_start
    out_dir = work / "tune"
    out_dir.mkdir(parents=True, exist_ok=True)
    if options.report:
        from .report import write_report

        started = time.perf_counter()
        run.report = str(out_dir / "report" / "report.md")
        write_report(run.to_json(), out_dir / "report")
        run.report_seconds = time.perf_counter() - started
    run_json = out_dir / "run.json"
    tmp = run_json.with_name("run.json.tmp")
    tmp.write_text(json.dumps(run.to_json(), indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, run_json)
    return run


COMPILE_NICE = 10
"""Niceness of the tuner's compile processes (they share the CPUs with the benchmark workers)."""
PRESTART_ON_RERUN = 2
"""Compile processes started ahead of the plan when an earlier run's binaries are in the build directory."""


def _pipeline(tuner: _Tuner, compiles: _Compiles, todo: list[TuneItem], clients: list[WorkerClient],
              run: TuneRun, setup: dict[str, Any], wall_start: float) -> None:
    """The GPUs benchmark the rows whose binaries are all there while the rest compile."""
    run.binaries = compiles.binaries
    ready = compiles.ready
    lock = threading.Lock()
    results: dict[int, ItemResult] = {}
    total = len(todo)
    bench_start = time.perf_counter()
    errors: list[BaseException] = []
    claimed: set[int] = set()

    def gpu_loop(client: WorkerClient) -> None:
        try:
            client.setup(setup)  # the worker binds the host modules while the first binaries compile
        except BaseException as exc:
            errors.append(exc)
            return
        while True:
            with lock:
                if len(claimed) >= total:
                    return
            waited = time.perf_counter()
            try:
                i = ready.get(timeout=0.5)
            except queue.Empty:
                with lock:
                    run.gpu_idle_seconds += time.perf_counter() - waited
                continue
            with lock:
                run.gpu_idle_seconds += time.perf_counter() - waited
                if not claimed:
                    run.first_row_at = time.perf_counter() - wall_start
                claimed.add(i)
            item = todo[i]
            started = time.perf_counter()
            try:
                result = tuner.tune_item(client, item)
            except WorkerError as exc:
                result = ItemResult(item.id, item.entry.kernel, item.entry.variant, item.key_dict, "failed",
                                    notes=[str(exc)], gpu=client.gpu)
            except BaseException as exc:
                errors.append(exc)
                result = ItemResult(item.id, item.entry.kernel, item.entry.variant, item.key_dict, "failed",
                                    notes=[f"{type(exc).__name__}: {exc}"])
            result.seconds = time.perf_counter() - started
            result.started_at = started - wall_start
            if i in compiles.ready_clock:
                result.ready_at = compiles.ready_clock[i] - wall_start
            with lock:
                results[i] = result
                run.benchmark_seconds += result.seconds
                done = len(results)
            if tuner.progress:
                elapsed = time.perf_counter() - bench_start
                eta = elapsed / done * (total - done) if done else 0.0
                verdict = (f"{result.winner} ({result.speedup:.2f}x the default)" if result.speedup
                           else result.status)
                tuner.progress("tune", done, total, f"{item.id}: {verdict}; ~{eta:.0f} s left")

    threads = [threading.Thread(target=gpu_loop, args=(c,), daemon=True) for c in clients]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    compiles.thread.join()
    run.compile_seconds, run.compile_wall = compiles.seconds, compiles.wall
    run.benchmark_wall = time.perf_counter() - bench_start
    run.items += [results[i] for i in sorted(results)]
    if errors and not results:
        raise TuneError(f"tuning failed: {errors[0]}")
    if len(claimed) < total:  # every worker failed to start: say why
        raise TuneError(f"tuning stopped with {total - len(claimed)} rows left: {errors[0] if errors else '?'}")
