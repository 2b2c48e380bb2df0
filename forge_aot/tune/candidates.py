"""What a tuning run measures: one item per table row (kernel × variant × key) and its candidate configs.

A row's candidates are its preferences: the tuning space (the manifest's, else the kernel's own
``@triton.autotune`` configs; for a kernel with a pruning hook, ``tune.prune`` else the decorator's
``early_config_prune``, what the hook returned for the row when the plan was made, see ``pruning``) that
satisfies the constraints for the row, the untuned default first; then the decorator's ``perf_model`` with
``top_k``, with Triton's semantics. What the compiled binaries say (shared memory over the device's limit,
register spills, no block fitting on a multiprocessor) prunes further once they exist (``static_prune``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ..errors import ManifestError
from ..plan import BinarySpec, BuildPlan, ConfigChoice, EntryPlan, KernelPlan, TracedCall
from ..pruning import perf_model_prune
from ..runtime import SPEC_INT_ONE, SPEC_ONE
from .database import row_id


@dataclass
class TuneItem:
    """One table row to tune on the local GPU model."""

    entry: EntryPlan
    kernel: KernelPlan
    key: tuple[int, ...]
    candidates: list[ConfigChoice]
    """In preference order: ``candidates[0]`` is the config the row gets untuned."""
    calls: list[TracedCall]
    """The kernel's launches traced from the tuning inputs of this row."""
    space: int
    """Size of the space for this row before the pruning hooks."""
    pruned: dict[str, str] = field(default_factory=dict)
    """Config id → why it is not measured (hook, binary)."""

    @property
    def key_dict(self) -> dict[str, int]:
        return dict(zip(self.kernel.key, self.key))

    @property
    def id(self) -> str:
        return row_id(self.entry.kernel, self.entry.variant, self.key_dict)

    @property
    def default(self) -> ConfigChoice:
        return self.candidates[0]

    def binaries(self, config: ConfigChoice) -> list[BinarySpec]:
        """The binaries a candidate is measured with: the exact specialization of each traced launch (with the
        heuristics' values for this config), as the wheel takes it for this row, and the same without unit
        constants (Triton 3.6's pipeliner rejects some kernels with them; the wheel then takes that one). The
        generic fallback is the build's business."""
        out: list[BinarySpec] = []
        for call in self.calls:
            heur = self.kernel.evaluate_heuristics(call.named or {}, config)
            # (tensor descriptors' block shapes as the config's pre-hook sets them on this call)
            exact = BinarySpec(call.spec, heur, self.kernel.descriptor_blocks(call.named or {}, config, heur))
            out.append(exact)
            if SPEC_ONE in call.spec or SPEC_INT_ONE in call.spec:
                out.append(exact.relaxed([i for i, c in enumerate(call.spec) if c in (SPEC_ONE, SPEC_INT_ONE)]))
        if not out:  # no traced launch: the documented default specialization of the row
            named = {**self.key_dict, **self.entry.assignment}
            heur = self.kernel.evaluate_heuristics(named, config)
            out.append(BinarySpec(self.kernel.default_spec(self.key), heur,
                                  self.kernel.descriptor_blocks(named, config, heur)))
        return list(dict.fromkeys(out))


def shard_of(item_id: str, count: int) -> int:
    """Which of ``count`` shards tunes an item (stable across machines and runs)."""
    return int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16) % count


def make_items(plan: BuildPlan, *, kernels: tuple[str, ...] = (), shard: tuple[int, int] = (0, 1),
               notes: list[str] | None = None) -> list[TuneItem]:
    """The items of a plan (made for one target) in plan order: rows of entries whose kernel has tuning inputs
    and more than one candidate. ``notes`` receives one line per entry left out, and why."""
    from ..introspect import load_kernel_module

    notes = notes if notes is not None else []
    unknown = [k for k in kernels if k not in plan.kernels]
    if unknown:
        raise ManifestError(f"no kernel entry {unknown[0]!r} (entries: {', '.join(plan.kernels)})",
                            key_path="--kernel")
    index, total = shard
    items: list[TuneItem] = []
    for name, kp in plan.kernels.items():
        if kp.entry.targets and not set(kp.entry.targets) & set(plan.targets) and (not kernels or name in kernels):
            notes.append(f"{name}: not tuned here (kernels.{name}.targets is {', '.join(kp.entry.targets)}; this "
                         f"GPU's target is {', '.join(plan.targets)})")
    for entry in plan.entries:
        kp = plan.kernels[entry.kernel]
        if kernels and entry.kernel not in kernels:
            continue
        rows = entry.tables["default"]
        if kp.entry.tune.inputs is None:
            note = f"{entry.kernel}: not tuned (no tune.inputs function names its arguments)"
            if note not in notes and len(kp.space) > 1:
                notes.append(note)
            continue
        for row in rows:
            candidates = [c for c in row.preferences]  # early_config_prune ran when the plan was made
            calls = entry.calls.get(row.key, [])
            pruned = dict(kp.row_pruned.get((entry.variant, row.key, entry.target), {}))
            item = TuneItem(entry, kp, row.key, candidates, calls, len(candidates) + len(pruned), pruned)
            if total > 1 and shard_of(item.id, total) != index:
                continue
            if len(candidates) <= 1:
                continue
            if calls and kp.autotune and kp.autotune.prune.get("perf_model") and not kp.entry.tune.prune:
                module = load_kernel_module(str(kp.source))
                item.candidates, by_model = perf_model_prune(kp, candidates, calls[0], module)
                item.pruned.update(by_model)
            if len(item.candidates) <= 1:
                notes.append(f"{item.id}: one candidate left after pruning: nothing to measure")
                continue
            items.append(item)
    return items


def static_prune(features: dict[str, dict[str, Any]], max_shared: int) -> dict[str, str]:
    """Candidates the compiled binaries rule out (config id → reason): more shared memory than the device
    has, no block fitting on a multiprocessor, and register spills where some candidate has none."""
    out: dict[str, str] = {}
    for cid, f in features.items():
        if f.get("shared", 0) > max_shared:
            out[cid] = f"needs {f['shared']} bytes of shared memory, the device has {max_shared}"
        elif f.get("occupancy", 1) < 1:
            out[cid] = "no block fits on a multiprocessor (registers or shared memory)"
    spill_free = [cid for cid, f in features.items() if cid not in out and not f.get("local_bytes")]
    if spill_free:
        for cid, f in features.items():
            if cid not in out and f.get("local_bytes"):
                out[cid] = f"spills registers ({f['local_bytes']} bytes of local memory per thread)"
    return out
