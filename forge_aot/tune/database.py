"""The tuning database: JSON Lines in the manifest's tuning directory, one file per kernel entry.

Every line is one record, appended and flushed to disk as soon as it is known, so a tuning run killed with
SIGKILL loses at most the candidates in flight and the next run resumes where it stopped:

- ``measurement``: one candidate config of one row (kernel × variant × key) on one GPU model: its status
  (``ok``, ``wrong``, ``failed``, ``crashed``, ``timeout``, ``pruned``), time statistics and what the binary
  says (registers, local memory, occupancy); a compiled candidate that ``failed`` (it raised in the worker)
  is measured again by the next run;
- ``winner``: the config chosen for the row after the finalists were re-measured interleaved and the winner
  verified on fresh inputs, with the untuned default's time beside it.

Each record carries its provenance (GPU model, compute capability, target, driver, CUDA, torch and Triton
versions, the kernel file's sha256), so results measured under another Triton or another kernel source are
never used silently. Results are keyed per config: a config added to a space costs one measurement.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ForgeError

DB_FORMAT = 1
STATUSES = ("ok", "wrong", "failed", "crashed", "timeout", "pruned")


class DatabaseError(ForgeError):
    """A tuning database file cannot be read or written."""


@dataclass(frozen=True)
class Provenance:
    """Where and with what a result was measured."""

    gpu: str
    """GPU model, as the driver names it (``NVIDIA H100 80GB HBM3``)."""
    capability: str
    """Compute capability (``9.0``) or gfx name."""
    target: str
    """The manifest target whose binaries were measured (``sm_90``)."""
    triton: str
    """Triton version that compiled the binaries."""
    source_sha256: str
    """sha256 of the whole kernel file."""
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    forge_aot: str = ""
    code_sha256: str = ""
    """sha256 of the code the measurement ran (``sourcesplit.code_sha256``: the kernel, its tuning op, inputs and
    reference and what they reach), which decides whether a result still stands; empty in records written
    before it existed, for which the whole file's ``source_sha256`` decides."""

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v != ""}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Provenance:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: str(v) for k, v in data.items() if k in known})

    def same_code(self, other: Provenance) -> bool:
        """Whether both measured the same kernel code: by code hash where both have one, else by file hash."""
        if self.code_sha256 and other.code_sha256:
            return self.code_sha256 == other.code_sha256
        return self.source_sha256 == other.source_sha256

    def same_measurement(self, other: Provenance) -> bool:
        """Whether a result measured under ``other`` stands for this run (same GPU model, Triton, code)."""
        return (self.gpu, self.target, self.triton) == (other.gpu, other.target, other.triton) and \
            self.same_code(other)


def row_id(kernel: str, variant: str, key: dict[str, int]) -> str:
    """Text id of one table row: ``matmul [T=fp16] M=16,N=4096,K=4096``."""
    return f"{kernel} [{variant}] " + (",".join(f"{k}={v}" for k, v in key.items()) or "-")


@dataclass(frozen=True)
class Record:
    """One line of the database."""

    kind: str
    """``measurement`` or ``winner``."""
    kernel: str
    variant: str
    key: dict[str, int]
    config_id: str
    config: dict[str, Any]
    """Flat: meta-parameters plus ``num_warps``, ``num_stages`` (and ``maxnreg``, ``pre_hook``)."""
    provenance: Provenance
    status: str = "ok"
    time: dict[str, Any] | None = None
    """``median_ms``, ``min_ms``, ``max_ms``, ``p20_ms``, ``p80_ms``, ``n``, ``mode`` (events or graph)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Measurement: ``attrs``, ``rel_err``, ``error``, ``spec``. Winner: ``verified``, ``default``, ``finalists``,
    ``search``, ``bound``, ``throughput``."""
    at: str = ""
    """UTC time of the measurement (ISO 8601)."""

    @property
    def row(self) -> str:
        return row_id(self.kernel, self.variant, self.key)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": DB_FORMAT, "kind": self.kind, "kernel": self.kernel,
                               "variant": self.variant, "key": self.key, "config_id": self.config_id,
                               "config": self.config, "status": self.status}
        if self.time is not None:
            out["time"] = self.time
        out.update(self.extra)
        out["provenance"] = self.provenance.to_json()
        if self.at:
            out["at"] = self.at
        return out

    def line(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        if data.get("format") != DB_FORMAT:
            raise ValueError(f"format {data.get('format')!r} is not {DB_FORMAT}")
        kind = data["kind"]
        if kind not in ("measurement", "winner"):
            raise ValueError(f"unknown record kind {kind!r}")
        status = data.get("status", "ok")
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        fixed = {"format", "kind", "kernel", "variant", "key", "config_id", "config", "status", "time",
                 "provenance", "at"}
        return cls(kind=kind, kernel=str(data["kernel"]), variant=str(data["variant"]),
                   key={str(k): int(v) for k, v in data["key"].items()}, config_id=str(data["config_id"]),
                   config=dict(data["config"]), provenance=Provenance.from_json(data["provenance"]),
                   status=status, time=data.get("time"), extra={k: v for k, v in data.items() if k not in fixed},
                   at=str(data.get("at", "")))

    @property
    def median_ms(self) -> float | None:
        return None if not self.time else float(self.time["median_ms"])


def _open_for_append(path: Path) -> Any:
    """The file opened to append lines, created if missing; a line a killed run left open is ended first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = False
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
    if torn:
        f.write("\n")
    return f


class TuningDatabase:
    """The records of one tuning directory (``<kernel>.jsonl`` each), read once, appended line by line."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.records: list[Record] = []
        self._files: dict[Path, Any] = {}
        self.warnings: list[str] = []
        """Lines that could not be read (a run killed mid-line leaves at most one per file)."""
        if self.directory.is_dir():
            for path in sorted(self.directory.glob("*.jsonl")):
                self.records += self._read(path)

    def _read(self, path: Path) -> list[Record]:
        out = []
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DatabaseError(f"{path}: cannot read the tuning database: {exc}") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(Record.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self.warnings.append(f"{path}:{n}: unreadable record skipped ({exc})")
        return out

    def path_for(self, kernel: str) -> Path:
        return self.directory / f"{kernel}.jsonl"

    def append(self, record: Record) -> None:
        """Write one record to its file (flushed to the OS, so a SIGKILLed run keeps it) and keep it."""
        path = self.path_for(record.kernel)
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = _open_for_append(path)
        f.write(record.line() + "\n")
        f.flush()
        self.records.append(record)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def select(self, *, kind: str | None = None, kernel: str | None = None, variant: str | None = None,
               key: dict[str, int] | None = None) -> Iterator[Record]:
        for r in self.records:
            if (kind is None or r.kind == kind) and (kernel is None or r.kernel == kernel) and \
                    (variant is None or r.variant == variant) and (key is None or r.key == key):
                yield r

    def measurements(self, kernel: str, variant: str, key: dict[str, int],
                     provenance: Provenance) -> dict[str, Record]:
        """The latest measurement of each config of a row under the same GPU model, Triton and source."""
        out: dict[str, Record] = {}
        for r in self.select(kind="measurement", kernel=kernel, variant=variant, key=key):
            if r.provenance.same_measurement(provenance):
                out[r.config_id] = r
        return out

    def winner(self, kernel: str, variant: str, key: dict[str, int], provenance: Provenance) -> Record | None:
        """The latest winner of a row under the same GPU model, Triton and source."""
        found = None
        for r in self.select(kind="winner", kernel=kernel, variant=variant, key=key):
            if r.provenance.same_measurement(provenance):
                found = r
        return found


def _sort_key(r: Record) -> tuple[Any, ...]:
    return (r.kernel, r.variant, sorted(r.key.items()), r.kind != "measurement", r.provenance.gpu,
            r.config_id, r.at, r.line())


def merge_databases(sources: list[Path], into: Path) -> dict[str, int]:
    """Join tuning databases (directories or ``.jsonl`` files; ``into`` included) into ``into``: every record
    once, each kernel's file sorted (row, measurements before winners, GPU model, config, time), written
    atomically. Returns counts: ``records`` kept, ``duplicates`` dropped, ``files`` written."""
    seen: dict[str, Record] = {}
    duplicates = 0
    warnings: list[str] = []
    for src in [into, *sources]:
        paths = sorted(Path(src).glob("*.jsonl")) if Path(src).is_dir() else [Path(src)]
        if not Path(src).exists():
            if src == into:
                continue
            raise DatabaseError(f"{src}: no such tuning database")
        reader = TuningDatabase.__new__(TuningDatabase)
        reader.warnings = warnings
        for path in paths:
            for r in reader._read(path):
                digest = hashlib.sha256(r.line().encode()).hexdigest()
                if digest in seen:
                    duplicates += 1
                else:
                    seen[digest] = r
    by_kernel = _by_kernel(seen.values())
    into.mkdir(parents=True, exist_ok=True)
    for kernel, records in sorted(by_kernel.items()):
        _write_sorted(into / f"{kernel}.jsonl", records)
    return {"records": len(seen), "duplicates": duplicates, "files": len(by_kernel), "unreadable": len(warnings)}


def _by_kernel(records: Iterable[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r.kernel, []).append(r)
    return out


def _write_sorted(path: Path, records: list[Record]) -> None:
    """One kernel's file, sorted (row, measurements before winners, GPU model, config, time), written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(r.line() + "\n" for r in sorted(records, key=_sort_key)), encoding="utf-8")
    os.replace(tmp, path)


def prune_database(directory: Path, stands: Callable[[Record], bool], *, dry_run: bool = False) -> dict[str, int]:
    """Drop every record of ``directory`` for which ``stands`` is false (each kernel's file rewritten sorted, as
    ``merge_databases`` writes it, atomically; a file left empty is removed). Returns the records dropped per
    kernel file; ``dry_run`` counts without writing."""
    db = TuningDatabase(directory)
    if db.warnings:  # rewriting would lose those lines for good
        raise DatabaseError(f"{db.warnings[0]}; {len(db.warnings)} unreadable line(s) in all: the database is left "
                            "as it is (forge-aot merge rewrites it without them)")
    dropped: dict[str, int] = {}
    for kernel, records in sorted(_by_kernel(db.records).items()):
        kept = [r for r in records if stands(r)]
        if len(kept) == len(records):
            continue
        dropped[kernel] = len(records) - len(kept)
        if dry_run:
            continue
        path = db.path_for(kernel)
        if kept:
            _write_sorted(path, kept)
        else:
            path.unlink()
    return dropped


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
