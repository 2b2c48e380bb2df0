"""Variants, per-argument specializations, configs, tables, and which packaged target runs on a device."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .errors import NotBuiltError, UnsupportedDeviceError

if TYPE_CHECKING:
    from .expressions import Expression
    from .kernel import Kernel

_MAX_CACHED_KEYS = 4096


LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")
"""Triton launch options a call site may pass (``kernel[grid](..., num_warps=8)``); ``COMPILE_OPTIONS`` among them
only change how a binary is compiled (accelerated-scan passes ``enable_fp_fusion=False``: no contracted FMA)."""
COMPILE_OPTIONS = ("enable_fp_fusion",)
LAUNCH_DEFAULTS: dict[str, Any] = {"num_ctas": 1, "maxnreg": None, "enable_fp_fusion": True}
"""Launch options every binary is built with unless declared otherwise: a call passing these needs nothing."""
LAUNCH_FLAGS = ("launch_pdl", "launch_cooperative_grid")
"""Launch attributes a call may ask for, set as Triton 3.6's launcher does (``cuLaunchKernelEx``): programmatic
dependent launch (the kernel may start while the previous one ends; ``gdc_wait`` waits for it) and a cooperative
grid (every program resident at once). They change how a binary launches, never which: read per call."""
LAUNCH_ATTR_PDL, LAUNCH_ATTR_COOPERATIVE = 1, 2  # a launcher's ``attrs`` bits (the C launch path's too)
TRITON_DEFAULTS: dict[str, int] = {"num_warps": 4, "num_stages": 3}
"""Triton's own defaults, for a call that leaves out a launch option the kernel takes at the call site."""
HEURISTICS_HOOK = "__forge_heuristics__"
"""Name bound in host modules: ``@triton.heuristics`` decorators become calls of it (see sourcesplit)."""
KERNEL_SIDE_HOOK = "__forge_kernel_side__"
"""Bound in host modules: ``NAME = __forge_kernel_side__("NAME", __name__)`` stands where a file defines Triton code."""
SPEC_NONE, SPEC_DIV16, SPEC_ONE, SPEC_ABSENT, SPEC_DESC = "x", "D", "1", "N", "T"
"""Per-argument specialization codes, as Triton's JIT: no assumption; pointer 16-byte aligned or integer
divisible by 16; integer equal to 1 (compiled as the constant 1); pointer passed as ``None`` (compiled as the
constant None, as Triton does: FLA passes ``h0=None`` and its heuristics test ``args['h0'] is not None``); a
pointer parameter passed a host-side tensor descriptor (compiled as a ``tensordesc``: the Triton tutorial's
attention takes either and builds the descriptor in the kernel when given a pointer)."""
SPEC_INT, SPEC_INT_DIV16, SPEC_INT_ONE = "i", "d", "o"
"""A pointer parameter passed an integer, typed as the manifest's ``*i32|i32`` says (flash-attn's rotary
``SEQLEN_OFFSETS``, "this could be int or a pointer"): any integer, one divisible by 16, the constant 1."""
_EXACT, _INTS = (SPEC_ABSENT, SPEC_DESC), (SPEC_INT, SPEC_INT_DIV16, SPEC_INT_ONE)


class PointerInt(int):
    """An integer passed to a pointer parameter that also takes integers (``pointer_value``'s reading of it)."""


def launch_attrs(call: dict[str, Any]) -> int:
    """The launch attributes (``LAUNCH_ATTR_*`` bits) a call's bound call-site values ask for."""
    return (LAUNCH_ATTR_PDL if call.get("launch_pdl") else 0) \
        | (LAUNCH_ATTR_COOPERATIVE if call.get("launch_cooperative_grid") else 0)


def variant_id(assignment: dict[str, Any], axes: Sequence[str]) -> str:
    """Text id of a build variant in the kernel's canonical axis order, e.g. ``T=fp16,BLOCK_SIZE=1024``:
    ``axes`` is the one order used everywhere (build, index, runtime, dev mode): type variables, then
    call-site constexprs in parameter order, then call-site launch options; ``base`` when there are none."""
    return ",".join(f"{name}={assignment[name]}" for name in axes) or "base"


def spec_fits(built: str, actual: str) -> bool:
    """Whether a binary specialized as ``built`` is correct for a call whose arguments give ``actual``:
    every assumption it makes must hold (an unspecialized position accepts any value but ``None``, which only a
    binary built for it takes)."""
    return all(_fits(b, a) for b, a in zip(built, actual))


def _fits(b: str, a: str) -> bool:
    if a in _EXACT or b in _EXACT:
        return b == a
    if a in _INTS or b in _INTS:  # an integer where a pointer goes: only such a binary (i takes any)
        return b == a or (b == SPEC_INT and a in _INTS)
    return b in (SPEC_NONE, a)


def spec_rank(spec: str) -> int:
    """How specialized a binary is (the more assumptions, the faster it usually runs)."""
    return sum(c not in (SPEC_NONE, SPEC_INT) for c in spec)


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


def _log2(v: float) -> float:
    return math.log2(v) if v > 1 else 0.0


def rank_rows(rows: Sequence[tuple[int, ...]], key: tuple[int, ...]) -> list[int]:
    """Indices of table rows, nearest first.

    The rule: an exact match first; otherwise the distance is the sum over key arguments of
    ``|log2(max(value, 1)) - log2(max(row, 1))|`` (so 3000 is nearer 4096 than 1024); ties go to the larger
    row (rounding up, which keeps a block big enough), then to table order.
    """
    lk = [_log2(v) for v in key]

    def order(i: int) -> tuple[float, float, int]:
        row = rows[i]
        if row == key:
            return (-1.0, 0.0, i)
        lr = [_log2(v) for v in row]
        return (sum(abs(a - b) for a, b in zip(lk, lr)), -sum(lr), i)

    return sorted(range(len(rows)), key=order)


class Config:
    """One compiled config: tuned meta-parameter values plus the launch options it was compiled with."""

    __slots__ = ("id", "launch_meta", "maxnreg", "meta", "num_stages", "num_warps", "pre_hook")

    def __init__(self, cid: str, meta: dict[str, Any], num_warps: int, num_stages: int,
                 call_constexprs: dict[str, Any], maxnreg: int | None = None, pre_hook: str | None = None) -> None:
        self.id = cid
        self.meta = dict(meta)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.maxnreg = maxnreg
        self.pre_hook = pre_hook
        # What a grid function sees, as with Triton: meta-parameters, call-site constexprs, warps, stages.
        self.launch_meta = {**meta, **call_constexprs, "num_warps": num_warps, "num_stages": num_stages}

    def all_kwargs(self) -> dict[str, Any]:
        """As ``triton.Config.all_kwargs()``: what heuristics and pre-hooks see of the config."""
        out = {**self.meta, "num_warps": self.num_warps, "num_ctas": 1, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            out["maxnreg"] = self.maxnreg
        return out

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in self.meta.items())
        return f"Config({items}, num_warps={self.num_warps}, num_stages={self.num_stages})"


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


# Which packaged target runs on this device

def pick_cuda_target(capability: tuple[int, int], targets: dict[str, dict[str, Any]]) -> str | None:
    """The built CUDA target for a device of compute capability (major, minor), or None.

    Exact match first. Otherwise cubin compatibility: a cubin for sm_XY runs on sm_XZ with Z >= Y (same
    major), so the highest such minor wins; arch-specific cubins (Triton builds sm_90+ as sm_90a) run only on
    their exact GPU. PTX is never shipped, so nothing is compiled by the driver either.
    """
    major, minor = capability
    best: tuple[int, str] | None = None
    for name, info in targets.items():
        if info["backend"] != "cuda":
            continue
        arch = int(info["arch"])
        t_major, t_minor = divmod(arch, 10)
        if (t_major, t_minor) == (major, minor):
            return name
        if info.get("arch_specific") or t_major != major or t_minor > minor:
            continue
        if best is None or arch > best[0]:
            best = (arch, name)
    return best[1] if best else None


def pick_hip_target(gfx: str, targets: dict[str, dict[str, Any]]) -> str | None:
    """The built HIP target for a device whose gfx name (``gfx942:sramecc+:xnack-``) is given: exact only."""
    base = gfx.split(":")[0]
    for name, info in targets.items():
        if info["backend"] == "hip" and info["arch"] == base:
            return name
    return None


def _max_shared(config: dict[str, Any]) -> int:
    """The most shared memory any binary of a config asks for (recorded by the build beside the binaries, which
    a wheel reads only when the config launches)."""
    if "max_shared" in config:
        return int(config["max_shared"])
    return max((b["shared"] for b in config.get("binaries", {}).values()), default=0)


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
    configs = {cid: Config(cid, c["meta"], c["num_warps"], c["num_stages"], call_values, c.get("maxnreg"),
                           c.get("pre_hook"))
               for cid, c in entry["configs"].items()}
    # A binary for an older GPU of the same major may ask for more shared memory than this one has.
    usable = {cid for cid, c in entry["configs"].items() if _max_shared(c) <= info["max_shared"]}
    rows = entry["tables"].get(info["name"], entry["tables"]["default"])
    table = ConfigTable(f"{kernel.function} [{variant_id(assignment, kernel.axes)}] on {target}",
                        kernel.spec["key"], rows, configs, kernel.constraints, usable, assignment)
    return target, table


def choose_binary(kernel: Kernel, binaries: dict[str, dict[str, Any]], heur: tuple[Any, ...],
                  spec: str, descs: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> dict[str, Any]:
    """The binary of a config serving a call: same heuristic values (and tensor descriptor block shapes), every
    specialization assumption true for the call's arguments, the most specialized such (the generic one assumes
    nothing, so it always fits)."""
    names = kernel.heuristic_names
    best: dict[str, Any] | None = None
    if descs:
        from .descriptors import binary_blocks
    for b in binaries.values():
        if tuple(b.get("heur", {}).get(n) for n in names) != heur or not spec_fits(b["spec"], spec):
            continue
        if descs and binary_blocks(b) != descs:
            continue
        if best is None or spec_rank(b["spec"]) > spec_rank(best["spec"]):
            best = b
    if best is None and descs:
        from .descriptors import not_built

        raise not_built(kernel, binaries, descs)
    if best is None:
        raise NotBuiltError.no_binary(kernel, binaries, heur, spec)
    return best
