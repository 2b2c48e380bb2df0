"""Build side of tuning: fill each config table from the tuning database.

The alias policy, per kernel variant and target:

1. **Same GPU model** — each GPU model with winners gets its own table (picked at run time by the device's
   name): its rows are *tuned*.
2. **Same architecture** — the target's ``default`` table (every other GPU that runs the target) takes, for each
   row, the winner measured on a GPU model of the same target: *aliased*. Where several models have one, the
   model whose compute capability is the target's own wins, then the model with the most winners, then the name.
3. **Default rule** — rows no model measured keep the manifest's default (``tune.default``, else the first
   candidate of the space that satisfies the constraints): *untuned*.

A winner measured under another Triton version, another kernel source or a config the current space cannot
express (a changed meta-parameter list, a constraint it now fails) is never used: the build reports it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..manifest import LoadedManifest
from ..plan import BuildPlan, ConfigChoice, EntryPlan, KernelPlan, TableRow, preferences
from ..sourcesplit import code_sha256
from ..targets import TARGETS
from .database import Provenance, Record, TuningDatabase, file_sha256, prune_database


@dataclass
class TuningSummary:
    """What the database gave a build: row counts per target and what was left out, and why."""

    database: str | None
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per target: ``tuned``, ``aliased``, ``untuned`` row counts."""
    devices: dict[str, list[str]] = field(default_factory=dict)
    """Per target: the GPU models with their own tables."""
    stale: list[str] = field(default_factory=list)
    """One line per group of winners not used (other Triton, other kernel source, config not expressible)."""
    warnings: list[str] = field(default_factory=list)
    """Unreadable database lines."""

    def to_json(self) -> dict[str, Any]:
        return {"database": self.database, "rows": self.rows, "devices": self.devices, "stale": self.stale,
                "warnings": self.warnings}


def database_dir(loaded: LoadedManifest) -> Path | None:
    """The manifest's tuning directory (``project.tuning-data``), if it names one."""
    d = loaded.manifest.project.tuning_data
    return (loaded.root / d) if d else None


def _capability_of_target(target: str) -> str:
    info = TARGETS[target]
    return f"{int(info.arch) // 10}.{int(info.arch) % 10}" if info.backend == "cuda" else str(info.arch)


def code_roots(kp: KernelPlan) -> set[str]:
    """The names a tuning measurement of the kernel runs: the kernel, the host function that launches it (the
    tuning op, else the kernel's first op, as the runner calls), the inputs, the reference, the pruning hook and
    the configs' pre-hooks."""
    t = kp.entry.tune
    roots = {kp.function, *([t.op] if t.op else kp.entry.ops[:1])}
    roots |= {n for n in (t.inputs, t.reference, t.prune) if n}
    return roots | {c.pre_hook for c in kp.space if c.pre_hook}


def kernel_code_sha256(kp: KernelPlan) -> str:
    """sha256 of the code a measurement of ``kp`` depends on (see ``sourcesplit.code_sha256``), and of the whole
    text of each project module its file imports (``KernelPlan.local_modules``: a helper in ``kernels/utils.py``
    that picks BLOCK_SIZE changes what a measurement ran). A kernel importing none keeps its hash."""
    digest = code_sha256(kp.source, code_roots(kp))
    if kp.entry.tune.l2 != "cold":  # timed with another cache: other results (cold keeps the hashes it had)
        digest = hashlib.sha256(f"forge-aot l2 {kp.entry.tune.l2} v1\n{digest}\n".encode()).hexdigest()
    if not kp.local_modules:
        return digest
    h = hashlib.sha256(f"forge-aot code+local v1\n{digest}\n".encode())
    for name, lm in sorted(kp.local_modules.items()):
        h.update(f"{name}\n".encode())
        if lm.path.is_file():
            h.update(lm.path.read_bytes())
        h.update(b"\n\x00\n")
    return h.hexdigest()


def source_hashes(kp: KernelPlan) -> dict[str, str]:
    """A kernel's ``Provenance`` source fields: the whole file's sha256 and its code hash."""
    return {"source_sha256": file_sha256(kp.source), "code_sha256": kernel_code_sha256(kp)}


def current_code(plan: BuildPlan) -> dict[str, Provenance]:
    """Each kernel's code as the plan has it (the part of a record's provenance that says which code it measured)."""
    return {name: Provenance(gpu="", capability="", target="", triton="", **source_hashes(kp))
            for name, kp in plan.kernels.items()}


def prune_stale(plan: BuildPlan, directory: Path, *, dry_run: bool = False) -> dict[str, int]:
    """``forge-aot prune``: drop the records measured on another version of their kernel's code, which no build
    uses again (it reports them as not used). Records of other Triton versions, and of kernels the manifest no
    longer lists, are kept. Returns the records dropped per kernel."""
    current = current_code(plan)
    return prune_database(directory, lambda r: r.kernel not in current or r.provenance.same_code(current[r.kernel]),
                          dry_run=dry_run)


def apply_tuning(plan: BuildPlan, db: TuningDatabase | None, triton_version: str) -> TuningSummary:
    """Put each row's tuned (or aliased) config first and add one table per tuned GPU model, in place."""
    summary = TuningSummary(str(db.directory) if db is not None else None)
    if db is not None:
        summary.warnings = list(db.warnings)
    current = current_code(plan)
    stale: dict[str, int] = {}
    for entry in plan.entries:
        kp = plan.kernels[entry.kernel]
        fixed = {a: entry.assignment[a] for a in kp.launch_axes}
        # GPU model → key → winning config (the latest winner that stands for this build)
        by_model: dict[str, dict[tuple[int, ...], ConfigChoice]] = {}
        capability: dict[str, str] = {}
        records: list[Record] = list(db.select(kind="winner", kernel=entry.kernel, variant=entry.variant)) \
            if db is not None else []
        for r in records:
            if r.provenance.target != entry.target:
                continue
            reason = None
            if r.provenance.triton != triton_version:
                reason = f"measured under Triton {r.provenance.triton}, this build uses {triton_version}"
            elif not r.provenance.same_code(current[entry.kernel]):
                reason = "measured on another version of the kernel's code"
            elif set(r.key) != set(kp.key):
                reason = f"keyed by {sorted(r.key)}, the kernel's key is {kp.key}"
            else:
                # (a record from before the kernel's pruning hook made a defaulted constexpr a meta-parameter, or one
                # of a config that leaves it out: the default is what it measured)
                flat = {**kp.meta_defaults, **{k: v for k, v in r.config.items() if k not in ("num_ctas",)}}
                meta = [k for k in flat if k not in ("num_warps", "num_stages", "maxnreg", "pre_hook")]
                if sorted(meta) != sorted(kp.meta_names):
                    reason = f"its config gives {sorted(meta)}, the space tunes {sorted(kp.meta_names)}"
            if reason is not None:
                label = f"{entry.kernel} on {r.provenance.gpu} ({entry.target}): {reason}"
                stale[label] = stale.get(label, 0) + 1
                continue
            key = tuple(int(r.key[n]) for n in kp.key)
            if any(entry.assignment.get(n, v) != v for n, v in zip(kp.key, key)):
                continue  # a key argument that is also a variant axis (HEAD_DIM): another variant's row
            choice = ConfigChoice.from_flat({**kp.meta_defaults, **r.config}, kp.meta_names, fixed)
            if not preferences(kp, key, entry.assignment, choice, entry.target) or \
                    preferences(kp, key, entry.assignment, choice, entry.target)[0].id != choice.id:
                label = f"{entry.kernel} on {r.provenance.gpu} ({entry.target}): a winner fails the constraints"
                stale[label] = stale.get(label, 0) + 1
                continue
            by_model.setdefault(r.provenance.gpu, {})[key] = choice
            capability[r.provenance.gpu] = r.provenance.capability
        own = _capability_of_target(entry.target)
        ranked = sorted(by_model, key=lambda m: (capability[m] != own, -len(by_model[m]), m))
        default_rows = {row.key: row for row in entry.tables["default"]}
        keys = sorted({*default_rows, *(k for m in ranked for k in by_model[m])})
        origins: dict[tuple[int, ...], str] = {}
        table = []
        for key in keys:
            source = next((m for m in ranked if key in by_model[m]), None)
            if source is None:
                table.append(default_rows[key])
                origins[key] = "untuned"
                continue
            table.append(TableRow(key, preferences(kp, key, entry.assignment, by_model[source][key], entry.target)))
            origins[key] = f"aliased:{source}"
        entry.tables["default"] = table
        entry.origins["default"] = origins
        n_aliased = sum(1 for o in origins.values() if o != "untuned")
        entry.table_sources["default"] = (f"{n_aliased} rows aliased from {', '.join(ranked)}, "
                                          f"{len(origins) - n_aliased} on the default rule") if ranked \
            else "manifest default"
        for model in sorted(by_model):
            rows = by_model[model]
            entry.tables[model] = [TableRow(k, preferences(kp, k, entry.assignment, rows[k], entry.target))
                                   for k in sorted(rows)]
            entry.origins[model] = {k: "tuned" for k in rows}
            entry.table_sources[model] = f"tuned on {model}: {len(rows)} rows"
        devices = summary.devices.setdefault(entry.target, [])
        devices += [m for m in sorted(by_model) if m not in devices]
    summary.rows = row_counts(plan.entries)
    summary.stale = [f"{n} winner{'s' if n > 1 else ''} of {label}: not used (re-run forge-aot tune)"
                     for label, n in sorted(stale.items())]
    plan.tuning = summary
    return summary


def load_database(loaded: LoadedManifest) -> TuningDatabase | None:
    directory = database_dir(loaded)
    return TuningDatabase(directory) if directory is not None else None


def row_counts(entries: Iterable[EntryPlan]) -> dict[str, dict[str, int]]:
    """Per target, the entries' table rows that are tuned, aliased and untuned (the build passes the entries its
    wheel has: a variant an optional target left out is not among them)."""
    out: dict[str, dict[str, int]] = {}
    for entry in entries:
        counts = out.setdefault(entry.target, {"tuned": 0, "aliased": 0, "untuned": 0})
        for origin, n in entry.origin_counts().items():
            counts[origin] += n
    return out
