"""Variants, per-argument specializations, configs, tables, and which packaged target runs on a device."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .errors import NotBuiltError, UnsupportedDeviceError
from .rules import (  # noqa: F401  (the shared rules, also read from here by older importers)
    _EXACT,
    _INTS,
    COMPILE_OPTIONS,
    HEURISTICS_HOOK,
    KERNEL_SIDE_HOOK,
    LAUNCH_ATTR_COOPERATIVE,
    LAUNCH_ATTR_PDL,
    LAUNCH_DEFAULTS,
    LAUNCH_FLAGS,
    LAUNCH_OPTIONS,
    SPEC_ABSENT,
    SPEC_DESC,
    SPEC_DIV16,
    SPEC_INT,
    SPEC_INT_DIV16,
    SPEC_INT_ONE,
    SPEC_NONE,
    SPEC_ONE,
    TRITON_DEFAULTS,
    Config,
    best_binary,
    launch_attrs,
    max_shared,
    pick_cuda_target,
    pick_hip_target,
    rank_rows,
    spec_fits,
    spec_rank,
    variant_id,
)

if TYPE_CHECKING:
    from .expressions import Expression
    from .kernel import Kernel

_MAX_CACHED_KEYS = 4096


class PointerInt(int):
    """An integer passed to a pointer parameter that also takes integers (``pointer_value``'s reading of it)."""


def argument_spec(slots: Sequence[tuple[int, bool]], values: Sequence[Any]) -> str:
    """A call's specialization with Triton's rules, over ``values`` (pointers already through ``pointer_value``):
    for each (position, is pointer) slot, ``D`` for an aligned pointer or an integer divisible by 16, ``1``
    for an integer equal to 1, ``N`` for None (any argument: Liger passes ``softcap=None`` to a float, compiled as
    the constant None like an absent pointer), ``T`` for a tensor descriptor, ``x`` otherwise (floats always); an
    integer where a pointer goes (a ``PointerInt``) ``i``, ``d`` or ``o`` (see ``SPEC_INT``)."""
    spec = ""
    for i, is_ptr in slots:
        v = values[i]
        if v is None or is_ptr:
            spec += SPEC_ABSENT if v is None else (SPEC_NONE if v & 15 else SPEC_DIV16) if type(v) is int else \
                SPEC_DESC if type(v) is not PointerInt else SPEC_INT_ONE if v == 1 else SPEC_INT if v % 16 else \
                SPEC_INT_DIV16
        else:
            spec += SPEC_NONE if isinstance(v, float) else SPEC_ONE if v == 1 else (SPEC_NONE if v % 16 else SPEC_DIV16)
    return spec


def pointer_value(arg: Any) -> Any:
    """A pointer argument as ``argument_spec`` reads it: the tensor's address, None, a host-side tensor descriptor
    itself (passed where the kernel also takes a pointer), or an integer as a ``PointerInt``."""
    if arg is None:
        return None
    try:
        return arg.data_ptr()
    except AttributeError:
        if type(arg) is int:
            return PointerInt(arg)
        if hasattr(arg, "block_shape") and hasattr(arg, "base"):
            return arg
        raise


class Constraints(Sequence["Expression"]):
    """A kernel's constraints, compiled when first evaluated (most calls hit a table row exactly and need none;
    the constraint language and its parser are then never loaded)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)
        self._compiled: list[Expression] | None = None

    def _all(self) -> list[Expression]:
        if self._compiled is None:
            from .expressions import Expression

            self._compiled = [Expression(t) for t in self.texts]
        return self._compiled

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self) -> Iterator[Expression]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self.texts)


class ConfigTable:
    """Key values → config, for one kernel variant on one target (and GPU model, when tuned for it).

    A lookup never compiles: it returns the config of the nearest row (see ``rank_rows``) that is usable on
    this device and satisfies the kernel's constraints for the actual key values, else any such config. A key
    equal to a row's takes the row's config where it is usable: the build checked every row's config against
    the constraints at the row's own key.
    """

    def __init__(self, kernel: str, key_names: Sequence[str], rows: Sequence[Sequence[Any]],
                 configs: dict[str, Config], constraints: Sequence[Expression],
                 usable: set[str] | None = None, env: dict[str, Any] | None = None) -> None:
        self.kernel = kernel
        self.env = dict(env or {})
        """What the constraints see besides the config and the key: the variant's values (type variables as
        dtype names, call-site constexprs, launch options), as the build saw them."""
        self.key_names = tuple(key_names)
        self.rows = [tuple(int(v) for v in r[:-1]) for r in rows]
        self.row_configs = [str(r[-1]) for r in rows]
        self.configs = configs
        self.constraints = constraints
        self.usable = set(configs) if usable is None else set(usable)
        self._exact: dict[tuple[int, ...], Config] = {}
        for row, cid in zip(self.rows, self.row_configs):
            if cid in self.usable:
                self._exact.setdefault(row, self.configs[cid])  # a repeated row: the first, as rank_rows orders
        self._cache: dict[tuple[int, ...], Config] = {}
        self._lock = threading.Lock()

    def _fits(self, cfg: Config, key: tuple[int, ...]) -> bool:
        if cfg.id not in self.usable:
            return False
        if not self.constraints:
            return True
        # As the build's check (plan.preferences): the config's values, then the key's, then the variant's.
        env = {**cfg.launch_meta, "maxnreg": cfg.maxnreg, **dict(zip(self.key_names, key)), **self.env}
        return all(c(env) for c in self.constraints)

    def lookup(self, key: tuple[int, ...]) -> Config:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        chosen = self._exact.get(key)
        if chosen is None:
            for i in rank_rows(self.rows, key):
                cfg = self.configs[self.row_configs[i]]
                if self._fits(cfg, key):
                    chosen = cfg
                    break
        if chosen is None:
            chosen = next((c for c in self.configs.values() if self._fits(c, key)), None)
        if chosen is None:
            shown = ", ".join(f"{n}={v}" for n, v in zip(self.key_names, key))
            raise NotBuiltError(f"{self.kernel}: no packaged config satisfies the constraints "
                                f"{[c.text for c in self.constraints]} for {shown}; packaged configs: "
                                f"{list(self.configs.values())}")
        with self._lock:
            if len(self._cache) >= _MAX_CACHED_KEYS:
                self._cache.clear()
            self._cache[key] = chosen
        return chosen


def resolve_table(kernel: Kernel, variant: dict[str, Any], assignment: dict[str, Any], backend: str,
                  info: dict[str, Any]) -> tuple[str, ConfigTable]:
    """The target and config table one build of a kernel uses on a device described by ``info`` (shared by the
    packaged runtime and forge-aot's development mode, so both choose alike)."""
    built = {t: kernel.targets[t] for t in variant["targets"]}
    cuda = backend == "cuda"
    target = pick_cuda_target(info["capability"], built) if cuda else pick_hip_target(info["arch"], built)
    if target is None:  # not built for this device, or an optional target where this build did not compile
        skipped = {t: kernel.targets[t] for t in variant.get("not_built", {}) if t in kernel.targets}
        missed = (pick_cuda_target(info["capability"], skipped) if cuda else pick_hip_target(info["arch"], skipped)) \
            if skipped else None
        raise UnsupportedDeviceError.no_binary(
            kernel.function, info["name"], info["arch"], list(variant["targets"]),
            f"kernels.{kernel.name}.targets" if kernel.spec.get("only_targets") else None, missed,
            variant["not_built"][missed] if missed else "")
    entry = variant["targets"][target]
    call_values = {k: v for k, v in assignment.items() if k in kernel.call_names}
    configs = {cid: Config.from_entry(cid, c, call_values) for cid, c in entry["configs"].items()}
    # A binary for an older GPU of the same major may ask for more shared memory than this one has.
    usable = {cid for cid, c in entry["configs"].items() if max_shared(c) <= info["max_shared"]}
    rows = entry["tables"].get(info["name"], entry["tables"]["default"])
    table = ConfigTable(f"{kernel.function} [{variant_id(assignment, kernel.axes)}] on {target}",
                        kernel.spec["key"], rows, configs, kernel.constraints, usable, assignment)
    return target, table


def choose_binary(kernel: Kernel, binaries: dict[str, dict[str, Any]], heur: tuple[Any, ...],
                  spec: str, descs: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> dict[str, Any]:
    """The binary of a config serving a call: same heuristic values (and tensor descriptor block shapes), every
    specialization assumption true for the call's arguments, the most specialized such (the generic one assumes
    nothing, so it always fits)."""
    keep = None
    if descs:
        from .descriptors import binary_blocks

        def keep(b: dict[str, Any]) -> bool:
            return binary_blocks(b) == descs
    best = best_binary(binaries, kernel.heuristic_names, heur, spec, keep)
    if best is None and descs:
        from .descriptors import not_built

        raise not_built(kernel, binaries, descs)
    if best is None:
        raise NotBuiltError.no_binary(kernel, binaries, heur, spec)
    return best
