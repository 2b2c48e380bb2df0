"""Stage 2: manifest → plan. Which binaries to compile and which config each table row starts with.

A kernel's *variants* are what the call chooses: the dtype of its typed tensors, the constexprs and launch
options its host code passes (``BLOCK_SIZE=…, num_warps=…``), in one canonical axis order. A variant's table
maps key values to configs; each row carries its preference list: the tuned config (tuning data), the
manifest's explicit default, then every candidate of the tuning space in listed order that satisfies the
constraints for that row. A config's *binaries* differ in what they assume of the arguments (Triton's
per-argument specialization) and in what the kernel's heuristics computed; the compile stage builds each
row's first choice and walks down a row's list only when a config fails to compile.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import itertools
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import manifest as mf
from . import runtime as rt
from .errors import ManifestError, SourceError, close_match
from .introspect import (
    IMPORT_TARGET_ENV,
    AutotuneInfo,
    forget_projects,
    kernel_defined_on,
    make_importable,
    make_kernel_importable,
    read_decorators,
    read_defaults,
    read_do_not_specialize,
)
from .localmods import LocalModule, direct_imports, local_imports, merge_local
from .pruning import PruneHookFailed, early_prune, early_prune_hook
from .runtime import (
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
    Expression,
    rank_rows,
    variant_id,
)
from .sourcesplit import (
    COMPUTED_DEFAULT,
    KernelSource,
    LaunchSite,
    SourceFile,
    asks_device,
    function_writes,
    imported_launch_sites,
    library_namespaces,
    parse_source,
    rename_library_namespaces,
)
from .targets import TARGETS, trace_gpus

INT_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
UNTYPED = "?"
"""The type of a runtime parameter the manifest leaves out, until the traced calls type it (``infer_signature``)."""
FLOAT_TYPES = ("fp16", "bf16", "fp32", "fp64")
HEURISTIC_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
"""Launch options a ``@triton.heuristics`` may compute instead of a constexpr parameter."""
_PASSED = object()
"""Stands for a tensor where the build asks whether a heuristic depends on an argument being None."""


class _CallValue:
    """Stands for a runtime argument where the build asks whether a heuristic reads any (``settled_heuristics``):
    every use of it raises (arithmetic, comparison, attributes, truth, conversion); ``is None`` alone answers."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise _ReadsCallValue(object.__getattribute__(self, "_name"))

    __getattr__ = __setattr__ = __bool__ = __index__ = __int__ = __float__ = __len__ = __iter__ = __call__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __str__ = __repr__ = __format__ = _refuse  # type: ignore[assignment]
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __abs__ = _refuse
    __and__ = __rand__ = __or__ = __ror__ = __lshift__ = __rshift__ = __getitem__ = __contains__ = _refuse


class _ReadsCallValue(Exception):
    pass


@dataclass(frozen=True)
class ConfigChoice:
    """One point of a tuning space."""

    meta: dict[str, Any]
    num_warps: int
    num_stages: int
    maxnreg: int | None = None
    pre_hook: str | None = None
    """Name of the host function a ``triton.Config(pre_hook=...)`` calls before each launch."""

    @property
    def id(self) -> str:
        parts = [f"{k}{v}" for k, v in self.meta.items()]
        extra = [f"r{self.maxnreg}"] if self.maxnreg else []
        return "-".join([*parts, f"w{self.num_warps}", f"s{self.num_stages}", *extra])

    @property
    def env(self) -> dict[str, Any]:
        """What constraints see."""
        return {**self.meta, "num_warps": self.num_warps, "num_stages": self.num_stages, "maxnreg": self.maxnreg}

    def all_kwargs(self) -> dict[str, Any]:
        """What heuristics see of the config, as ``triton.Config.all_kwargs()``."""
        out = {**self.meta, "num_warps": self.num_warps, "num_ctas": 1, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            out["maxnreg"] = self.maxnreg
        return out

    @classmethod
    def from_flat(cls, flat: dict[str, Any], meta_names: list[str], fixed: dict[str, Any]) -> ConfigChoice:
        """From ``{META..., num_warps, num_stages}`` (tuning data, manifest defaults); ``fixed`` launch options
        (chosen at the call site) win over the flat ones."""
        meta = {k: flat[k] for k in meta_names}
        return cls(meta, int(fixed.get("num_warps", flat.get("num_warps", TRITON_DEFAULTS["num_warps"]))),
                   int(fixed.get("num_stages", flat.get("num_stages", TRITON_DEFAULTS["num_stages"]))),
                   fixed.get("maxnreg", flat.get("maxnreg")), flat.get("pre_hook"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"meta": self.meta, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            out["maxnreg"] = self.maxnreg
        if self.pre_hook is not None:
            out["pre_hook"] = self.pre_hook
        return out


@dataclass(frozen=True, order=True)
class BinarySpec:
    """What one binary of a config assumes: each specialized argument's code and the heuristics' values."""

    spec: str
    heur: tuple[tuple[str, Any], ...] = ()
    descs: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Block shape of each host-side tensor descriptor argument (part of Triton's signature: ``tensordesc<fp16[128,
    64]>``), as the call made it or the config's pre-hook set it."""
    speculative: bool = field(default=False, compare=False)
    """Built for a combination of None arguments that no traced call passed (see ``_none_combinations``): if it
    fails to compile, that combination goes unserved (``NotBuiltError`` at such a call), the config does not."""

    @property
    def id(self) -> str:
        return ".".join([self.spec or "base", *(f"{n}={v}" for n, v in self.heur),
                         *(f"{n}={'x'.join(map(str, shape))}" for n, shape in self.descs)])

    @property
    def generic(self) -> bool:
        """No assumption but arguments passed as None: the fallback every call like it can take."""
        return all(c in (SPEC_NONE, SPEC_ABSENT, SPEC_DESC, SPEC_INT) for c in self.spec)

    def aligned(self, positions: Sequence[int]) -> BinarySpec:
        """Every argument at ``positions`` (pointers and integers) 16-byte aligned or divisible by 16 (values of 1
        kept): what an aligned call between rows offers, where this row's own call did not (a row at 1000 elements
        must not leave a call at 512 with its unvectorized binary)."""
        return dataclasses.replace(self, spec="".join(
            c if c in (SPEC_ONE, SPEC_ABSENT, SPEC_DESC, SPEC_INT_ONE, SPEC_INT_DIV16) or i not in positions else
            SPEC_INT_DIV16 if c == SPEC_INT else SPEC_DIV16 for i, c in enumerate(self.spec)))

    def relaxed(self, positions: list[int], code_from: str = "") -> BinarySpec:
        """The same assumptions except at ``positions`` (only where the code is in ``code_from``, if given); an
        argument passed as None stays None, and a tensor descriptor one (no binary takes both); an integer passed
        to a pointer parameter stays an integer (``d`` and ``o`` relax as ``D`` and ``1`` do)."""
        chars = [(SPEC_INT if c in _INT_CODES else SPEC_NONE) if i in positions and c not in (SPEC_ABSENT, SPEC_DESC)
                 and (not code_from or c in code_from or _POINTER_CODE.get(c, c) in code_from) else c
                 for i, c in enumerate(self.spec)]
        return dataclasses.replace(self, spec="".join(chars))

    def loosest(self) -> BinarySpec:
        """No assumption but the arguments passed as None: the generic fallback of calls like this one."""
        return self.relaxed(list(range(len(self.spec))))


_INT_CODES = (SPEC_INT, SPEC_INT_DIV16, SPEC_INT_ONE)
_POINTER_CODE = {SPEC_INT_DIV16: SPEC_DIV16, SPEC_INT_ONE: SPEC_ONE}
"""An integer passed to a pointer parameter: the code its assumption has at an integer parameter."""

PATH_COMPONENT_MAX = 96
"""Longest variant or config id used as a path component as it is; longer ones are shortened (``path_component``)."""


def path_component(name: str) -> str:
    """A variant or config id as a file or directory name: no commas, which file lists such as a wheel's RECORD
    (CSV) would have to quote (``T=fp16,BLOCK_SIZE=1024`` → ``T=fp16_BLOCK_SIZE=1024``), and, past
    ``PATH_COMPONENT_MAX`` characters, its first 64 characters and a hash of the whole id: a kernel with many
    call-site constexprs (SGLang's extend attention passes a dozen, some with long names) has variant ids longer
    than the 255 bytes a file name may have, and a kernel with many heuristics binary ids (Cut Cross-Entropy's
    backward computes seventeen values)."""
    flat = name.replace(",", "_")
    # a string constexpr may hold anything ("../x", a slash, non-ASCII): such ids are spelt safely and hashed too
    safe = re.sub(r"[^A-Za-z0-9_=.+\-]", "_", flat)
    if len(flat) <= PATH_COMPONENT_MAX and safe == flat and flat not in (".", ".."):
        return flat
    return f"{safe[:64]}~{hashlib.sha256(name.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class CompileJob:
    """One binary: kernel × variant × config × target × specialization."""

    kernel: str
    function: str
    source: str
    variant: str
    target: str
    config: ConfigChoice
    binary: BinarySpec
    signature: dict[str, str]
    """Every parameter of the function in order: a concrete type, or ``constexpr``."""
    constexprs: dict[str, Any]
    divisible: tuple[int, ...]
    """Parameter indices given ``tt.divisibility = 16``."""
    timeout: float
    options: tuple[tuple[str, Any], ...] = ()
    """Compile options the variant was chosen with at the call site (``enable_fp_fusion=False``)."""
    functions: tuple[tuple[str, str, str], ...] = ()
    """(constexpr text, file, name) of the @triton.jit functions among ``constexprs`` (KernelPlan.functions)."""

    @property
    def binary_stem(self) -> str:
        return (f"{self.kernel}/{self.target}/{path_component(self.variant)}/{path_component(self.config.id)}/"
                f"{path_component(self.binary.id)}")

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"descriptors": {n: list(s) for n, s in self.binary.descs}} if self.binary.descs \
            else {}
        # a launch option the kernel's @triton.heuristics compute is the binary's compile option, winning over the
        # config's as in Triton (Heuristics.run sets it in the kwargs its JIT function receives)
        options = {**dict(self.options), **{n: v for n, v in self.binary.heur if n in HEURISTIC_OPTIONS}}
        if options:
            extra["options"] = options
        if self.functions:
            extra["functions"] = {text: [file, name] for text, file, name in self.functions}
        return {"kernel": self.kernel, "function": self.function, "source": self.source, "variant": self.variant,
                "target": self.target, "config": self.config.to_json(), "specialization": self.binary.spec,
                "heuristics": dict(self.binary.heur), "signature": self.signature, "constexprs": self.constexprs,
                "divisible": list(self.divisible), "timeout": self.timeout, **extra}


@dataclass
class TracedCall:
    """One kernel launch recorded while running a kernel file's examples function."""

    kernel: str
    values: tuple[Any, ...]
    """Variant axis values, canonical order."""
    key: tuple[int, ...]
    spec: str
    named: dict[str, Any] | None
    """Arguments by name (for heuristics and pruning hooks), the call-site values included."""
    target: str | None = None
    """The target the host code was traced for where it asks about the device (see trace.as_target), else None."""
    keywords: tuple[str, ...] = ()
    """The arguments the call passed by keyword (Triton hands those to a pruning hook as ``**kwargs``: Unsloth's MoE
    launches ``kernel[grid](**kernel_args)`` and its pruner reads ``kwargs["x_ptr"]``)."""


@dataclass
class TableRow:
    key: tuple[int, ...]
    preferences: list[ConfigChoice]
    """Configs in order of preference; the first that compiles is the row's config."""


@dataclass
class EntryPlan:
    """One kernel variant on one target: its tables (``default`` and per GPU model)."""

    kernel: str
    variant: str
    assignment: dict[str, Any]
    target: str
    tables: dict[str, list[TableRow]] = field(default_factory=dict)
    table_sources: dict[str, str] = field(default_factory=dict)
    calls: dict[tuple[int, ...], list[TracedCall]] = field(default_factory=dict)
    """Traced calls per table key."""
    origins: dict[str, dict[tuple[int, ...], str]] = field(default_factory=dict)
    """Per table, where each row's first choice comes from: ``tuned`` (measured on that GPU model),
    ``aliased:<GPU model>`` (measured on another model of the same target) or ``untuned`` (the default rule)."""

    def origin_counts(self) -> dict[str, int]:
        """Rows of this entry that are tuned (GPU-model tables), aliased and untuned (the default table)."""
        out = {"tuned": 0, "aliased": 0, "untuned": 0}
        for device, rows in self.tables.items():
            for row in rows:
                origin = self.origins.get(device, {}).get(row.key, "untuned" if device == "default" else "tuned")
                out[origin.split(":")[0]] += 1
        return out


@dataclass
class KernelPlan:
    name: str
    entry: mf.KernelEntry
    function: str
    source: Path
    module: str
    params: list[tuple[str, str]]
    """(name, kind) in function order: a runtime type, ``meta`` (tuned), ``constexpr`` (call site) or
    ``heuristic`` (computed by the kernel's ``@triton.heuristics``)."""
    axes: list[str]
    """Variant axes in canonical order: type variables (by parameter position), call-site constexprs (in
    parameter order), then call-site launch options (num_warps, num_stages, …)."""
    type_args: dict[str, str]
    spec_params: list[str]
    """Runtime parameters specialized like Triton's JIT (pointers and integers not in do-not-specialize, and
    floats some traced call passes as None: see ``optional_scalars``)."""
    key: list[str]
    space: list[ConfigChoice]
    meta_names: list[str]
    constraints: list[Expression]
    default: dict[str, Any] | None
    heuristic_names: list[str]
    constexpr_defaults: dict[str, Any]
    autotune: AutotuneInfo | None
    reset_to_zero: list[str]
    restore_value: list[str]
    launches: list[LaunchSite]
    heuristics: list[tuple[str, Any]] = field(default_factory=list)
    """(name, function) from the host module, in Triton's order of evaluation."""
    pre_hooks: dict[str, Any] = field(default_factory=dict)
    """Config pre-hooks by name, from the host module (they set tensor descriptors' block shapes per config)."""
    notes: list[str] = field(default_factory=list)
    local_modules: dict[str, LocalModule] = field(default_factory=dict)
    """The project's own modules its file imports, transitively (shipped with the host code; part of its code
    hash)."""
    writes: tuple[str, ...] = ()
    """Parameters the kernel may write through (``KernelSource.writes``)."""
    writes_when: tuple[tuple[tuple[tuple[str, bool], ...], tuple[str, ...]], ...] = ()
    """``writes`` per combination of the constexpr flags the kernel branches on (``KernelSource.writes_when``)."""
    do_not_specialize: frozenset[str] = frozenset()
    """Runtime parameters never specialized (the manifest's and the decorator's)."""
    inferred: dict[str, str] = field(default_factory=dict)
    """Runtime parameters the manifest left untyped, with the types the traced calls gave them."""
    none_only: set[str] = field(default_factory=set)
    """Of those, the ones every traced call passes None (typed ``*i8``; every binary takes the constant None)."""
    pointer_ints: dict[str, str] = field(default_factory=dict)
    """Pointer parameters calls may also pass an integer (``*i32|i32``; flash-attn's rotary ``SEQLEN_OFFSETS``),
    with the integer's type: each binary takes one or the other (specialization codes ``i``, ``d``, ``o``)."""
    pruner_meta: list[str] = field(default_factory=list)
    """Meta-parameters only the configs the pruning hook returns may set (gemlite's ``NUM_STAGES``, and its
    ``EVEN_K: tl.constexpr = False``): constexpr parameters that no decorator config gives and no launch passes, of a
    kernel whose own autotuner has the hook (part of ``meta_names``)."""
    meta_defaults: dict[str, Any] = field(default_factory=dict)
    """Those of ``pruner_meta`` with a default: what a config that does not set them compiles with."""
    functions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Constexpr values that are ``@triton.jit`` functions host code passed (SGLang's ``SCORE_MOD``), by their text
    (see trace.function_constexpr): (file relative to the manifest, name), for the compile step."""
    row_spaces: dict[tuple[str, tuple[int, ...], str], list[ConfigChoice]] = field(default_factory=dict)
    """(variant id, key) → the configs ``early_config_prune`` returned for the row's first traced call (see
    ``pruning``): the row's space, in the hook's order, instead of ``space``."""
    row_pruned: dict[tuple[str, tuple[int, ...], str], dict[str, str]] = field(default_factory=dict)
    """(variant id, key) → the configs of ``space`` the hook dropped for the row, with why (tuning reports them)."""

    def _passed(self, names: Sequence[str]) -> list[str]:
        """Those of ``names`` some launch in the host code passes as a keyword."""
        return [n for n in names if any(n in s.keywords for s in self.launches)]

    @property
    def launch_flags(self) -> list[str]:
        """Launch attributes the host code passes (``launch_pdl=``...): read per call at run time, never built."""
        return self._passed(rt.LAUNCH_FLAGS)

    @property
    def launch_heuristics(self) -> list[str]:
        """Launch options the kernel's ``@triton.heuristics`` compute instead of a parameter (gsplat:
        ``{"num_warps": lambda args: ...}``): part of a binary's heuristic values, compiled as its options."""
        params = {n for n, _ in self.params}
        return [n for n in self.heuristic_names if n in HEURISTIC_OPTIONS and n not in params]

    @property
    def call_heuristics(self) -> list[str]:
        """Heuristic parameters the host code also passes at a call (Unsloth's ``DO_SOFTCAPPING=...``, which its
        heuristic coerces with ``bool(args["DO_SOFTCAPPING"])``): the heuristics see the passed value."""
        return self._passed(self.heuristic_names)

    @property
    def launch_axes(self) -> list[str]:
        return [a for a in self.axes if a in LAUNCH_OPTIONS]

    @property
    def written(self) -> list[str]:
        """The pointer and descriptor parameters the kernel may write through: what makes an op passing a tensor
        there write it."""
        types = dict(self.params)
        return [n for n in self.writes if n not in self.none_only
                and (types.get(n, "").startswith("*") or rt.desc_dtype(types.get(n, "")))]

    def spec_json(self) -> dict[str, Any]:
        """The kernel's entry of the package index, without its variants."""
        pre_hooks = sorted({c.pre_hook for c in self.space if c.pre_hook})
        # only_targets: the manifest's own targets for this kernel (for the runtime's messages)
        restricted = {"only_targets": list(self.entry.targets)} if self.entry.targets else {}
        return {**restricted, "function": self.function, "module": self.module,
                "params": [list(p) for p in self.params], "axes": self.axes,
                "dtype_args": self.type_args, "spec_params": self.spec_params, "key": self.key,
                **({"pointer_ints": self.pointer_ints} if self.pointer_ints else {}),
                "constraints": [c.text for c in self.constraints], "constexpr_defaults": self.constexpr_defaults,
                "pre_hooks": pre_hooks, **({"launch_flags": self.launch_flags} if self.launch_flags else {}),
                # the pointers and descriptors it may write through: what a custom op's guard checks (runtime/guard.py)
                **({"writes": list(self.written)} if self.written else {}),
                # and per combination of the flags a call passes (FlashInfer's HAS_OUTPUT): what it writes then
                **({"writes_when": [[[list(f) for f in flags], [n for n in names if n in self.written]]
                                    for flags, names in self.writes_when]} if self.writes_when else {}),
                **({"launch_heuristics": self.launch_heuristics} if self.launch_heuristics else {}),
                # arguments a launch's grid function puts in its dict (vLLM's causal_conv1d: ``META["batch_ptr"] =
                # ...``), which Triton launches: the runtime reads them back (Kernel.run), on the Python path
                **({"grid_args": grid_args} if (grid_args := sorted({k for s in self.launches for k in s.grid_sets}
                                                                     & {n for n, _ in self.params})) else {}),
                **({"call_heuristics": self.call_heuristics} if self.call_heuristics else {}),
                "variants": {}}

    def default_spec(self, key: tuple[int, ...]) -> str:
        """The documented default for a row without traced calls: pointers 16-byte aligned, key integers as
        the row's values make them, other integers divisible by 16."""
        values = dict(zip(self.key, key))
        types = dict(self.params)
        out = ""
        for name in self.spec_params:
            if types[name] in FLOAT_TYPES:  # a float specialized only as None (see optional_scalars)
                out += SPEC_NONE
            elif name in values:
                v = values[name]
                out += SPEC_ONE if v == 1 else (SPEC_DIV16 if v % 16 == 0 else SPEC_NONE)
            else:
                out += SPEC_DIV16
        return out

    def int_positions(self) -> list[int]:
        types = dict(self.params)
        return [i for i, n in enumerate(self.spec_params) if types[n] in INT_TYPES]

    def evaluate_heuristics(self, named: dict[str, Any], config: ConfigChoice) -> tuple[tuple[str, Any], ...]:
        if not self.heuristics:
            return ()
        nargs = {**named, **config.all_kwargs()}
        for name, fn in self.heuristics:
            try:
                nargs[name] = fn(nargs)
            except KeyError as exc:
                raise ManifestError(
                    f"the heuristic for {name} of {self.function} reads argument {exc}, which the build cannot "
                    "know from the key: name an examples function that calls the ops (see the README)",
                    key_path=f"kernels.{self.name}.examples") from None
            except Exception as exc:
                raise ManifestError(f"the heuristic for {name} of {self.function} failed: {type(exc).__name__}: {exc}",
                                    key_path=f"kernels.{self.name}") from None
        return tuple((n, nargs[n]) for n in self.heuristic_names)

    @property
    def descriptor_params(self) -> list[str]:
        """Host-side tensor descriptor parameters (``tensordesc<T>``), in order."""
        return [n for n, ty in self.params if rt.desc_dtype(ty) is not None]

    def descriptors_in(self, named: dict[str, Any]) -> list[str]:
        """The parameters a call passes tensor descriptors to, in order: ``tensordesc<T>`` ones and pointer ones
        (the Triton tutorial's attention takes a descriptor or a pointer there)."""
        return [n for n, ty in self.params if rt.desc_dtype(ty) is not None
                or (ty.startswith("*") and hasattr(named.get(n), "block_shape"))]

    def descriptor_blocks(self, named: dict[str, Any], config: ConfigChoice,
                          heur: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The block shape of each tensor descriptor a call like ``named`` passes when ``config`` runs it: as the
        call made it, or as the config's pre-hook sets it (run here on copies, over what the runtime hands it:
        the arguments by name, the config's keyword arguments and the heuristics' values)."""
        names = self.descriptors_in(named)
        if not names:
            return ()
        nargs = {**named, **config.all_kwargs(), **dict(heur)}
        for n in names:
            if not hasattr(named.get(n), "block_shape"):
                raise ManifestError(f"{self.function} takes tensor descriptor '{n}': the build reads its block shape "
                                    "from the calls of the examples function (or tune.inputs), which give none for "
                                    "this row", key_path=f"kernels.{self.name}.examples")
            nargs[n] = copy.copy(named[n])
            nargs[n].block_shape = list(named[n].block_shape)  # a hook may set items in place
        if config.pre_hook:
            try:
                self.pre_hooks[config.pre_hook](nargs)
            except Exception as exc:
                raise ManifestError(f"the config pre-hook {config.pre_hook} of {self.function} failed on a traced "
                                    f"call with config {config.id}: {type(exc).__name__}: {exc}",
                                    key_path=f"kernels.{self.name}.examples") from None
        return tuple((n, tuple(int(d) for d in nargs[n].block_shape)) for n in names)

    def settled_heuristics(self, named: dict[str, Any], config: ConfigChoice) -> set[str]:
        """The heuristics whose values follow from the variant's values and the config alone (scattermoe's
        ``NO_K_MASK: args['K'] % args['BLOCK_K'] == 0`` with ``K`` a call-site constexpr): no call of this variant
        and config has another, so the build flips none of them (it had built both values: 120 of scattermoe's 217
        binaries could never launch). Found by evaluating them with every runtime argument standing for a value
        they may not read; one reading process-wide settings (``PROCESS_STATE``) is never settled."""
        if not self.heuristics:
            return set()
        runtime = {n for n, kind in self.params if kind not in ("meta", "constexpr", "heuristic")}
        nargs = {**{n: _CallValue(n) if n in runtime and v is not None else v for n, v in named.items()},
                 **config.all_kwargs()}  # (a None stays: which arguments are None is presence_heuristics')
        settled = set()
        for name, fn in self.heuristics:
            try:
                value = fn(nargs)
            except Exception:  # (_ReadsCallValue, or what the stand-in made the heuristic's own code raise)
                nargs[name] = _CallValue(name)  # a later heuristic reading it reads the call too
                continue
            if isinstance(value, _CallValue) or _process_state_names(fn):
                nargs[name] = _CallValue(name)
                continue
            nargs[name] = value
            settled.add(name)
        return settled

    def presence_heuristics(self, named: dict[str, Any], config: ConfigChoice) -> set[str]:
        """The heuristics whose value follows from which pointer (or optional float) arguments a call passes as
        None (FLA's ``USE_INITIAL_STATE: args['h0'] is not None``): the build never flips those (a binary for
        ``h0=None`` with ``USE_INITIAL_STATE=True`` would read a None pointer; one for a passed ``h0`` with it False
        is never launched). Found by evaluating them with every pointer's presence inverted."""
        if not self.heuristics:
            return set()
        # and floats some call passes as None (``optional_scalars``: FLA's ``HAS_SCALE: args['scale'] is not None``)
        pointers = [n for n, ty in self.params if n in named
                    and (ty.startswith("*") or (ty in FLOAT_TYPES and n in self.spec_params))]
        before = dict(self.evaluate_heuristics(named, config))
        try:
            after = dict(self.evaluate_heuristics(
                {**named, **{n: _PASSED if named[n] is None else None for n in pointers}}, config))
        except Exception:  # a heuristic reads a passed tensor (its dtype): invert only the Nones
            nones = [n for n in pointers if named[n] is None]
            if not nones:
                return set()
            try:
                after = dict(self.evaluate_heuristics({**named, **dict.fromkeys(nones, _PASSED)}, config))
            except Exception:  # nor can it take a stand-in where a None was: none is flipped
                return set(before)
        return {n for n in before if before[n] != after[n]}


@dataclass
class BuildPlan:
    """Everything the compile and package stages need."""

    loaded: mf.LoadedManifest
    targets: list[str]
    kernels: dict[str, KernelPlan]
    entries: list[EntryPlan]
    modules: dict[str, dict[str, Any]]
    """Host modules by name: kernel file path, kernels bound, ops exported, blanked host source."""
    tuning: Any = None
    """The ``TuningSummary`` of the tuning database applied to the tables (``forge_aot.tune.apply``), if any."""
    data_files: dict[str, str] = field(default_factory=dict)
    """Data files host code reads at run time: path in the package (``_ops/configs/x.json``) -> project file."""
    warnings: list[str] = field(default_factory=list)
    """What the build packages but a person should know (``check`` and ``build`` print them)."""

    def binaries_for(self, entry: EntryPlan, key: tuple[int, ...], config: ConfigChoice) -> list[BinarySpec]:
        """The binaries a row needs of a config. Per traced call (else the documented default): its exact
        specialization and the same with every argument aligned (for aligned shapes near an unaligned row); for
        other shapes, the same with no assumption on the sizes outside the key (integers
        not named ``*stride*``: a batch of 1 in the examples must not cost a real batch its unit strides), on
        each key size alone, on any size, and on any integer's divisibility by 16 (values of 1 kept); the
        generic fallback. Each
        carries the heuristics' values; for boolean heuristics the last two are built for every value too, so
        a shape between rows that flips one (``EVEN_K``) still has a fast binary."""
        kp = self.kernels[entry.kernel]
        calls = entry.calls.get(key)
        if calls:
            combos = _none_combinations(kp, calls, [c for row in entry.calls.values() for c in row])
        else:
            combos = [(kp.default_spec(key), {**dict(zip(kp.key, key)), **entry.assignment}, True)]
        pairs = []
        # heuristics and pre-hooks are host code: as a GPU of the entry's target (FlagAttention's paged attention picks
        # num_stages by torch.cuda.get_device_capability() in a heuristic), as the wheel runs them on one
        from .trace import as_target

        with as_target(entry.target, False) if kp.heuristics or config.pre_hook else contextlib.nullcontext():
            for spec, named, traced in combos:
                heur = kp.evaluate_heuristics(named, config)
                fixed = (kp.presence_heuristics(named, config) if calls else set()) \
                    | kp.settled_heuristics(named, config)
                pairs.append((spec, heur, fixed, traced, kp.descriptor_blocks(named, config, heur)))
        ints = kp.int_positions()
        alignable = [i for i, n in enumerate(kp.spec_params) if i in ints or dict(kp.params)[n].startswith("*")]
        sizes = [i for i in ints if "stride" not in kp.spec_params[i].lower()]
        batch = [i for i in sizes if kp.spec_params[i] not in kp.key]
        out: set[BinarySpec] = set()
        for spec, heur, fixed, traced, descs in pairs:  # traced calls first: their binaries win over speculative ones
            b = BinarySpec(spec, heur, descs, speculative=not traced)
            loose = b.relaxed(ints, SPEC_DIV16)
            # One key size off the rows' divisibility (M = 3000 between tuned rows) must not cost the others'
            # assumptions: the pipelined loop over an unassumed K is several times slower. So each key size is
            # also relaxed on its own (the specialization the JIT compiles for such a call).
            single = {b.relaxed([i]) for i in sizes if kp.spec_params[i] in kp.key and b.spec[i] == SPEC_DIV16}
            out |= {b, b.aligned(alignable), b.relaxed(batch), b.relaxed(sizes), loose, b.loosest(), *single}
            flags = [i for i, (n, v) in enumerate(heur) if isinstance(v, bool) and n not in fixed][:3]
            for values in itertools.product((False, True), repeat=len(flags)):
                flipped = list(heur)
                for i, v in zip(flags, values):
                    flipped[i] = (heur[i][0], v)
                out |= {dataclasses.replace(loose, heur=tuple(flipped)),
                        dataclasses.replace(b.loosest(), heur=tuple(flipped))}
        # An integer passed where a pointer also goes (flash-attn's SEQLEN_OFFSETS, a chunk's offset) changes call
        # by call: a binary assuming it divisible by 16 or 1 has one for any integer, its other assumptions kept.
        out |= {b.relaxed(pos) for b in out
                if (pos := [i for i, c in enumerate(b.spec) if c in (SPEC_INT_DIV16, SPEC_INT_ONE)])}
        return sorted(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": str(self.loaded.path), "manifest_sha256": self.loaded.sha256, "targets": self.targets,
            "kernels": {n: {"function": k.function, "source": str(k.source), "params": k.params, "axes": k.axes,
                            "spec_params": k.spec_params, "key": k.key, "heuristics": k.heuristic_names,
                            "space": [c.id for c in k.space], "notes": k.notes,
                            **({"local_modules": {m: str(lm.path) for m, lm in sorted(k.local_modules.items())}}
                               if k.local_modules else {})}
                        for n, k in self.kernels.items()},
            "entries": [{"kernel": e.kernel, "variant": e.variant, "target": e.target,
                         "tables": {dev: [{"key": list(r.key), "preferences": [c.id for c in r.preferences],
                                           "traced_calls": len(e.calls.get(r.key, []))}
                                          for r in rows] for dev, rows in e.tables.items()},
                         "table_sources": e.table_sources, "rows": e.origin_counts()} for e in self.entries],
            "data_files": self.data_files, "warnings": self.warnings,
        }


def _none_combinations(kp: KernelPlan, calls: list[TracedCall], variant_calls: list[TracedCall],
                       ) -> list[tuple[str, dict[str, Any], bool]]:
    """(specialization, arguments by name, traced) of each traced call of a row (``calls``) and, where the calls of
    its variant (``variant_calls``, every row's) pass some pointers as None and others as tensors (optional tensors:
    FLA's ``g``, ``h0``, ``ht``; Cut Cross-Entropy's ``softcap`` float), of every other combination of those: a
    call may leave out any subset, not only those the examples tried, and at any shape, not only at the one an
    example tried it (its softcap call, traced at a small shape, reached a large one's config). A pointer made
    present takes a tensor another call passed there (so heuristics reading its dtype see a real one) and the
    aligned code; only those the calls pass where the manifest says ``every-none-combination = false``. Per
    variant: a pointer passed as None by every call of one variant and as a tensor by every call of another is not
    crossed (FLA's ``USE_G=g is not None``, flash-attn's positional ``residual is not None``: crossing would build
    binaries no call reaches; ``check`` names such pointers, see ``_optional_per_variant``)."""
    out = {(c.spec, id(c)): (c.spec, c.named or {}, True) for c in calls}
    if not kp.entry.every_none_combination:
        return list(out.values())
    optional: dict[int, Any] = {}  # position -> a tensor (or scalar) some call passed there
    present: dict[int, str] = {}  # position -> the code it takes when present: aligned, or the scalar's own
    for i, name in enumerate(kp.spec_params):
        passed = [(c.named[name], c.spec[i]) for c in variant_calls
                  if c.spec[i] != SPEC_ABSENT and (c.named or {}).get(name) is not None]
        if passed and any(c.spec[i] == SPEC_ABSENT for c in variant_calls):
            optional[i] = passed[0][0]
            present[i] = SPEC_DIV16 if dict(kp.params)[name].startswith("*") else passed[0][1]
    for c in calls:
        for nones in itertools.product((False, True), repeat=len(optional)):
            spec, named = list(c.spec), dict(c.named or {})
            for (i, tensor), is_none in zip(optional.items(), nones):
                name = kp.spec_params[i]
                if is_none:
                    spec[i], named[name] = SPEC_ABSENT, None
                elif c.spec[i] == SPEC_ABSENT:
                    spec[i], named[name] = present[i], tensor
            out.setdefault(("".join(spec), id(c)), ("".join(spec), named, False))
    return list(out.values())


def infer_signature(loaded: mf.LoadedManifest, kp: KernelPlan, calls: list[TracedCall]) -> None:
    """Type the runtime parameters the manifest left out (kernels with examples) as Triton's JIT types the values
    the traced calls pass: a tensor ``*T`` where its dtype is always its type variable's, else its one dtype; an
    integer ``i32`` where every value fits (a larger one at run time is refused, naming ``i64``), else ``i64``; a
    bool ``i1``; a float ``fp32``. Then the specialized parameters and each call's specialization again."""
    untyped = [n for n, ty in kp.params if ty == UNTYPED]
    if not untyped:
        return
    at = f"kernels.{kp.name}.signature"
    untypable: list[ManifestError] = []  # (every such parameter named in one message: lmdeploy's kernels have four)
    for n in untyped:
        try:
            kp.inferred[n] = _type_of_values(loaded, kp, n, calls, at)
        except ManifestError as exc:
            untypable.append(exc)
            continue
        if "|" in kp.inferred[n]:
            kp.pointer_ints[n] = kp.inferred[n].partition("|")[2]
    if len(untypable) > 1:
        raise _error(loaded, at, f"{len(untypable)} runtime parameters of {kp.function} have no type, and the traced "
                     "calls do not give them one:\n" + "\n".join(f"  {exc.key_path}: {exc.message}"
                                                                 for exc in untypable))
    if untypable:
        raise untypable[0]
    kp.params = [(n, kp.inferred.get(n, ty).partition("|")[0]) for n, ty in kp.params]
    types = dict(kp.params)
    kp.spec_params = [n for n, ty in kp.params if n in kp.spec_params or n in kp.pointer_ints or (
        n in kp.inferred and n not in kp.do_not_specialize and (ty.startswith("*") or ty in INT_TYPES))]
    by_value = [kn for kn in kp.key if kn in kp.inferred and types[kn] not in INT_TYPES]
    for kn in by_value if kp.entry.key else ():
        raise _error(loaded, f"kernels.{kp.name}.key", f"key argument '{kn}' is a {types[kn]} in the traced calls, "
                     "not an integer")
    if by_value:  # the decorator's key (see _kernel_plan): the traced calls' keys lose them too
        kept = [i for i, kn in enumerate(kp.key) if kn not in by_value]
        kp.key = [kp.key[i] for i in kept]
        calls[:] = [dataclasses.replace(c, key=tuple(c.key[i] for i in kept)) for c in calls]
        kp.notes.append(_unkeyed_note(f"kernels.{kp.name}", by_value, types))
    for pname in (*kp.reset_to_zero, *kp.restore_value):
        if not types[pname].startswith("*"):
            raise _error(loaded, f"kernels.{kp.name}.tune", f"'{pname}' is not a pointer parameter of {kp.function}")
    for c in calls:
        respecialize(kp, c)


HIP_CONFIG_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack", "instruction_sched_variant")
"""Options of Triton's AMD backend that configs set beside their meta-parameters (flash-attn's AMD attention)."""


def _unkeyed_note(at: str, names: list[str], types: dict[str, str]) -> str:
    return (f"{at}: @triton.autotune's key names {', '.join(f'{n} ({types[n]})' for n in names)}, not an integer: "
            "the table's rows are keyed by the rest, one config for every value (Triton's autotuner tunes each value "
            "apart)")


def _type_of_values(loaded: mf.LoadedManifest, kp: KernelPlan, name: str, calls: list[TracedCall], at: str) -> str:
    values = [(c, (c.named or {}).get(name)) for c in calls]
    present = [v for _, v in values if v is not None]
    if values and not present:
        # FLA's varlen cu_seqlens in an op the examples call only unpacked: Triton compiles None as the constant
        # None, whatever the parameter's type, and so does every binary here (its type only fills the signature)
        kp.notes.append(f"{at}.{name}: None in every traced call, so every binary takes it as the constant None "
                        "(typed *i8 for the signature): a call passing a value there raises NotBuiltError; give it a "
                        "type and an example that passes one to build that too")
        kp.none_only.add(name)  # (an integer in a store's address, flash-attn's N_CTX_NEW: never written through)
        return "*i8"
    why = "no traced call launches it" if not values else ""
    descriptors = [v for v in present if _is_descriptor(v)]
    if present and len(descriptors) == len(present):  # host-side TensorDescriptors (the tutorials' TMA kernels)
        element, dtypes = _element_type(kp, values)
        if element is not None:
            return f"tensordesc<{element}>"
        raise _error(loaded, f"{at}.{name}", f"runtime parameter '{name}' of {kp.function} has no type, and the "
                     f"traced calls do not give it one: its descriptors are over {', '.join(dtypes)} tensors: give it "
                     "a type variable of dtypes (tensordesc<T>)")
    tensors = [v for v in present if hasattr(v, "dtype") and hasattr(v, "data_ptr")]
    ints = [v for v in present if type(v) is int]
    if tensors and ints and len(tensors) + len(ints) == len(present):
        # flash-attn's rotary SEQLEN_OFFSETS, "this could be int or a pointer": each binary takes one or the other
        pointer = _type_of_values(loaded, kp, name, [c for c, v in values if v is None or type(v) is not int], at)
        return f"{pointer}|{'i32' if all(-(2**31) <= v < 2**31 for v in ints) else 'i64'}"
    if len(tensors) == len(present) and not why:
        element, dtypes = _element_type(kp, values)
        if element is not None:
            return f"*{element}"
        why = f"its tensors are {', '.join(dtypes)}: give it a type variable of dtypes"
    elif present and all(type(v) is bool for v in present):
        return "i1"
    elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "i32" if all(-(2**31) <= v < 2**31 for v in present) else "i64" if all(
            -(2**63) <= v < 2**63 for v in present) else "u64"
    elif present and all(isinstance(v, float) for v in present):  # a tl.constexpr(float) global included
        return "fp32"
    elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        # SGLang's quantization passes torch.iinfo bounds (int) on its int8 path, finfo bounds (float) on fp8
        why = (f"the traced calls pass int and float (Triton's JIT compiles a binary for each, integer arithmetic "
               f"in one): give it one type where the kernel computes the same with either, signature = {{ {name} = "
               f"\"fp32\" }} under [{at.rpartition('.')[0]}] (ints are then passed as floats), or pass one type from "
               "the host code")
    elif not why:
        why = f"the traced calls pass {sorted({type(v).__name__ for v in present})}"
    raise _error(loaded, f"{at}.{name}", f"runtime parameter '{name}' of {kp.function} has no type, and the traced "
                 f"calls do not give it one: {why}")


def _element_type(kp: KernelPlan, values: list[tuple[TracedCall, Any]]) -> tuple[str | None, list[str]]:
    """The element type of a parameter's tensors (a descriptor's: its tensor's) in the traced calls: the type
    variable whose tensor has their dtype in every call, else their one dtype; None and their dtypes where they have
    several."""
    for tv, source in kp.type_args.items():
        # (a pointer-or-int source given an int, flash-attn's SEQLEN_OFFSETS, says nothing, as at run time)
        given = [(v, (c.named or {}).get(source)) for c, v in values if v is not None]
        told = [(v, s) for v, s in given if s is None or hasattr(_tensor_of(s), "dtype")]
        if (told or not given) and all(s is not None and rt.dtype_name(_tensor_of(v).dtype)
                                       == rt.dtype_name(_tensor_of(s).dtype) for v, s in told):
            return tv, []
    dtypes = sorted({rt.dtype_name(_tensor_of(v).dtype) for _, v in values if v is not None})
    return (dtypes[0] if len(dtypes) == 1 else None), dtypes


def _is_descriptor(value: Any) -> bool:
    """Whether an argument is a host-side tensor descriptor (Triton's ``TensorDescriptor`` or the runtime's)."""
    return hasattr(value, "block_shape") and hasattr(value, "base")


def _tensor_of(value: Any) -> Any:
    """A tensor argument, or the tensor a host-side descriptor describes."""
    return value.base if _is_descriptor(value) else value


def respecialize(kp: KernelPlan, call: TracedCall) -> TracedCall:
    """``call``'s specialization over the kernel's specialized parameters, read again from its arguments by name
    (as ``argument_spec`` reads a call), where a handle that knew fewer of them recorded it."""
    if len(call.spec) != len(kp.spec_params) and call.named is not None:
        types = dict(kp.params)
        slots = [(i, types[n].startswith("*")) for i, n in enumerate(kp.spec_params)]
        call.spec = rt.argument_spec(slots, [rt.pointer_value(call.named.get(n)) if types[n].startswith("*")
                                             else call.named.get(n) for n in kp.spec_params])
    return call


def optional_scalars(kernels: dict[str, KernelPlan], traced: dict[str, list[TracedCall]]) -> None:
    """Float parameters some traced call passes as None (Liger's ``softcap=None``; Triton compiles any argument
    that is None as the constant None) join their kernel's specialized parameters, and each traced call's
    specialization is read again with their codes (``N``, else ``x``): a binary for each, as for an optional
    pointer."""
    for name, kp in kernels.items():
        calls = traced.get(name, [])
        nones = {n for n, ty in kp.params if ty in FLOAT_TYPES and n not in kp.spec_params
                 and any((c.named or {}).get(n, 0) is None for c in calls)}
        if nones:
            kp.spec_params = [n for n, _ in kp.params if n in kp.spec_params or n in nones]
            for c in calls:
                respecialize(kp, c)


def _concrete(ty: str, assignment: dict[str, Any]) -> str:
    if ty.startswith("*"):
        return "*" + str(assignment.get(ty[1:], ty[1:]))
    return ty


def _no_class_op(loaded: mf.LoadedManifest, at: str, src: SourceFile, op: str) -> None:
    """An op is a function the package calls and registers; a class (an ``autograd.Function``, an ``nn.Module``)
    is exported as it is instead."""
    if op in src.host_classes:
        raise _error(loaded, at, f"'{op}' is a class in {src.path.name}: an op must be a function (export a class, "
                     f"such as a torch.autograd.Function or an nn.Module, as it is: [exports] {op} = \"<file>\")")


def check_kernel_branches(src: SourceFile, path: Path) -> None:
    """Each top-level block the file is read with one branch of (``sourcesplit._flatten_kernel_branches``) must have
    run that branch when the build imported the file: one of its kernels is a Triton kernel defined there. Else the
    wheel would run code the build never saw run (a stub of the kernel's name does not count)."""
    blocks: dict[int, list[tuple[str, int, int]]] = {}
    for name, (block, first, last) in sorted(src.branch_kernels.items()):
        blocks.setdefault(block, []).append((name, first, last))
    for block, kernels in sorted(blocks.items()):
        if not any(kernel_defined_on(str(path), *k) for k in kernels):
            name = kernels[0][0]
            raise SourceError(f"{path}:{src.kernels[name].line}: {name} is defined in a branch of the block at line "
                              f"{block} that importing the file with Triton does not take; the wheel runs the "
                              "branch that defines the kernels")


def _pruner_meta(ks: KernelSource, t: mf.TuneSpace, autotune: AutotuneInfo | None,
                 launches: Sequence[LaunchSite], known: set[str]) -> list[str]:
    """Constexpr parameters only an ``early_config_prune``'s configs can set (see ``KernelPlan.pruner_meta``): the
    kernel's own autotuner (its configs the space) has the hook, and no launch passes them (positionally or by
    keyword; a launch spreading ``**kwargs`` may pass anything, so then none). One with a default keeps it in the
    configs that do not set it: the value every call took before."""
    hook = t.prune or (autotune.prune.get("early_config_prune") if autotune else None)
    if not hook or autotune is None or t.configs or t.meta or t.num_warps or t.num_stages or not launches \
            or any(s.star_args for s in launches):
        return []
    passed = {kw for s in launches for kw in s.keywords}
    positional = max(s.positional for s in launches)
    return [p.name for i, p in enumerate(ks.params) if p.constexpr and i >= positional and p.name not in known
            and p.name not in passed]


def _error(loaded: mf.LoadedManifest, path: str, message: str, suggestion: str | None = None) -> ManifestError:
    return ManifestError(message, file=str(loaded.path), key_path=path, suggestion=suggestion)


def _kernel_plan(loaded: mf.LoadedManifest, name: str, k: mf.KernelEntry, src: SourceFile, func: str,
                 path: Path, imported_launches: Sequence[LaunchSite] = ()) -> KernelPlan:
    at = f"kernels.{name}"
    if func not in src.kernels:
        raise _error(loaded, f"{at}.source", f"no @triton.jit function '{func}' in {src.path.name} (found: "
                     f"{', '.join(src.kernels)})", close_match(func, src.kernels))
    check_kernel_branches(src, path)
    ks: KernelSource = src.kernels[func]
    names = [p.name for p in ks.params]
    autotune, heuristic_names = (read_decorators(str(path), func, ks.autotuned, f"kernels.{name}.tune")
                                 if (ks.autotuned or ks.has_heuristics or ks.rewrapped) else (None, []))
    t = k.tune
    own_tuner = ks.autotuned and autotune is None  # a decorator read as an autotuner for its configs= and key= only
    if own_tuner and not (t.configs or t.meta or t.num_warps or t.num_stages):
        raise SourceError(f"{path}:{ks.autotune_line}: {func} has a decorator with configs= and key= that does not "
                          "make a Triton Autotuner (triton.runtime.autotuner.Autotuner or a subclass; GPTQ's "
                          "custom_autotune): forge-aot cannot read its configs; give the tuning space in the "
                          f"manifest ([{at}.tune] configs, and {at}.key) and the build tunes that instead")
    # The tuning space: the manifest's, else the decorator's configs, else Triton's defaults.
    if t.configs:
        flat_space = [dict(c) for c in t.configs]
    elif t.meta or t.num_warps or t.num_stages or autotune is None:
        axes_ = [*t.meta.items(), ("num_warps", t.num_warps or (4,)), ("num_stages", t.num_stages or (3,))]
        flat_space = [dict(zip([a for a, _ in axes_], combo, strict=True))
                      for combo in itertools.product(*[vals for _, vals in axes_])]
    else:
        flat_space = []
        for i, c in enumerate(autotune.configs):
            if c["num_ctas"] != 1:
                raise _error(loaded, f"{at}.tune", f"config {i} of the @triton.autotune of {func} uses num_ctas="
                             f"{c['num_ctas']} (thread-block clusters), which the forge-aot loader cannot launch; "
                             "override the space with tune.configs")
            flat_space.append({**c["meta"], "num_warps": c["num_warps"], "num_stages": c["num_stages"],
                               **({"maxnreg": c["maxnreg"]} if c["maxnreg"] else {}),
                               **({"pre_hook": c["pre_hook"]} if c["pre_hook"] else {})})
    meta_names = list(dict.fromkeys(n for c in flat_space for n in c
                                    if n not in ("num_warps", "num_stages", "maxnreg", "pre_hook")))
    for c in flat_space:
        missing = [m for m in meta_names if m not in c]
        if missing:
            raise _error(loaded, f"{at}.tune", f"a config of {func} does not give {missing}: every config must "
                         "give the same meta-parameters")
    constexpr_params = [p.name for p in ks.params if p.constexpr]
    from_decorator = not (t.configs or t.meta or t.num_warps or t.num_stages)
    amd_options = [m for m in meta_names if m in HIP_CONFIG_OPTIONS and m not in names]
    for m in meta_names:
        if m in amd_options:
            continue
        if m not in names:
            raise _error(loaded, f"{at}.tune" if from_decorator else f"{at}.tune.meta.{m}",
                         f"{func} has no parameter '{m}'" + (" (a config of its @triton.autotune sets it)"
                                                             if from_decorator else ""), close_match(m, names))
        if m not in constexpr_params:
            raise _error(loaded, f"{at}.tune.meta.{m}", f"parameter '{m}' of {func} is not annotated tl.constexpr: "
                         "a tuned meta-parameter must be a constexpr parameter")
    call_names = {*k.constexprs, *k.derive, *(n for c in k.combinations for n in c)}
    for n in call_names:
        if n not in LAUNCH_OPTIONS and n not in names:
            raise _error(loaded, f"{at}.constexprs.{n}", f"{func} has no parameter '{n}'", close_match(n, names))
        if n in names and n not in constexpr_params:
            raise _error(loaded, f"{at}.constexprs.{n}", f"parameter '{n}' of {func} is not annotated tl.constexpr")
        if n in heuristic_names:
            raise _error(loaded, f"{at}.constexprs.{n}", f"'{n}' is computed by the kernel's @triton.heuristics")
    # Launch options the host code passes select binaries, like call-site constexprs.
    launches = [*(s for s in src.launches if s.kernel == func), *imported_launches]
    passed_options = {kw for s in launches for kw in s.keywords if kw in ("num_warps", "num_stages",
                                                                          *rt.COMPILE_OPTIONS)}
    # ``**config`` (vLLM's tuned-config dicts) may carry either; not a positional ``*x.stride()`` (attorch), nor a
    # call of a kernel with @triton.autotune, whose configs give them (Triton refuses them passed again)
    if not ks.autotuned and any(s.star_kwargs for s in launches):
        passed_options |= {"num_warps", "num_stages"}
    launch_axes = [o for o in LAUNCH_OPTIONS if o in call_names or o in passed_options]
    declared_meta = list(meta_names)
    meta_names += _pruner_meta(ks, t, autotune, launches, {*meta_names, *heuristic_names, *call_names})
    meta_defaults = {p.name: p.default for p in ks.params if p.name in meta_names[len(declared_meta):]
                     and p.has_default}
    if COMPUTED_DEFAULT in meta_defaults.values():  # as the imported kernel holds them
        meta_defaults.update(read_defaults(str(path), func, [n for n, v in meta_defaults.items()
                                                               if v is COMPUTED_DEFAULT]))
    params: list[tuple[str, str]] = []
    pointer_ints: dict[str, str] = {}
    defaults: dict[str, Any] = {}
    call_constexprs: list[str] = []
    for p in ks.params:
        if p.constexpr:
            if p.name in meta_names:
                params.append((p.name, "meta"))
            elif p.name in heuristic_names:
                params.append((p.name, "heuristic"))
            else:
                params.append((p.name, "constexpr"))
                call_constexprs.append(p.name)
                if p.has_default:
                    defaults[p.name] = p.default
        elif p.name in k.signature:
            ptr_type, _, int_type = k.signature[p.name].partition("|")
            if p.annotation_type and ptr_type != p.annotation_type:
                raise _error(loaded, f"{at}.signature.{p.name}", f"'{p.name}' of {func} is annotated as "
                             f"{p.annotation_type}, which Triton's JIT compiles it as; the manifest says {ptr_type}")
            params.append((p.name, ptr_type))
            if int_type:
                pointer_ints[p.name] = int_type
        elif p.annotation_type:  # Triton's JIT types it by its annotation (torchao's ``stride: tl.int64``)
            params.append((p.name, p.annotation_type))
        elif p.name in meta_names or p.name in call_names:
            raise _error(loaded, f"{at}.tune.meta" if p.name in meta_names else f"{at}.constexprs",
                         f"parameter '{p.name}' of {func} is not annotated tl.constexpr")
        elif k.examples is not None:  # typed from the traced calls' values, as Triton's JIT types them
            params.append((p.name, UNTYPED))
        else:
            raise _error(loaded, f"{at}.signature", f"runtime parameter '{p.name}' of {func} has no type (give it "
                         "one, or an examples function whose calls show it)")
    computed = [n for n, v in defaults.items() if v is COMPUTED_DEFAULT]
    if computed:  # defaults the source computes: as the imported kernel holds them
        defaults.update(read_defaults(str(path), func, computed))
    for n in k.signature:
        if n not in names:
            raise _error(loaded, f"{at}.signature.{n}", f"{func} has no parameter '{n}'", close_match(n, names))
    for n in heuristic_names:
        if n not in constexpr_params and n not in HEURISTIC_OPTIONS:
            raise SourceError(f"{path}:{ks.line}: @triton.heuristics of {func} computes '{n}', which is neither a "
                              f"tl.constexpr parameter nor a launch option it may set ({', '.join(HEURISTIC_OPTIONS)})")
    type_args: dict[str, str] = {}
    for pname, ty in params:
        tv = ty[1:] if ty.startswith("*") else rt.desc_dtype(ty)
        if tv in k.dtypes and tv not in type_args:
            type_args[tv] = pname
    order = {n: i for i, n in enumerate(names)}
    type_axes = sorted(k.dtypes, key=lambda tv: order[type_args[tv]])
    # A constexpr parameter named like a launch option (the tutorial softmax's num_stages) is one axis: as with
    # Triton, the call's keyword sets both the parameter and the compile option (see preferences).
    axes = [*type_axes, *call_constexprs, *(a for a in launch_axes if a not in call_constexprs)]
    runtime_names = [n for n, ty in params if ty not in ("meta", "constexpr", "heuristic")]
    for i, n in enumerate(k.do_not_specialize):  # (the manifest checked them against a signature it had)
        if n not in runtime_names:
            raise _error(loaded, f"{at}.do-not-specialize[{i}]", f"'{n}' is not a runtime parameter of {func} "
                         f"(accepted: {', '.join(runtime_names)})", close_match(n, runtime_names))
    dns = set(ks.do_not_specialize if ks.do_not_specialize is not None else read_do_not_specialize(str(path), func)) \
        | set(k.do_not_specialize)
    # A parameter that takes a pointer or an integer is always specialized: its binaries differ in what they take.
    spec_params = [n for n, ty in params if n in pointer_ints or (n not in dns and (ty.startswith("*")
                                                                                   or ty in INT_TYPES))]
    key = list(k.key) or (autotune.key if autotune else [])
    # A decorator key naming what a heuristic computes (FLA keys on ``IS_VARLEN``, set by ``@triton.heuristics``,
    # which runs outside the autotuner): each row's binaries carry the heuristics' values already, so the rows are
    # keyed by the rest (one config for both values, where Triton's autotuner would tune each).
    by_heuristic = [kn for kn in key if not k.key and kn in heuristic_names]
    key = [kn for kn in key if kn not in by_heuristic]
    # A decorator key naming a float (flash-attn's AMD attention keys on ``dropout_p``): Triton tunes each value
    # apart; the table's rows, chosen by the nearest integer key, are keyed by the rest.
    by_value = [kn for kn in key if not k.key and dict(params).get(kn, UNTYPED) not in (*INT_TYPES, UNTYPED)
                and dict(params).get(kn) not in ("meta", "constexpr", "heuristic")]
    # A decorator key naming no parameter at all (torchao's ``key=["num_elements"]`` over a kernel without one):
    # Triton's autotuner leaves it out of its key, so do the tables.
    unknown_key = [kn for kn in key if not k.key and kn not in names and kn not in LAUNCH_OPTIONS]
    key = [kn for kn in key if kn not in by_value and kn not in unknown_key]
    int_params = {n for n, ty in params if ty in INT_TYPES or ty == UNTYPED}  # untyped: checked once typed
    for i, kn in enumerate(key):
        if kn not in int_params and kn not in call_constexprs and kn not in launch_axes:
            known = sorted({*int_params, *call_constexprs, *launch_axes})
            raise _error(loaded, f"{at}.key[{i}]" if k.key else f"{at}.key",
                         f"key argument '{kn}' is not an integer parameter or call-site constexpr of {func} "
                         f"(accepted: {', '.join(known) or 'none'})", close_match(kn, known))
    # A type variable named like a compile-time name of the kernel (FLA's l2norm kernels take ``T: tl.constexpr``,
    # the row count, beside a project's ``T`` for dtypes) would share its variant axis: one value lost, silently.
    compile_time = {n for n, ty in params if ty in ("meta", "constexpr", "heuristic")} | {*key, *launch_axes}
    for tv in sorted(set(k.dtypes) & compile_time):
        raise _error(loaded, f"{at}.dtypes.{tv}", f"type variable '{tv}' has the name of {func}'s "
                     f"{'key argument' if tv in key else 'constexpr parameter'} '{tv}': rename the type variable "
                     "(in dtypes and signature), or each build variant would take one of them for both")
    for i, point in enumerate(k.shapes):
        if set(point) != set(key):
            raise _error(loaded, f"{at}.shapes[{i}]", f"a shape gives exactly the key arguments {key}, got "
                         f"{list(point)}")
    if k.buckets and set(k.buckets) != set(key):
        raise _error(loaded, f"{at}.buckets", f"give values for exactly the key arguments {key}")
    if key and not (k.shapes or k.buckets or k.examples):
        raise _error(loaded, f"{at}.shapes", "the kernel has a key: list the shapes that matter (shapes or "
                     "buckets) or name an examples function that calls the ops")
    if k.refine:
        chosen_at_call = sorted(set(key) & {*call_constexprs, *launch_axes})
        if chosen_at_call:  # the manifest's key or the decorator's
            raise _error(loaded, f"{at}.refine", f"key arguments {chosen_at_call} are chosen at the call site: "
                         "rows between their values would ask for values that are not built")
        if not (k.shapes or k.buckets):
            raise _error(loaded, f"{at}.refine", "adds rows between listed shapes: list them (shapes or buckets)")
    space = [ConfigChoice.from_flat({**c, **meta_defaults}, [*declared_meta, *meta_defaults], {}) for c in flat_space]
    env_names = {*meta_names, "num_warps", "num_stages", "maxnreg", *call_constexprs, *launch_axes, *key,
                 *k.dtypes}
    constraints = []
    for i, text in enumerate(t.constraints):
        expr = Expression(text)
        for unknown in sorted(expr.names - env_names):
            raise _error(loaded, f"{at}.tune.constraints[{i}]", f"unknown name '{unknown}' (accepted: "
                         f"{', '.join(sorted(env_names))})", close_match(unknown, env_names))
        constraints.append(expr)
    for field_name in ("flops", "bytes"):
        text = getattr(t, field_name)
        for unknown in sorted(Expression(text).names - {*key, *k.dtypes} if text else ()):
            raise _error(loaded, f"{at}.tune.{field_name}", f"unknown name '{unknown}' (accepted: the key "
                         f"arguments {key} and the type variables {list(k.dtypes)})",
                         close_match(unknown, [*key, *k.dtypes]))
    if t.default is not None:
        for m in meta_names:
            if m not in t.default and m not in meta_defaults:
                raise _error(loaded, f"{at}.tune.default", f"missing meta-parameter '{m}'")
    reset = list(t.reset_to_zero if t.reset_to_zero is not None else (autotune.reset_to_zero if autotune else []))
    restore = list(t.restore_value if t.restore_value is not None else (autotune.restore_value if autotune else []))
    for field_name, listed in (("reset-to-zero", reset), ("restore-value", restore)):
        for pname in listed:
            if not dict(params).get(pname, "").startswith(("*", UNTYPED)):
                raise _error(loaded, f"{at}.tune.{field_name}", f"'{pname}' is not a pointer parameter of {func}")
    plan = KernelPlan(name, k, func, path, path.stem, params, axes, type_args, spec_params, key, space,
                      meta_names, constraints, t.default and {**meta_defaults, **t.default}, heuristic_names,
                      defaults, autotune, reset, restore,
                      launches, writes=ks.all_writes, do_not_specialize=frozenset(dns),
                      writes_when=tuple((f, ks.with_writes_through(w, [True] * len(ks.writes_through)))
                                        for f, w in ks.writes_when),
                      pointer_ints=pointer_ints,
                      pruner_meta=meta_names[len(declared_meta):], meta_defaults=meta_defaults)
    if by_heuristic:
        plan.notes.append(f"{at}: @triton.autotune's key names {', '.join(by_heuristic)}, which @triton.heuristics "
                          "computes: rows are keyed by the rest, each row has a binary per value, one config serves "
                          "them (Triton's autotuner would tune each value)")
    if by_value:
        plan.notes.append(_unkeyed_note(at, by_value, dict(params)))
    if unknown_key:
        plan.notes.append(f"{at}: @triton.autotune's key names {', '.join(unknown_key)}, which {func} has no "
                          "parameter of: left out of the key, as Triton's autotuner leaves it")
    if amd_options:
        plan.notes.append(f"{at}: configs set {', '.join(amd_options)}, compile options of Triton's AMD backend: gfx "
                          "targets' binaries are compiled with them, CUDA targets' without (Triton's CUDA backend "
                          "refuses them)")
    if own_tuner:
        plan.notes.append(f"{at}: the decorator at line {ks.autotune_line} is not Triton's autotuner: its configs"
                          f"{'' if k.key else ' and key'} are not read; the manifest's tune space"
                          f"{' and key' if k.key else ''} stand in (the wheel launches the table's configs)")
    if k.refine and t.inputs is None:
        plan.notes.append(f"{at}.refine: only forge-aot tune fills the rows it adds (it needs tune.inputs); "
                          "without it they take the default rule like their neighbours")
    _check_launch_sites(loaded, plan, src)
    return plan


def _unshipped_imports(root: Path, imported: dict[str, str | None], shipped: dict[str, LocalModule],
                       bound: set[Path]) -> list[str]:
    """The project's modules host code imported by a name made at run time (``imported``: FLA's ``dispatch`` runs
    ``importlib.import_module(f"fla.ops.{operation}.backends")``) that the wheel does not ship (``bound``: the files
    of its host modules): its host code would fail on them with ModuleNotFoundError."""
    out = []
    top = root.resolve()
    kept = bound | {lm.path.resolve() for lm in shipped.values()}
    for name, file in sorted(imported.items()):
        if not file or not os.path.isabs(file) or name in shipped or name.startswith(("_forge_trace_", "forge_aot")):
            continue
        path = Path(file).resolve()
        if path in kept or top not in path.parents or any(part.startswith(".") or part == "site-packages"
                                                          for part in path.relative_to(top).parts):
            continue
        if path.name == "__init__.py" and any(path.parent in k.parents for k in kept):
            continue  # a package of a file it ships
        out.append(f"{os.path.relpath(path, top)}: host code imported {name} by importlib.import_module, a name "
                   "the build cannot read: the wheel does not ship it, so its host code raises ModuleNotFoundError "
                   "there; import it with an import statement in a file the wheel ships")
    return out


def _data_files(loaded: mf.LoadedManifest, modules: dict[str, dict[str, Any]],
                files_read: set[str], local_dirs: set[Path]) -> dict[str, str]:
    """Data files the wheel carries (its path under the package -> the project file): what host code read while
    traced and what ``project.package-data`` lists, each where host code looks for it relative to its module's
    ``__file__``: beside a kernel file it lands beside that file's host module (``_ops/``), elsewhere in the project
    beside the shipped project modules (``_ops/_local/``). One under a kernel file's folder that is also under a
    shipped project module's (``local_dirs``: lightllm's ``common/kernel_config.py`` reads
    ``common/all_kernel_configs/`` beside its kernel files) lands in both places: the build does not know which
    module read it. Files outside the project (torch's, the system's) and Python sources are not data."""
    root = loaded.root.resolve()
    kernel_dirs = sorted({Path(mod["path"]).resolve().parent for mod in modules.values()},
                         key=lambda d: -len(d.parts))
    listed = {str(f.resolve()) for pattern in loaded.manifest.project.package_data
              for f in sorted(loaded.root.glob(pattern)) if f.is_file()}
    out: dict[str, str] = {}
    for name in sorted(files_read | listed):
        path = Path(name)
        if path.suffix in (".py", ".pyc") or path == loaded.path.resolve() or not path.is_file():
            continue
        home = next((d for d in kernel_dirs if path.is_relative_to(d)), None)
        places = ["_ops/" + path.relative_to(home).as_posix()] if home is not None else []
        if path.is_relative_to(root) and (home is None or any(path.is_relative_to(d) for d in local_dirs)):
            places.append("_ops/_local/" + path.relative_to(root).as_posix())
        for shipped in places:
            if shipped in out and out[shipped] != name:
                raise SourceError(f"{name} and {out[shipped]} would both be shipped as {shipped} (kernel files in "
                                  "different folders read data files of the same name)")
            out[shipped] = name
    return out


def _check_launch_sites(loaded: mf.LoadedManifest, kp: KernelPlan, src: SourceFile) -> None:
    """Refuse, before anything is built, launches the wheel could not serve."""
    names = {n for n, _ in kp.params}
    for s in kp.launches:
        where = f"{s.path or src.path}:{s.line}"
        for kw in s.keywords:
            if kw in kp.meta_names:
                raise SourceError(f"{where}: {s.function}() passes {kw} to {kp.function}, but {kw} is tuned "
                                  f"(kernels.{kp.name}.tune); remove it from the tuning space so the call chooses it")
            if kw in LAUNCH_OPTIONS or kw in rt.LAUNCH_FLAGS or kw in names:
                continue
            accepted = ", ".join([*(n for n, _ in kp.params), *LAUNCH_OPTIONS, *rt.LAUNCH_FLAGS])
            raise SourceError(f"{where}: {s.function}() passes {kw}= to {kp.function}, which has no such parameter "
                              f"or launch option (accepted: {accepted})")


def _listed_rows(k: mf.KernelEntry, key: list[str]) -> list[tuple[int, ...]]:
    if not key:
        return [()]
    if k.shapes:
        return [tuple(int(p[name]) for name in key) for p in k.shapes]
    if k.buckets:
        return [tuple(combo) for combo in itertools.product(*[k.buckets[name] for name in key])]
    return []


def _rows(k: mf.KernelEntry, key: list[str]) -> tuple[list[tuple[int, ...]], set[tuple[int, ...]]]:
    """The table rows the manifest gives (its shapes or buckets, and the rows ``refine`` adds) and which of them
    ``refine`` added (a row it adds that no config or derive expression can serve is left out, not an error)."""
    listed = _listed_rows(k, key)
    rows = refine_rows(listed, k.refine)
    return rows, set(rows) - set(listed)


def _midpoint(a: int, b: int) -> int:
    """The geometric mean of two key values, rounded to the largest power of two up to 16 that divides both: a
    row keeps the alignment its ends share (1000 and 1536 give 1240, not 1239: a kernel whose rows of K
    elements must be 16-byte aligned, like TMA's, could not run at 1239)."""
    if a == b:
        return a
    common = math.gcd(a, b)  # gcd(0, b) is b
    step = min(16, common & -common) if common else 1
    return max(step, round(math.sqrt(max(a, 1) * max(b, 1)) / step) * step)  # 0 counts as 1, as in rank_rows


def refine_rows(rows: list[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
    """``rows`` in their order, then for each row the midpoints to its ``n`` nearest other rows (the runtime's
    ``rank_rows`` order), each once (see ``KernelEntry.refine``)."""
    if n <= 0 or len(rows) < 2:
        return rows
    listed = list(dict.fromkeys(rows))
    out, seen = list(listed), set(listed)
    ordered = sorted(listed)  # ties in rank_rows go to table order: the manifest's order must not decide
    for row in ordered:
        others = [r for r in ordered if r != row]
        for i in rank_rows(others, row)[:n]:
            mid = tuple(_midpoint(a, b) for a, b in zip(row, others[i]))
            if mid not in seen:
                seen.add(mid)
                out.append(mid)
    return out


def _variants(loaded: mf.LoadedManifest, kp: KernelPlan, traced: list[TracedCall], rows: list[tuple[int, ...]],
              added: set[tuple[int, ...]]) -> dict[tuple[Any, ...], tuple[dict[str, Any], set[tuple[int, ...]]]]:
    """Variant axis values → (assignment, table keys): from the manifest's lists (its ``rows``, ``added`` the
    ones refine added), derived values per row and traced calls, so only what the rows reach is built."""
    k = kp.entry
    at = f"kernels.{kp.name}"
    call_axes = [a for a in kp.axes if a not in k.dtypes]
    derived = {n: Expression(text) for n, text in k.derive.items()}
    listed = {*k.constexprs, *k.derive, *(n for c in k.combinations for n in c)}
    traced_names = set(call_axes) if traced else set()
    defaults: dict[str, Any] = {}
    for a in call_axes:
        if a in listed:
            continue
        if a in kp.constexpr_defaults:
            defaults[a] = kp.constexpr_defaults[a]
        elif a not in traced_names:
            sites = [f"{s.function}() {'in ' + Path(s.path).name + ' ' if s.path else ''}line {s.line}"
                     for s in kp.launches if a in s.keywords]
            raise _error(loaded, f"{at}.constexprs",
                         f"{'launch option' if a in LAUNCH_OPTIONS else 'constexpr parameter'} '{a}' of "
                         f"{kp.function} is chosen at the call site{' (' + ', '.join(sites) + ')' if sites else ''}"
                         + (f", and no call of the examples ({k.examples}) launched it" if k.examples else "")
                         + ": give its values under constexprs, derive or combinations, or "
                         + ("examples that reach the launch" if k.examples else "name an examples function"))
    out: dict[tuple[Any, ...], tuple[dict[str, Any], set[tuple[int, ...]]]] = {}

    def add(assignment: dict[str, Any], keys: set[tuple[int, ...]]) -> None:
        values = tuple(assignment[a] for a in kp.axes)
        entry = out.setdefault(values, ({a: assignment[a] for a in kp.axes}, set()))
        entry[1].update(keys)

    # The manifest decides every call-site value (lists, derive, defaults): its variants, with the traced keys
    # as rows too. Otherwise the traced calls alone say which variants exist.
    from_manifest = set(call_axes) <= listed | set(defaults)
    if traced and from_manifest:
        rows = sorted({*rows, *(c.key for c in traced)})
    if from_manifest:
        product_names = list(k.constexprs)
        combos = k.combinations or ({},)
        for dts in itertools.product(*[k.dtypes[tv] for tv in kp.axes if tv in k.dtypes]):
            base = dict(zip([tv for tv in kp.axes if tv in k.dtypes], dts))
            for vals in itertools.product(*[k.constexprs[n] for n in product_names]):
                for combo in combos:
                    given = {**base, **defaults, **dict(zip(product_names, vals)), **combo}
                    if not derived:
                        add(given, set(rows))
                        continue
                    for row in rows:
                        env = {**given, **dict(zip(kp.key, row))}
                        try:
                            for n, expr in derived.items():
                                failing = n
                                env[n] = expr.value(env)
                        except Exception as exc:
                            if row in added:
                                continue  # a row refine added that the derive expressions cannot serve
                            raise _error(loaded, f"{at}.derive.{failing}", f"cannot evaluate "
                                         f"{derived[failing].text!r} for {dict(zip(kp.key, row))}: "
                                         f"{type(exc).__name__}: {exc}") from None
                        add({**env, **{a: env[a] for a in call_axes}}, {row})
    dtypes_built = {tv: set(vals) for tv, vals in k.dtypes.items()}
    for call in traced:
        assignment = dict(zip(kp.axes, call.values))
        if any(assignment[tv] not in built for tv, built in dtypes_built.items()):
            continue  # an example in a dtype the manifest does not build
        add(assignment, {call.key})
    return out


def resolve_unset_dtypes(kp: KernelPlan, calls: list[TracedCall],
                         variants: dict[tuple[Any, ...], tuple[dict[str, Any], set[tuple[int, ...]]]],
                         ) -> list[TracedCall]:
    """Traced calls whose type variable has only None tensors (mamba's layer norm without a residual: ``RESIDUAL``
    and ``RESIDUAL_OUT`` both None) go to the variant the runtime picks for them (``Kernel.find_variant``): of the
    variants with the call's other values, the first by id; where there is none, a new one with the type
    variable's first listed dtype. Their dtype changes no code (the binaries take the pointers as None)."""
    known = {variant_id(assignment, kp.axes): assignment for assignment, _ in variants.values()}
    out = []
    for c in calls:
        unset = [a for a, v in zip(kp.axes, c.values) if v is None and a in kp.entry.dtypes]
        if unset:
            fixed = {a: v for a, v in zip(kp.axes, c.values) if a not in unset}
            fits = sorted(vid for vid, a in known.items() if all(a[x] == v for x, v in fixed.items()))
            assignment = known[fits[0]] if fits else {**fixed, **{a: kp.entry.dtypes[a][0] for a in unset}}
            known.setdefault(variant_id(assignment, kp.axes), assignment)
            c = dataclasses.replace(c, values=tuple(assignment[a] for a in kp.axes))
        out.append(c)
    return out


def preferences(kp: KernelPlan, key: tuple[int, ...], assignment: dict[str, Any],
                 tuned: ConfigChoice | None, target: str | None = None) -> list[ConfigChoice]:
    env_key = {**dict(zip(kp.key, key)), **assignment}
    fixed = {a: assignment[a] for a in kp.launch_axes}

    def ok(c: ConfigChoice) -> bool:
        return all(x({**c.env, **env_key}) for x in kp.constraints)

    def fix(c: ConfigChoice) -> ConfigChoice:
        if not fixed:
            return c
        return ConfigChoice(c.meta, int(fixed.get("num_warps", c.num_warps)),
                            int(fixed.get("num_stages", c.num_stages)), fixed.get("maxnreg", c.maxnreg), c.pre_hook)

    prefs: list[ConfigChoice] = []
    if tuned is not None and ok(fix(tuned)):
        prefs.append(fix(tuned))
    if kp.default is not None:
        d = fix(ConfigChoice.from_flat(kp.default, kp.meta_names, fixed))
        if ok(d):
            prefs.append(d)
    space = kp.row_spaces.get((variant_id(assignment, kp.axes), key, target), kp.space)
    prefs += [fix(c) for c in space if ok(fix(c))]
    seen: set[str] = set()
    return [c for c in prefs if not (c.id in seen or seen.add(c.id))]  # type: ignore[func-returns-value]


def _imported_as(modules: dict[str, dict[str, Any]], found: dict[str, dict[str, LocalModule]],
                 texts: dict[str, str]) -> None:
    """Set each host module's ``imported_as``, the project names other code imports its kernel file by
    (``found``: each host module's project imports, from localmods), and ``imports_host``, the host modules its own
    code (``texts``) imports by such a name: bound before it where the build binds them all (rt.imports_first)."""
    host_files = {Path(mod["path"]).resolve(): mod_name for mod_name, mod in modules.items()}
    imported_as: dict[str, set[str]] = {}
    for imports in found.values():
        for name, lm in imports.items():
            host = None if lm.package else host_files.get(lm.path.resolve())
            if host is not None:
                imported_as.setdefault(host, set()).add(name)
    by_name = {name: mod for mod, names in imported_as.items() for name in names}
    for mod_name, mod in modules.items():
        mod.pop("imported_as", None)
        mod.pop("imports_host", None)
        if mod_name in imported_as:
            mod["imported_as"] = sorted(imported_as[mod_name])
        if by_name:
            # an import of a package above such a name too: its __init__ may re-export the file's ops (FLA's
            # ``from fla.ops.utils import chunk_local_cumsum``), so that file is bound before
            imports = direct_imports(Path(mod["path"]), texts[mod_name])
            deps = {m for n in imports for alias, m in by_name.items()
                    if alias == n or alias.startswith(n + ".")} - {mod_name}
            if deps:
                mod["imports_host"] = sorted(deps)


def _imported_launches(m: mf.Manifest, root: Path, sources: dict[Path, SourceFile],
                       local: dict[Path, dict[str, LocalModule]]) -> dict[tuple[Path, str], list[LaunchSite]]:
    """Launches of each kernel in host files other than its own (an op file importing the kernel file's kernels,
    as Liger's fused linear cross entropy does): by (kernel file, kernel function). They choose call-site options
    (``num_warps=``, ``launch_pdl=``) and are checked, as the kernel file's own launches are."""
    functions: dict[Path, set[str]] = {}
    for k in m.kernels.values():
        path, func = mf.kernel_source(root, k)
        functions.setdefault(path, set()).add(func)
    out: dict[tuple[Path, str], list[LaunchSite]] = {}
    texts = {path: (src.host_source, local[path]) for path, src in sources.items()}
    # and the project's helper modules those files import, which may launch the kernels they import in turn
    # (mlstm_kernels: the op file's fwbw.py calls fw.py, whose fw_recurrent.py launches with num_stages=)
    for lm in sorted({lm for mods in local.values() for lm in mods.values()}, key=lambda lm: str(lm.path)):
        helper = lm.path.resolve()
        if not lm.package and helper not in texts and helper not in functions:
            try:
                text = helper.read_text(encoding="utf-8")
                texts[helper] = (text, local_imports(helper, root, text))
            except (OSError, UnicodeDecodeError, SourceError):
                continue
    for path, (text, imports) in texts.items():
        def imported(module: str, name: str, path: Path = path, imports: dict[str, LocalModule] = imports,
                     depth: int = 0) -> tuple[Path, str] | None:
            lm = imports.get(module)
            if lm is None:
                return None
            if lm.package:  # ``from .kernels import add_kernel``: the package __init__ re-exports it (mlstm_kernels)
                found = _reexport(lm, name)
                return imported(found[0], found[1], path, imports, depth + 1) if found and depth < 3 else None
            target = lm.path.resolve()
            return (target, name) if target != path and name in functions.get(target, ()) else None

        try:
            sites = imported_launch_sites(path, text, imported)
        except SyntaxError:
            continue
        for (kernel_file, func), site in sites:
            out.setdefault((kernel_file, func), []).append(dataclasses.replace(site, kernel=func))
    return out


def _reexport(package: LocalModule, name: str) -> tuple[str, str] | None:
    """Where a package's ``__init__`` takes ``name`` from (``from .add import add_kernel``): (module, its name there),
    None where it does not import it by name."""
    import ast

    from .localmods import import_from_target

    try:
        tree = ast.parse(package.path.read_text(encoding="utf-8")) if package.path.is_file() else None
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                target = import_from_target(node, package)
                if (alias.asname or alias.name) == name and target:
                    return target, alias.name
    return None


def _names_taken_from_sources(sources: dict[Path, SourceFile],
                              local: dict[Path, dict[str, LocalModule]]) -> dict[Path, dict[str, set[Path]]]:
    """Per kernel or op file, the names another such file imports from it by name (``from .ce import
    cross_entropy_backward``: an ``[ops.NAME]`` file's autograd backward calling a kernel file's launcher), with the
    files importing each, so the launches those reach are checked too. Only the files' own imports count (not a package
    ``__init__``'s re-exports: flash-linear-attention's ``fla.ops.utils`` exports every cumsum launcher, most of which
    no op reaches), and not ``import *``."""
    import ast

    from .localmods import file_module, import_from_target

    out: dict[Path, dict[str, set[Path]]] = {}
    for path, src in sources.items():
        module = file_module(path)
        for node in ast.walk(ast.parse(src.host_source)):
            target = import_from_target(node, module) if isinstance(node, ast.ImportFrom) else None
            lm = local.get(path, {}).get(target) if target else None
            if lm is None or lm.package or lm.path.resolve() == path or lm.path.resolve() not in sources:
                continue
            names = out.setdefault(lm.path.resolve(), {})
            for alias in node.names:  # type: ignore[union-attr]
                if alias.name != "*":
                    names.setdefault(alias.name, set()).add(path)
    return out


def _helpers_ask_device(found: dict[str, LocalModule]) -> bool:
    """Whether a project module a kernel file imports asks about the device (as FLA's ``utils`` does at import:
    ``is_nvidia_hopper = ... torch.cuda.get_device_capability()[0] >= 9``)."""
    import ast

    for lm in found.values():
        try:
            if lm.path.is_file() and asks_device(ast.parse(lm.path.read_text(encoding="utf-8"))):
                return True
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue  # the build reports an unreadable helper where it ships it
    return False


def host_module_names(root: Path, paths: Iterable[Path]) -> dict[Path, str]:
    """Each host file's module name (``<package>._ops.<name>`` in the wheel): its stem, or where several files share
    a stem, the shortest tail of its path that tells it apart, joined by ``_`` (flash-attn has
    ``ops/triton/rotary.py`` and ``layers/rotary.py``: ``triton_rotary`` and ``layers_rotary``)."""
    def parts(path: Path) -> list[str]:
        rel = path.relative_to(root) if path.is_relative_to(root) else Path(*path.parts[1:])
        return [re.sub(r"\W", "_", p) for p in (*rel.parent.parts, path.stem)]

    by_stem: dict[str, list[Path]] = {}
    for path in sorted(set(paths)):
        by_stem.setdefault(path.stem, []).append(path)
    names = {group[0]: stem for stem, group in by_stem.items() if len(group) == 1}
    for group in (g for g in by_stem.values() if len(g) > 1):
        longest = max(len(parts(p)) for p in group)
        for path in group:
            own = parts(path)
            tail = next(n for n in range(1, longest + 1) if all(parts(o)[-n:] != own[-n:] for o in group if o != path))
            name = "_".join(own[-tail:])
            # a tail named like another file (triton_rotary.py beside them): the whole path
            names[path] = name if name not in by_stem else "_".join(own)
    return names


def make_plan(loaded: mf.LoadedManifest, targets: list[str] | None = None) -> BuildPlan:
    """Resolve sources, variants, tables and config preferences. Compiles nothing; imports a kernel file only
    to read its ``@triton.autotune`` / ``@triton.heuristics``, and runs host code only for examples."""
    from .trace import Tracer

    m = loaded.manifest
    root = loaded.root
    chosen = list(targets) if targets else list(m.project.targets)
    for t in chosen:
        if t not in TARGETS:
            raise ManifestError(f"unknown target '{t}' (accepted: {', '.join(TARGETS)})", key_path="--target",
                                suggestion=close_match(t, TARGETS))
    first = TARGETS[chosen[0]]
    os.environ.setdefault(IMPORT_TARGET_ENV, f"{first.backend}:{first.arch}:{first.warp_size}")
    forget_projects()
    make_importable(root)
    # Each file's entry points: its ops, and the host functions the manifest names for the build (examples,
    # autograd, tuning). They and what they reach are host code: one that reaches Triton is reported at its line
    # (not left out with the kernel side, to be missed as "no host function").
    ops_by_file: dict[Path, set[str]] = {}
    for k in m.kernels.values():
        own = ops_by_file.setdefault(mf.kernel_source(root, k)[0], set())
        own.update(k.ops, (f for ag in k.autograd.values() for f in (ag.setup_context, ag.backward)),
                   (f for f in (k.tune.inputs, k.tune.reference, k.tune.prune, k.tune.op) if f is not None))
        if k.examples is not None and ":" not in k.examples:
            own.add(k.examples)
    for op_name, o in m.ops.items():
        ops_by_file.setdefault((root / o.source).resolve(), set()).update(
            (o.function or op_name, o.examples) if o.examples is not None else (o.function or op_name,),
            (o.autograd.setup_context, o.autograd.backward) if o.autograd is not None else ())
    for file in m.exports.values():
        ops_by_file.setdefault((root / file).resolve(), set())
    # another file's examples: a kernel or op file's, or a file of examples of its own (lightllm's hunt examples,
    # SGLang's), a host module of no op, shipped without its examples (a missing file is refused below)
    for text in [k.examples for k in m.kernels.values()] + [o.examples for o in m.ops.values()]:
        efile, _, fn_name = (text or "").rpartition(":")
        if efile and (root / efile).resolve().is_file():
            ops_by_file.setdefault((root / efile).resolve(), set()).add(fn_name)
    sources: dict[Path, SourceFile] = {}
    local: dict[Path, dict[str, LocalModule]] = {}
    packages: dict[Path, str | None] = {}
    kernels: dict[str, KernelPlan] = {}
    modules: dict[str, dict[str, Any]] = {}
    module_names = host_module_names(root, ops_by_file)

    def host_module(path: Path, needs_kernels: bool = True) -> dict[str, Any]:
        """The host module of a kernel (or op) file, its source parsed once."""
        if path not in sources:
            sources[path] = parse_source(path, ops_by_file[path], wrappers=frozenset(m.project.launch_wrappers),
                                         needs_kernels=needs_kernels)
            local[path] = local_imports(path, root)
            for helper in local[path]:  # imported afresh: an earlier plan in this process may have read older text
                sys.modules.pop(helper, None)
            packages[path] = make_kernel_importable(path)
        return modules.setdefault(module_names[path], {"path": str(path), "kernels": [], "ops": [], "examples": set(),
                                              "build_only": set(), "source": sources[path], "package": packages[path]})

    kernel_paths = {mf.kernel_source(root, k)[0] for k in m.kernels.values()}
    foreign_examples: list[tuple[str, str]] = []
    for path in ops_by_file:  # every host file parsed first: launches of imported kernels count for them too
        host_module(path, needs_kernels=path in kernel_paths)
    foreign = _imported_launches(m, root, sources, local)
    for name, k in m.kernels.items():
        path, func = mf.kernel_source(root, k)
        file = k.source.rpartition(":")[0]
        mod = host_module(path)
        src = sources[path]
        kp = _kernel_plan(loaded, name, k, src, func, path, foreign.get((path, func), []))
        kp.module = module_names[path]
        kp.local_modules = local[path]
        kernels[name] = kp
        mod["kernels"].append(func)
        for i, op in enumerate(k.ops):
            if op not in src.host_functions:
                raise _error(loaded, f"kernels.{name}.ops[{i}]", f"no host function '{op}' in {file}",
                             close_match(op, src.host_functions))
            _no_class_op(loaded, f"kernels.{name}.ops[{i}]", src, op)
            if op not in mod["ops"]:
                mod["ops"].append(op)
        if k.examples is not None and ":" in k.examples:  # another file's, once every file of the package is read
            foreign_examples.append((f"kernels.{name}.examples", k.examples))
        elif k.examples is not None:
            if k.examples not in src.host_functions:
                raise _error(loaded, f"kernels.{name}.examples", f"no host function '{k.examples}' in {file}",
                             close_match(k.examples, src.host_functions))
            mod["examples"].add(k.examples)
        for op, ag in k.autograd.items():
            for key, fn_name in (("setup-context", ag.setup_context), ("backward", ag.backward)):
                if fn_name not in src.host_functions:
                    raise _error(loaded, f"kernels.{name}.autograd.{op}.{key}",
                                 f"no host function '{fn_name}' in {file}", close_match(fn_name, src.host_functions))
            mod.setdefault("autograd", {})[op] = [ag.setup_context, ag.backward]
        t = k.tune
        if t.inputs is not None and t.op is None and not k.ops:
            raise _error(loaded, f"kernels.{name}.tune.op", f"{func} has no ops: name the host function that "
                         "launches it on the tuning inputs (for a backward kernel, one that runs forward and backward)")
        for field_name in ("inputs", "reference", "prune", "op"):
            fn_name = getattr(t, field_name)
            if fn_name is None:
                continue
            if fn_name not in src.host_functions:
                raise _error(loaded, f"kernels.{name}.tune.{field_name}", f"no host function '{fn_name}' in {file}",
                             close_match(fn_name, src.host_functions))
            if field_name != "op" or fn_name not in k.ops:
                mod["build_only"].add(fn_name)
    for op_name, o in m.ops.items():  # ops of files with no kernel entry: they launch other files' kernels
        path = (root / o.source).resolve()
        mod = host_module(path, needs_kernels=path in kernel_paths)
        src = sources[path]
        function = o.function or op_name
        foreign = o.examples is not None and ":" in o.examples
        if foreign:  # another file's (lightllm's flash decoding driver, exercised from a file of examples)
            foreign_examples.append((f"ops.{op_name}.examples", o.examples))
        for field_name, fn_name in (("function" if o.function else "source", function),
                                    ("examples", None if foreign else o.examples),
                                    ("autograd.setup-context", o.autograd and o.autograd.setup_context),
                                    ("autograd.backward", o.autograd and o.autograd.backward)):
            if fn_name is not None and fn_name not in src.host_functions:
                raise _error(loaded, f"ops.{op_name}.{field_name}", f"no host function '{fn_name}' in {o.source}",
                             close_match(fn_name, src.host_functions))
        if o.autograd is not None:
            mod.setdefault("autograd", {})[function] = [o.autograd.setup_context, o.autograd.backward]
        _no_class_op(loaded, f"ops.{op_name}", src, function)
        mod["ops"].append(function)
        if o.function is not None:  # exported under the entry's name (the index's ``export_as``)
            mod.setdefault("export_as", {})[function] = op_name
        if o.examples is not None and not foreign:
            mod["examples"].add(o.examples)
    for key_path, text in foreign_examples:  # the examples of another kernel or op file, whose host code calls it
        efile, _, fn_name = text.rpartition(":")
        epath = (root / efile).resolve()
        if epath not in sources:
            raise _error(loaded, key_path, f"{efile} is no file of the project (name the examples function of a "
                         "file whose host code calls the ops, or of a file of examples)")
        if fn_name not in sources[epath].host_functions:
            raise _error(loaded, key_path, f"no host function '{fn_name}' in {efile}",
                         close_match(fn_name, sources[epath].host_functions))
        modules[module_names[epath]]["examples"].add(fn_name)
    for name, file in m.exports.items():  # classes and functions exported as they are (a library's nn.Modules)
        path = (root / file).resolve()
        mod = host_module(path, needs_kernels=path in kernel_paths)
        if name not in sources[path].host_functions:
            raise _error(loaded, f"exports.{name}", f"no host class or function '{name}' in {file}",
                         close_match(name, sources[path].host_functions))
        mod.setdefault("exports", []).append(name)
    taken = _names_taken_from_sources(sources, local)
    warnings: list[str] = []
    unlisted: list[str] = []  # (all of them at once: FBGEMM's matmul_fp8_row launches four)
    for path, src in sources.items():
        declared = {kp.function for kp in kernels.values() if kp.source == path}
        exported = {op for kp in kernels.values() if kp.source == path for op in kp.entry.ops} \
            | set(modules[module_names[path]].get("exports", ()))
        shipped = src.reachable(exported)  # the ops and the helpers they call
        importers = taken.get(path, {})
        imported = src.reachable(set(importers)) - shipped
        for fn, refs in sorted(src.kernel_refs.items()):
            for kern in sorted(refs - declared):
                sites = [s for s in src.launches if s.function == fn and s.kernel == kern]
                if fn in exported and (not sites or not all(s.conditional for s in sites)):
                    # an op's own launch on its main path; one in a branch is warned about below (FBGEMM's
                    # matmul_fp8_row launches its TMA kernels where tma_persistent: a Triton of their own)
                    unlisted.append(f"{path}: host function '{fn}' launches '{kern}', which has no entry in "
                                    f"{loaded.path.name}")
                    continue
                if fn in shipped:  # a helper the ops reach, or an op's branch; a traced call launching it is refused
                    # (its stand-in raises), here none did (SGLang's decode_attention_fwd -> its ROCm-only lean
                    # attention)
                    who = "an op of the package, launches" if fn in exported else \
                        "which the package's ops reach, launches"
                    warnings.append(f"{os.path.relpath(path, root)}: host function '{fn}', {who} '{kern}'"
                                    f"{' in a branch' if fn in exported else ''}, which has no entry in "
                                    f"{loaded.path.name}, and no "
                                    "traced call launched it (a branch for another GPU, say): a call of the wheel's "
                                    "ops that reaches it raises ForgeRuntimeError; give the kernel an entry to "
                                    "package it")
                elif fn in imported:  # another file's op may reach it (an autograd backward): maybe never called
                    # who imports it, or a function reaching it (SGLang's examples import decode_attention_fwd)
                    through: dict[str, set[str]] = {}
                    for name in importers:
                        if fn in src.reachable({name}):
                            for f in importers[name]:
                                through.setdefault(os.path.relpath(f, root), set()).add(name)
                    who = "; ".join(f"{f} imports" if fn in names else f"{f} reaches through "
                                    f"{', '.join(sorted(names))}, which it imports" for f, names in sorted(
                                        through.items()))
                    warnings.append(f"{os.path.relpath(path, root)}: host function '{fn}', which {who}, "
                                    f"launches '{kern}', which has no entry in "
                                    f"{loaded.path.name}: a call of the wheel's ops that reaches it (a backward, "
                                    "say) raises ForgeRuntimeError; give the kernel an entry to package it")
    if unlisted:
        raise SourceError("\n".join(unlisted))
    # Kernel files that other host code imports by project name: the tracer binds them under that name too.
    _imported_as(modules, {m: local[Path(mod["path"])] for m, mod in modules.items()},
                 {m: mod["source"].host_source for m, mod in modules.items()})
    # Host code that asks about the device (the tutorial softmax's num_stages from its shared memory, FLA's
    # is_nvidia_hopper, the persistent matmul's SM count) may launch differently per target and GPU model: traced
    # once per (target, model) of project.trace-gpus, each call tagged with its target.
    reads_device = {n for n, kp in kernels.items()
                    if modules[kp.module]["source"].reads_device or _helpers_ask_device(kp.local_modules)}
    gpus = trace_gpus(chosen, m.project.trace_gpus)  # (target, GPU model), the first target's first
    per_target = len(gpus) > 1 and bool(reads_device)
    tracer = Tracer(kernels, modules, gpus[0][0], per_target, gpus[0][1], str(root))
    traced = tracer.run_examples(modules)
    warnings += tracer.output_reads.warnings(str(root))
    _function_constexprs(kernels, traced, tracer.functions, loaded.root)
    imported_by_host = dict(tracer.imported)
    files_read = set(tracer.files_read)
    if per_target:
        traced = {n: calls if n in reads_device else [dataclasses.replace(c, target=None) for c in calls]
                  for n, calls in traced.items()}
        # The other GPUs run only the host modules whose kernels ask, those importing them (whose examples may be
        # the ones reaching them: lmdeploy's Hopper-only MoE kernels, called from an examples file of the user's),
        # and the modules their own code imports.
        asking = {kernels[n].module for n in reads_device}
        importers = [m for m, mod in modules.items() if mod.get("imports_host")]
        while grown := {m for m in importers if m not in asking and asking & set(modules[m]["imports_host"])}:
            asking |= grown
        todo = list(asking)
        while todo:
            for dep in modules[todo.pop()].get("imports_host", ()):
                if dep not in asking:
                    asking.add(dep)
                    todo.append(dep)
        subset = {m: mod for m, mod in modules.items() if m in asking}
        for target, model in gpus[1:]:
            other = Tracer(kernels, subset, target, True, model, str(root))
            more = other.run_examples(subset)
            warnings += [w for w in other.output_reads.warnings(str(root)) if w not in warnings]
            _function_constexprs(kernels, more, other.functions, loaded.root)
            for name, calls in more.items():
                if name in reads_device:
                    traced.setdefault(name, []).extend(calls)
            files_read |= other.files_read
            imported_by_host.update(other.imported)
    for name, kp in kernels.items():
        infer_signature(loaded, kp, traced.get(name, []))
        _writes_through_functions(kp, modules[kp.module]["source"].kernels.get(kp.function), traced.get(name, []),
                                  loaded.root)
        kp.notes += _state_reading_heuristics(kp) + _launched_by_examples_only(kp, modules, root)
    optional_scalars(kernels, traced)
    for mod in modules.values():
        for op, mutated in mod["source"].mutating_ops.items():
            # a @triton_op that declares what it writes: a mutating custom op where the traced schema marks those
            # arguments written too (the kernels' stores reach them), else plain calls only
            if op in mod["schemas"] and not _declared_writes_marked(mod["schemas"][op], mutated):
                mod["schemas"][op] = None
                mod["schema_notes"][op] = f"its @triton_op writes {mutated} (mutates_args), and the traced launches " \
                                          "do not show its kernels writing those arguments"
    for mod_name, mod in sorted(modules.items()):
        for op in sorted(mod.get("autograd", {})):
            if not mod["schemas"].get(op) or op in mod.get("buffers", {}):
                kernel = next((f"kernels.{n}.autograd.{op}" for n, kp in kernels.items()
                               if kp.module == mod_name and op in kp.entry.ops), None) or \
                    next(f"ops.{n}.autograd" for n, o in m.ops.items() if (o.function or n) == op)
                left = [b[0] for b in mod.get("buffers", {}).get(op, ())]
                why = f"has no torch.library schema ({mod['schema_notes'][op]}): give it type annotations so it " \
                    "can be a custom op" if not mod["schemas"].get(op) else \
                    f"leaves argument{'s' if len(left) > 1 else ''} {' and '.join(left)} out of its schema (None in " \
                    "every traced call), so its setup_context would see other inputs than the host code takes: a " \
                    "backward for such an op is not supported"
                raise _error(loaded, kernel, f"op '{op}' {why}")
    for mod in modules.values():
        src = mod.pop("source")
        # (an exported examples function ships: the package names it, ``[exports] examples = "ex.py"``)
        mod["host_source"] = src.shipped_source((mod.pop("examples") | mod.pop("build_only"))
                                                - set(mod["ops"]) - set(mod.get("exports", ())))
        mod["full_host_source"] = src.host_source  # with the build-only functions (tuning inputs, references)
    # The project modules the shipped host code imports (the whole file's imports, build-only functions included,
    # are the code hash's business): their host code (Triton lines blanked, as for kernel files; what host code
    # takes from them must be host code), shipped under <package>/_ops/_local/ (a namespace package becomes an
    # empty one).
    runs = {Path(mod["path"]): local_imports(Path(mod["path"]), root, mod["host_source"]) for mod in modules.values()}
    shipped = merge_local({str(p): found for p, found in runs.items()})
    # A kernel file that project code imports (a package __init__ re-exporting its op, one op's host code calling
    # another's) is not shipped twice: that name is its bound host module (with its kernel handles) at run time,
    # never a second copy whose kernels are blanked.
    _imported_as(modules, {m: runs[Path(mod["path"])] for m, mod in modules.items()},
                 {m: mod["host_source"] for m, mod in modules.items()})
    aliased = {name for mod in modules.values() for name in mod.get("imported_as", ())}
    texts = {name: (None, False) if name in aliased else
             (parse_source(lm.path, None if lm.used is None else set(lm.used), helper=True,
                           wrappers=frozenset(m.project.launch_wrappers)).host_source
              if lm.path.is_file() else "", lm.package) for name, lm in sorted(shipped.items())}
    # Ops shipped code defines with ``Library("ns", ...)``: in the package's own namespace, in every file it ships.
    namespaces = library_namespaces([mod["host_source"] for mod in modules.values()]
                                    + [text for text, _ in texts.values() if text])
    for mod in modules.values():
        mod["host_source"] = rename_library_namespaces(mod["host_source"], namespaces)
    texts = {name: (text and rename_library_namespaces(text, namespaces), package)
             for name, (text, package) in texts.items()}
    for mod in modules.values():
        mod["local_sources"] = {name: texts[name] for name in sorted(runs[Path(mod["path"])])}
    warnings += _unshipped_imports(root, imported_by_host, shipped,
                                   {Path(mod["path"]).resolve() for mod in modules.values()})
    data_files = _data_files(loaded, modules, files_read,
                             {lm.path.resolve().parent for name, lm in shipped.items() if name not in aliased})
    entries: list[EntryPlan] = []
    for name, kp in kernels.items():
        calls = traced.get(name, [])
        manifest_rows, refined = _rows(kp.entry, kp.key)
        variants = _variants(loaded, kp, calls, manifest_rows, refined)
        if any(v is None for c in calls for v in c.values):
            calls = resolve_unset_dtypes(kp, calls, variants)
            variants = _variants(loaded, kp, calls, manifest_rows, refined)
        if not variants:
            raise _error(loaded, f"kernels.{name}", f"no build of {kp.function} is reached: its examples never "
                         "launch it in a built dtype")
        calls_by_variant: dict[tuple[Any, ...], dict[tuple[int, ...], list[TracedCall]]] = {}
        for c in calls:
            calls_by_variant.setdefault(c.values, {}).setdefault(c.key, []).append(c)
        for values, (assignment, keys) in variants.items():
            vid = variant_id(assignment, kp.axes)
            rows = sorted(keys)
            variant_calls = calls_by_variant.setdefault(values, {})
            if kp.entry.tune.inputs is not None:
                # The tuning inputs say which specializations each row really needs (as examples do).
                for key in rows:
                    for c in tracer.trace_inputs(kp, assignment, key,
                                                 functools.partial(resolve_unset_dtypes, kp, variants=variants)):
                        c = respecialize(kp, c)
                        if kp.heuristics or all(c.spec != o.spec for o in variant_calls.get(key, [])):
                            variant_calls.setdefault(key, []).append(c)
            targets = [t for t in chosen if not kp.entry.targets or t in kp.entry.targets]
            if early_prune_hook(kp):
                _prune_rows(loaded, kp, vid, rows, variant_calls, targets)
            seen_on = {c.target for key_calls in variant_calls.values() for c in key_calls}
            for target in targets:
                if None not in seen_on and seen_on and target not in seen_on:
                    continue  # traced per target, and only other targets' host code launches this variant
                entry = EntryPlan(name, vid, assignment, target, calls=variant_calls)
                table = []
                for key in rows:
                    prefs = preferences(kp, key, assignment, None, target)
                    if not prefs and key in refined:
                        continue  # a row refine added that no config serves: left out
                    if not prefs:
                        raise _error(loaded, f"kernels.{name}.tune.constraints", f"no config of the tuning "
                                     f"space satisfies the constraints for {dict(zip(kp.key, key))} [{vid}]")
                    table.append(TableRow(key, prefs))
                entry.tables["default"] = table
                entry.table_sources["default"] = "manifest default"
                entries.append(entry)
    for kp in kernels.values():
        if kp.row_spaces:  # configs a hook made are configs of the space (tuning records name them); the
            # decorator's lack what only the hook sets, where some such constexpr has no default
            made = [c for configs in kp.row_spaces.values() for c in configs]
            incomplete = any(n not in kp.meta_defaults for n in kp.pruner_meta)
            kp.space = list({c.id: c for c in [*([] if incomplete else kp.space), *made]}.values())
    plan = BuildPlan(loaded, chosen, kernels, entries, modules, data_files=data_files, warnings=warnings)
    for e in entries:  # heuristics that need more than the key fail here, before anything is built
        for rows in e.tables.values():
            for row in rows:
                plan.binaries_for(e, row.key, row.preferences[0])
    return plan


def _prune_rows(loaded: mf.LoadedManifest, kp: KernelPlan, vid: str, rows: list[tuple[int, ...]],
                calls: dict[tuple[int, ...], list[TracedCall]], targets: list[str]) -> None:
    """Run the kernel's ``early_config_prune`` for each row of a variant and each target on the row's first traced
    call (that target's, where calls are traced per target), the hook's questions to the GPU answered as a GPU of
    that target (lmdeploy's MoE hook picks configs by ``torch.cuda.get_device_capability()``):
    ``KernelPlan.row_spaces`` by (variant, key, target). A row no call reaches keeps the whole space, unless the hook
    must set what the configs lack (``pruner_meta``); a hook that fails leaves the rows it failed on unpruned, with a
    note, where the configs can do without it."""
    from .introspect import load_kernel_module
    from .trace import as_target

    module = load_kernel_module(str(kp.source))
    required = [n for n in kp.pruner_meta if n not in kp.meta_defaults]
    reached = [key for key in rows if calls.get(key)]
    for key in rows:
        if key not in reached and required:
            raise _error(loaded, f"kernels.{kp.name}.examples", f"no traced call reaches the row "
                         f"{dict(zip(kp.key, key))} [{vid}] of {kp.function}, so its pruning hook cannot make "
                         f"the configs that set {', '.join(required)}: call the op with such a shape in the "
                         "examples (or the tuning inputs)")
    for target in targets:
        with as_target(target, False):  # (once per target: it patches torch's and Triton's device queries)
            for key in reached:
                call = next((c for c in calls[key] if c.target == target), calls[key][0])
                try:
                    kp.row_spaces[(vid, key, target)], kp.row_pruned[(vid, key, target)] = \
                        early_prune(kp, kp.space, call, module)
                except PruneHookFailed as exc:  # the hook raised; what it returned is never shipped unchecked
                    if required:
                        raise
                    if not any(n.startswith(f"kernels.{kp.name}: ") and n.endswith(" unpruned") for n in kp.notes):
                        kp.notes.append(f"kernels.{kp.name}: {exc}; the rows it fails on take the space unpruned")


def _declared_writes_marked(schema: str | None, mutates_args: str) -> bool:
    """Whether a schema marks written (``Tensor(a!)``) every argument a ``mutates_args`` text names."""
    import ast

    import torch

    try:
        declared = set(ast.literal_eval(mutates_args))
    except (ValueError, SyntaxError, TypeError):
        return False
    if schema is None:
        return False
    marked = {a.name for a in torch._C.parse_schema(f"op{schema}").arguments
              if a.alias_info is not None and a.alias_info.is_write}
    return declared <= marked


def job_for(plan: BuildPlan, entry: EntryPlan, config: ConfigChoice, binary: BinarySpec) -> CompileJob:
    kp = plan.kernels[entry.kernel]
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    divisible = []
    codes = dict(zip(kp.spec_params, binary.spec))
    heur = dict(binary.heur)
    for i, (pname, ty) in enumerate(kp.params):
        if ty == "meta":
            signature[pname] = "constexpr"
            constexprs[pname] = config.meta[pname]
        elif ty == "constexpr":
            signature[pname] = "constexpr"
            constexprs[pname] = entry.assignment[pname]
        elif ty == "heuristic":
            signature[pname] = "constexpr"
            constexprs[pname] = heur[pname]
        elif codes.get(pname) in (SPEC_ONE, SPEC_INT_ONE):
            signature[pname] = "constexpr"
            constexprs[pname] = 1
        elif codes.get(pname) in (SPEC_INT, SPEC_INT_DIV16):  # an integer where the kernel also takes a pointer
            signature[pname] = kp.pointer_ints[pname]
            if codes[pname] == SPEC_INT_DIV16:
                divisible.append(i)
        elif codes.get(pname) == SPEC_ABSENT:
            signature[pname] = "constexpr"
            constexprs[pname] = None
        elif rt.desc_dtype(ty) is not None or codes.get(pname) == SPEC_DESC:
            dtype = rt.desc_dtype(ty) or ty[1:]
            signature[pname] = rt.desc_signature(entry.assignment.get(dtype, dtype), dict(binary.descs)[pname])
        else:
            signature[pname] = _concrete(ty, entry.assignment)
            if codes.get(pname) == SPEC_DIV16 and (ty.startswith("*") or ty in INT_TYPES):
                divisible.append(i)
    # Relative to the manifest: Triton records the source path in the binary's line info, and a path that
    # does not depend on the checkout keeps builds of the same inputs byte-identical on any machine.
    try:
        source = kp.source.relative_to(plan.loaded.root).as_posix()
    except ValueError:
        source = str(kp.source)
    options = tuple((o, entry.assignment[o]) for o in rt.COMPILE_OPTIONS if o in entry.assignment)
    if TARGETS[entry.target].backend == "hip":  # (configs' AMD options, see _kernel_plan)
        params = dict(kp.params)
        options += tuple((o, config.meta[o]) for o in HIP_CONFIG_OPTIONS if o in config.meta and o not in params)
    functions = tuple(sorted((v, *kp.functions[v]) for v in constexprs.values() if isinstance(v, str)
                             and v in kp.functions))
    return CompileJob(entry.kernel, kp.function, source, entry.variant, entry.target, config, binary, signature,
                      constexprs, tuple(divisible), plan.loaded.manifest.project.compile_timeout, options, functions)


def _function_constexprs(kernels: dict[str, KernelPlan], traced: dict[str, list[TracedCall]],
                         known: dict[str, tuple[str, str]], root: Path) -> None:
    """Each kernel's ``functions``: the @triton.jit functions its traced calls pass as constexprs (``known``: the
    tracer's, see ``Tracer.functions``)."""
    for name, calls in traced.items():
        for value in {v for call in calls for v in call.values if isinstance(v, str) and v.startswith("jit:")}:
            if value in known:
                file, function = known[value]
                with contextlib.suppress(ValueError):
                    file = Path(file).resolve().relative_to(root).as_posix()
                kernels[name].functions[value] = (file, function)


def _writes_through_functions(kp: KernelPlan, ks: KernelSource | None, calls: list[TracedCall], root: Path) -> None:
    """What a kernel writes through the function-valued constexprs it calls (SGLang's ``SCORE_MOD(qk, Aux0, ...)``:
    ``KernelSource.writes_through``): of what it hands them, what the functions its traced calls pass write, instead
    of all of it (``KernelSource.all_writes``, until the calls are known)."""
    if ks is None or not ks.writes_through or not calls:  # (no traced call: whatever the function, all of it)
        return

    def resolve(value: Any) -> frozenset[int | str] | None:
        known = kp.functions.get(value) if isinstance(value, str) else None
        return None if known is None else function_writes(root / known[0], known[1])

    through = set().union(*(ks.with_writes_through((), [(c.named or {}).get(p) for p, _ in ks.writes_through],
                                                   resolve) for c in calls))
    kp.writes = tuple(p.name for p in ks.params if p.name in through or p.name in ks.writes)
    kp.writes_when = tuple((flags, tuple(p.name for p in ks.params if p.name in through or p.name in names))
                           for flags, names in ks.writes_when)


PROCESS_STATE = frozenset({"get_float32_matmul_precision", "getenv", "environ", "are_deterministic_algorithms_enabled",
                           "allow_tf32", "get_default_dtype", "is_grad_enabled", "is_inference_mode_enabled"})
"""Names a heuristic reads process-wide settings through (``torch.get_float32_matmul_precision()``, ``os.environ``)."""


def _process_state_names(fn: Any) -> list[str]:
    """The names of ``PROCESS_STATE`` a heuristic's code reads."""
    return sorted(set(getattr(getattr(fn, "__code__", None), "co_names", ())) & PROCESS_STATE)


def _state_reading_heuristics(kp: KernelPlan) -> list[str]:
    """Notes on heuristics that read process-wide settings (Cut Cross-Entropy's ``DOT_PRECISION`` follows
    ``torch.get_float32_matmul_precision()``): the build evaluates them under its own."""
    out = []
    for name, fn in kp.heuristics:
        reads = _process_state_names(fn)
        if reads:
            # (the build evaluates heuristics per config after the trace, not at each traced call: examples
            # calling the ops under another setting do not change what is built)
            out.append(f"kernels.{kp.name}: @triton.heuristics computes {name} from process-wide settings "
                       f"({', '.join(reads)}): the binaries have the values the build process's own settings give; "
                       "a process set otherwise asks for a value no binary has (NotBuiltError)")
    return out


def _launched_by_examples_only(kp: KernelPlan, modules: dict[str, dict[str, Any]], root: Path) -> list[str]:
    """A note where every launch of a kernel with no ops is in an examples (or other build-only) function: nothing
    the wheel's ops and exports run launches it (flashinfer's page kernel, launched from CUDA-side host code that the
    hunt's examples stood in for), and its binaries serve only code that launches the kernel's handle itself."""
    if kp.entry.ops or not kp.launches:
        return []
    build_only = {n for mod in modules.values() for n in (*mod["examples"], *mod["build_only"])}
    if not all(s.function in build_only for s in kp.launches):
        return []
    sites = ", ".join(f"{s.function}(){f' in {os.path.relpath(s.path, root)}' if s.path else ''} line {s.line}"
                      for s in kp.launches)
    return [f"only build-time code launches it ({sites}): no op or export of the package does, so its binaries "
            "serve only code that launches the kernel's handle itself"]


def _optional_per_variant(kp: KernelPlan, entries: list[EntryPlan]) -> list[str]:
    """Arguments every traced call of some variant passes as None and every call of another passes: each is built
    for what its own variant's calls pass (``_none_combinations``), so a call of another combination (lightllm's
    gated RMSNorm with a bias and the ``NORM_BEFORE_GATE`` only traced without one) finds no binary."""
    out = []
    for i, name in enumerate(kp.spec_params):
        kinds = {frozenset(c.spec[i] == SPEC_ABSENT for calls in e.calls.values() for c in calls) for e in entries
                 if any(e.calls.values())}
        if frozenset({True}) in kinds and frozenset({False}) in kinds:
            out.append(name)
    return out


def plan_summary(plan: BuildPlan) -> dict[str, Any]:
    """Per kernel: how the host code launches it, its variants and the binaries the build will compile (first
    choices; a failed config adds its successor's). What ``forge-aot check`` prints."""
    out: dict[str, Any] = {}
    for name, kp in plan.kernels.items():
        entries = [e for e in plan.entries if e.kernel == name]
        binaries = 0
        for e in entries:
            wanted: set[tuple[str, BinarySpec]] = set()
            for rows in e.tables.values():
                for row in rows:
                    c = row.preferences[0]
                    wanted |= {(c.id, b) for b in plan.binaries_for(e, row.key, c)}
            binaries += len(wanted)
        k = kp.entry
        sources = [s for s, on in (("constexprs", k.constexprs), ("derive", k.derive),
                                   ("combinations", k.combinations), ("examples", k.examples)) if on]
        out[name] = {
            "function": kp.function, "decorators": [d for d in ("autotune", "heuristics") if
                                                    (d == "autotune" and kp.autotune) or
                                                    (d == "heuristics" and kp.heuristic_names)],
            "axes": kp.axes, "axis_values_from": sources, "key": kp.key,
            "variants": len({e.variant for e in entries}), "space": len(kp.space),
            "traced_calls": sum(len(v) for e in entries for v in e.calls.values())
            // max(1, len({e.target for e in entries})),  # each target's entries share the variant's calls
            "launches": [{"function": s.qualname or s.function, "line": s.line, "keywords": list(s.keywords),
                          "unknown": s.star_args,
                          **({"file": os.path.relpath(s.path, plan.loaded.root)} if s.path else {})}
                         for s in kp.launches],
            "binaries": binaries,
            "unkeyed_ints": [n for n, ty in kp.params if ty in INT_TYPES and n in kp.spec_params and n not in kp.key],
            "tuning_inputs": kp.entry.tune.inputs,
            "inferred": dict(kp.inferred),
            "optional": sorted({kp.spec_params[i] for e in entries for calls in e.calls.values() for c in calls
                                for i, code in enumerate(c.spec) if code == SPEC_ABSENT},
                               key=kp.spec_params.index),
            "optional_per_variant": _optional_per_variant(kp, entries),
            "writes": kp.written,
            "launch_heuristics": kp.launch_heuristics,
            "data_like_constexprs": data_like_constexprs(kp, entries),
            "size_constexprs": size_constexprs(kp, entries),
            "notes": list(kp.notes),
        }
    return out


def size_constexprs(kp: KernelPlan, entries: list[EntryPlan]) -> dict[str, tuple[str, int, list[int]]]:
    """Call-site constexprs that every traced call sets to one leading size of one tensor argument (lightning
    attention's ``b, h, n, d = q.shape`` passed as ``b: tl.constexpr``..., Liger's RoPE ``bs``, the GIoU post's
    ``BLOCK_SIZE=n_boxes``), with two values or more, or one not a power of two: a binary per size, and a size no
    example passes fails at run time. → (argument, dimension, sorted values). Innermost sizes are left out (a head
    dimension is a constexpr by design: few values per model)."""
    calls = [c for e in entries for row in e.calls.values() for c in row if c.named]
    position = {n: i for i, (n, _) in enumerate(kp.params)}
    out = {}
    for a in _traced_call_site_axes(kp) if calls else ():
        common: set[tuple[str, int]] | None = None
        values = set()
        for c in calls:
            v = c.named.get(a)
            if not isinstance(v, int) or isinstance(v, bool):
                common = set()
                break
            values.add(v)
            found = {(n, d) for n, t in c.named.items() if hasattr(t, "dim") and hasattr(t, "shape")
                     for d in range(t.dim() - 1) if t.shape[d] == v}
            common = found if common is None else common & found
        if common and (len(values) > 1 or any(v <= 0 or v & (v - 1) for v in values)):
            arg, dim = min(common, key=lambda nd: (position.get(nd[0], len(position)), nd[1]))
            out[a] = (arg, dim, sorted(values))
    return out


def _traced_call_site_axes(kp: KernelPlan) -> list[str]:
    """The variant axes whose values only the traced calls give: call-site constexprs the manifest does not list
    (not dtypes, not launch options)."""
    k = kp.entry
    listed = {*k.dtypes, *k.constexprs, *k.derive, *(n for c in k.combinations for n in c), *LAUNCH_OPTIONS}
    return [a for a in kp.axes if a not in listed]


DATA_LIKE_VALUES = 5
"""A call-site constexpr that the traced calls pass this many integer values or more, not all powers of two, reads
like per-call data (a length, a stride): ``forge-aot check`` and ``build`` say so."""


def data_like_constexprs(kp: KernelPlan, entries: list[EntryPlan]) -> dict[str, list[int]]:
    """Call-site constexprs whose values come from traced calls (not the manifest's lists) and look like per-call
    data: each value is a binary of its own, and a value no example passed fails at run time (where Triton's JIT
    compiles another binary for every new value: the constexpr trap of SGLang's mask kernel). → sorted values."""
    out = {}
    for a in _traced_call_site_axes(kp):
        values = {e.assignment[a] for e in entries}
        ints = sorted(v for v in values if isinstance(v, int) and not isinstance(v, bool))
        if len(ints) >= DATA_LIKE_VALUES and any(v <= 0 or v & (v - 1) for v in ints):
            out[a] = ints
    return out
