"""The manifest (``kernel_manifest.toml``): a tree of frozen dataclasses, read with key paths in every error.

Each field's docstring is its documentation: the JSON schema (``forge-aot schema``) and the README's
reference are generated from it, so the three cannot drift apart.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import itertools
import keyword
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union

from . import runtime as rt
from .errors import ForgeError, ManifestError, close_match
from .targets import GPU_MODELS, TARGETS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

Scalar = Union[int, bool, float, str]  # noqa: UP007 - the converter and schema read this union at run time

ELEMENT_TYPES = ("i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64",
                 "fp8e4nv", "fp8e5")
"""Triton element types accepted in signatures and dtype variants."""
INTEGER_TYPES = ("i32", "i64")
"""The integer half of a pointer-or-integer type (``*i32|i32``), as Triton's JIT types a Python int."""
SCALAR_TYPES = ("i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64")
RESERVED_META = ("num_warps", "num_stages", "maxnreg")
SEARCHES = ("auto", "exhaustive", "guided")
L2_MODES = ("cold", "warm")


@dataclass(frozen=True)
class TuneSpace:
    """The configs a kernel may run with: meta-parameter values × num_warps × num_stages, or a list of configs.

    Left empty for a kernel decorated with ``@triton.autotune``, the decorator's configs, key,
    ``reset_to_zero`` and ``restore_value`` are used; anything given here overrides them.
    """

    meta: dict[str, tuple[Scalar, ...]] = field(default_factory=dict)
    """Values tried for each tuned constexpr meta-parameter (e.g. ``BLOCK_SIZE = [1024, 2048]``).
    The first value of each list, in order, makes the first candidate: list your safest choice first."""
    num_warps: tuple[int, ...] = ()
    """Warps per program (a power of two, 1 to 32) [default: 4, Triton's default]."""
    num_stages: tuple[int, ...] = ()
    """Software-pipelining depth for loops (1 or more) [default: 3, Triton's default]."""
    configs: tuple[dict[str, Scalar], ...] = ()
    """An explicit list of configs instead of a product, each giving every meta-parameter plus optional
    ``num_warps``, ``num_stages`` and ``maxnreg`` (like a ``triton.Config`` list)."""
    constraints: tuple[str, ...] = ()
    """Python expressions that every config must satisfy (``and``, ``or``, comparisons, arithmetic, ``min``,
    ``max``, ``abs``, ``cdiv``, ``next_power_of_2``). They may name meta-parameters, ``num_warps``,
    ``num_stages``, call-site constexprs and key arguments; the loader re-checks them with the actual key
    values of each call."""
    default: dict[str, Scalar] | None = None
    """The config used where no tuning data exists (every meta-parameter plus optional ``num_warps`` and
    ``num_stages``). Without it, the default is the first candidate, in listed order, that satisfies the
    constraints for the shape in question."""
    reset_to_zero: tuple[str, ...] | None = None
    """Pointer arguments the kernel accumulates into: zeroed before each timed run when tuning (as
    ``triton.autotune(reset_to_zero=...)``) [default: the decorator's]."""
    restore_value: tuple[str, ...] | None = None
    """Pointer arguments the kernel overwrites in place: restored after each timed run when tuning (as
    ``triton.autotune(restore_value=...)``) [default: the decorator's]."""
    inputs: str | None = None
    """A host function of the kernel file that makes the op's arguments for one table row,
    ``inputs(key, variant, device)``: ``key`` maps each key argument to its value, ``variant`` each type
    variable to its torch dtype and each call-site value to its value. It returns a tuple of positional
    arguments (or a dict of keyword arguments) of random data, never zeros. ``forge-aot tune`` runs the op on
    them; the build traces them (on the meta device) for the argument specializations each row needs. Left out
    of the wheel."""
    op: str | None = None
    """The host function ``forge-aot tune`` calls with the inputs [default: the entry's first op]. For a kernel
    that runs only in a backward pass, a function of the file that runs forward and backward."""
    reference: str | None = None
    """A host function called with the same inputs that returns the expected result, in higher precision. Every
    candidate's result, and each winner's on fresh inputs, is compared with it; without it, with the result
    of the untuned default config. Left out of the wheel."""
    tolerance: float | None = None
    """Largest accepted relative error ``|out - ref| / |ref|`` (norms over every output tensor) [default:
    2e-2 for 16- and 8-bit types, 2e-3 otherwise]."""
    flops: str | None = None
    """Floating-point operations of one call, as an expression of the key arguments (``2 * M * N * K``): the
    report's TFLOP/s and the compute-bound test of the guided search."""
    bytes: str | None = None
    """Bytes one call must move, as an expression of the key arguments in which each type variable stands for
    its element size (``T * (M * K + K * N + M * N)``) [default: the size of every tensor the kernel gets,
    each read or written once]."""
    prune: str | None = None
    """A host function of the kernel file, ``prune(configs, named_args, **kwargs)`` returning the configs to
    keep, with the semantics of ``triton.autotune``'s ``early_config_prune`` [default: the decorator's]."""
    search: str = "auto"
    """``exhaustive`` (benchmark every candidate), ``guided`` (profiling-driven: benchmark at most ``budget``
    of the space), or ``auto`` (guided above 64 candidates)."""
    budget: float = 0.25
    """Largest fraction of the space the guided search benchmarks."""
    l2: str = "cold"
    """The L2 cache a timed launch starts with: ``cold`` (flushed before each launch; graph replays rotate among
    copies of the arguments making twice the L2), as after unrelated work and as ``triton.autotune`` times, or
    ``warm`` (the same arguments again, nothing flushed), as where the previous op just wrote the inputs and they
    fit the L2: a norm or a cumsum over activations of a few MB. Winners measured in the other mode do not
    count (the mode is part of the code hash)."""


@dataclass(frozen=True)
class OpAutograd:
    """How an exported op's custom op differentiates (``torch.library.register_autograd``), so that
    ``torch.compile`` and ``torch.export`` can train through it. The plain eager call does not use it: it runs
    the host code, whose own ``torch.autograd.Function`` (if any) differentiates as under Triton's JIT."""

    setup_context: str
    """A host function of the kernel file, ``setup_context(ctx, inputs, output)``: saves on ``ctx`` what the
    backward needs (``inputs`` is every argument of the op, defaults filled in; ``output`` its result)."""
    backward: str
    """A host function of the kernel file, ``backward(ctx, *grads)``: one gradient (or None) per op argument,
    computed with the package's exported ops (for example a backward op listed in another kernel's ``ops``).
    Those calls become custom ops here, so the compiler traces them as opaque ops."""


@dataclass(frozen=True)
class KernelEntry:
    """One Triton kernel: how to compile it, for which dtypes and shapes, and which host ops use it."""

    source: str
    """``path/to/file.py:function`` relative to the manifest; the function is decorated ``@triton.jit``,
    optionally under ``@triton.autotune`` and ``@triton.heuristics``."""
    ops: tuple[str, ...] = ()
    """Host functions in the same source file that the package exports (``package.op(...)``)."""
    signature: dict[str, str] = field(default_factory=dict)
    """Type of every runtime (non-constexpr) parameter: ``*fp16``/``*T`` for pointers, ``i32``, ``i64``,
    ``fp32``… for scalars, ``tensordesc<T>`` for a host-side ``TensorDescriptor`` (its block shape comes from the
    call or the config's pre-hook), ``*i32|i32`` for a parameter calls pass either a tensor or an integer
    (flash-attn's rotary ``SEQLEN_OFFSETS``). ``T`` stands for a type variable from ``dtypes``. With
    ``examples``, the parameters left out are typed from the traced calls (each type variable needs one pointer
    typed with it here), and the table may be left out."""
    dtypes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Type variables and the element types built for each, e.g. ``T = ["fp16", "bf16"]``; one build per
    combination. At run time the dtype of the first tensor argument typed ``*T`` selects the build."""
    constexprs: dict[str, tuple[Scalar, ...]] = field(default_factory=dict)
    """What the host code passes at the call site, with every value to build: constexpr parameters
    (``HAS_BIAS = [true, false]``) and launch options (``num_warps = [4, 8]``). Every combination is built
    (a product): for values that follow from the shape use ``derive``, or list what occurs in
    ``combinations``."""
    derive: dict[str, str] = field(default_factory=dict)
    """Call-site constexprs and launch options as expressions of the key and the type variables, evaluated
    per table row in listed order, e.g. ``BLOCK_SIZE = "next_power_of_2(n_cols)"``,
    ``num_warps = "min(max(BLOCK_SIZE // 256, 1), 8)"``: only the values the rows reach are built."""
    combinations: tuple[dict[str, Scalar], ...] = ()
    """The combinations of call-site values that occur, e.g. ``[{BLOCK_SIZE = 1024, num_warps = 4}, …]``,
    instead of the product of ``constexprs``."""
    do_not_specialize: tuple[str, ...] = ()
    """Runtime parameters never specialized (added to the kernel's ``@triton.jit(do_not_specialize=...)``).
    The others are specialized like Triton's JIT does: integers equal to 1 or divisible by 16, pointers
    16-byte aligned; a generic binary serves every other call."""
    key: tuple[str, ...] = ()
    """Arguments whose values select the config (integer parameters or call-site constexprs) [default: the
    ``@triton.autotune`` key]."""
    shapes: tuple[dict[str, int], ...] = ()
    """The key values that matter, as a list of points (``[{M = 4096, N = 4096, K = 4096}]``)."""
    buckets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The key values that matter, as values per key argument; every combination becomes a table row."""
    refine: int = 0
    """Rows added between the listed shapes: for each shape, one at the geometric midpoint to each of its
    ``refine`` nearest shapes (nearest as the runtime's lookup ranks rows; each value rounded to the largest
    power of two up to 16 that divides both ends, so a row keeps the alignment they share). For tables whose
    best config changes between the listed shapes (the number of waves a tiled kernel's grid makes, say); each
    added row is traced, tuned and built like a listed one (with ``derive``, its derived values may add
    variants). An added row that no config or derive expression can serve is left out. With ``buckets``, each
    point gains midpoints towards its nearest points only, not a finer grid."""
    examples: str | None = None
    """A host function of the same file that calls the ops on representative inputs (``examples(device)``,
    run on the CPU at build time with the kernel launches recorded, not run). What the calls pass —
    call-site values, key values, argument specializations — decides which binaries are built; their keys
    are added to the table rows. Left out of the wheel. ``path/to/file.py:function`` names one of another file,
    whose host code launches this kernel (Liger's ``element_mul_kernel`` lives in ``ops/utils.py`` and its cross
    entropy launches it)."""
    tune: TuneSpace = field(default_factory=TuneSpace)
    """The tuning space."""
    targets: tuple[str, ...] | None = None
    """The targets this kernel is built for, a subset of ``project.targets`` [default: all of them]: a kernel
    written for one architecture (Hopper's TMA, say) whose host code calls it only there. On a GPU of
    another target, a call that reaches it raises an error naming the device and the targets."""
    every_none_combination: bool = True
    """Where traced calls pass some arguments as None and others as tensors (optional tensors), build every
    combination of those on a table row (a call may leave out any subset), or, false, only the combinations the
    traced calls pass: flash-attn's layer-norm backward has seven optional pointers, each ``HAS_*`` flag a
    heuristic, and every subset is 2^7 binaries per row. A call of another combination then raises an error naming
    what was built."""
    optional_targets: tuple[str, ...] = ()
    """Targets on which some build variants of this kernel may fail to compile, for an instruction the
    architecture lacks (the PDL tutorial's ``gdc_wait`` below sm_90): such a variant is left out of that target
    and the build says so, instead of failing; a call of it on that GPU raises an error with the compiler's
    reason. A variant that compiles for none of its targets still fails the build."""
    autograd: dict[str, OpAutograd] = field(default_factory=dict)
    """Per exported op of this entry (a key of ``ops``): its backward for ``torch.compile``/``torch.export``
    (see OpAutograd). The op needs a schema (type annotations or examples)."""


@dataclass(frozen=True)
class OpEntry:
    """An exported op whose file defines no kernel of the manifest: its host code launches kernels that other
    kernel files define and it imports (Liger's fused linear cross entropy runs the cross-entropy module's kernels
    between torch matmuls). The op is the file's host function of the entry's name, or of ``function``."""

    source: str
    """``path/to/file.py``, relative to the manifest."""
    function: str | None = None
    """The host function the op is, where the package exports it under another name (the entry's): two files that
    each define an op of one name (SageAttention's ``per_block_int8`` and its varlen twin) cannot both be exported
    under it. With ``function``, ``source`` may be a kernel file of the manifest."""
    examples: str | None = None
    """A host function of the same file that calls the op on representative inputs (as ``kernels.NAME.examples``:
    run on the CPU at build time; what its calls pass to the kernels is built; left out of the wheel);
    ``path/to/file.py:function`` names one of another file of the package."""
    autograd: OpAutograd | None = None
    """How the op's custom op differentiates (as ``kernels.NAME.autograd.OP``, for this op; its functions are host
    functions of this file): lightning-attention's ``lightning_attn_func`` calls an ``autograd.Function`` of a kernel
    file, which a compiled training step cannot see through the custom op."""


@dataclass(frozen=True)
class ProjectSettings:
    """The generated package."""

    name: str
    """Distribution and import name of the generated package (a Python identifier)."""
    version: str
    """Version of the generated package (PEP 440)."""
    targets: tuple[str, ...]
    """GPU targets to build binaries for, e.g. ``["sm_80", "sm_90", "gfx942"]``."""
    description: str = ""
    """One-line summary for the package metadata."""
    dependencies: tuple[str, ...] = ("torch",)
    """Requirements of the generated package (its ops take torch tensors)."""
    requires_python: str = ">=3.9"
    """Python versions the generated package supports."""
    tuning_data: str | None = None
    """Directory (relative to the manifest) of tuning-data JSON files; see the README for their format."""
    compile_timeout: float = 300.0
    """Seconds one binary may take to compile before it is recorded as failed."""
    trace_gpus: tuple[str, ...] = ()
    """GPU models the build stands for when host code asks about the device (Triton's driver, torch's
    ``get_device_properties``...): each is traced for its target, and the target builds what any of its models
    reaches (an SM count that host code passes as a constexpr, as the persistent-matmul tutorial's ``NUM_SMS``, is
    then built for each). Names from forge-aot's catalogue (``H100-SXM``, ``H100-PCIe``, ``H20``, ``A100-SXM``,
    ``L40S``, ``MI300X``...; the schema lists them); a target none of them belongs to takes its default GPU."""
    package_data: tuple[str, ...] = ()
    """Glob patterns (relative to the manifest) of data files host code reads at run time that the build's traces
    did not read, e.g. ``["kernels/configs/*.json"]`` for tuned-config files of GPUs no trace stands for. Files host
    code reads while the build traces it are shipped without being listed. Each lands where the host code looks
    for it: beside its kernel file's shipped host module, or beside the project module it belongs to."""
    launch_wrappers: tuple[str, ...] = ()
    """Decorators outside ``@triton.jit`` (and autotune, heuristics) that only wrap the launch and change no argument,
    such as FlagGems' ``@libentry()`` launch cache: the build looks through them (their object's ``fn``) and the
    wheel leaves them out, its kernel handle taking their place. Named as the decorator is called (``libentry``
    or ``utils.libentry``)."""
    wheel_platforms: tuple[str, ...] = ("native",)
    """The wheels ``forge-aot build`` writes, one per entry, each with the same binaries and tables: ``native``
    (the build machine's CPU architecture, with the runtime's C launch path where a C compiler is found, else
    pure Python), ``x86_64`` or ``aarch64`` (with the C launch path compiled for that architecture, cross-compiled
    where it is not the build machine's: ``$CC_AARCH64``, zig from ``pip install ziglang``, or
    ``aarch64-linux-gnu-gcc``; the build fails where it cannot be compiled), ``any`` (pure Python,
    ``py3-none-any``: installs anywhere, launches through ctypes). pip takes the most specific wheel a machine
    accepts, so ``["x86_64", "aarch64", "any"]`` serves x86 and Grace (GH200, GB200) servers with the C launch
    path and anything else with the pure-Python one."""
    line_info: bool = True
    """Keep source line info in binaries (profilers map SASS to source). It records the path of Triton's own
    library sources, so wheels built with it are byte-identical only where Triton is installed at the same
    path; set false for wheels that are byte-identical across machines."""


WHEEL_PLATFORMS = ("native", "any", "x86_64", "aarch64")
"""What ``project.wheel-platforms`` accepts."""


def check_wheel_platforms(platforms: Sequence[str], error: Callable[..., ForgeError]) -> None:
    """Raise ``error(message, suggestion)`` for an empty list, an unknown platform or one listed twice."""
    if not platforms:
        raise error(f"list at least one wheel platform (accepted: {', '.join(WHEEL_PLATFORMS)})")
    for platform in platforms:
        if platform not in WHEEL_PLATFORMS:
            raise error(f"unknown wheel platform '{platform}' (accepted: {', '.join(WHEEL_PLATFORMS)})",
                        close_match(platform, WHEEL_PLATFORMS))
    if len(set(platforms)) != len(platforms):
        raise error("a wheel platform is listed twice")


@dataclass(frozen=True)
class Manifest:
    """The whole ``kernel_manifest.toml``."""

    project: ProjectSettings
    """The generated package."""
    kernels: dict[str, KernelEntry]
    """Kernel entries by name (the name is used in tables, binaries and error messages)."""
    ops: dict[str, OpEntry] = field(default_factory=dict)
    """Ops of files that define no kernel of the manifest, by name (``package.NAME``); an op in a kernel's own
    file is listed in that kernel's ``ops``."""
    exports: dict[str, str] = field(default_factory=dict)
    """Classes and functions of host files the package exports as they are, by name: ``NAME = "path/file.py"``
    (relative to the manifest; a kernel file, an op file or a file of its own). A library's public API beside its
    ops: Liger-Kernel's ``LigerCrossEntropyLoss`` and mamba's ``RMSNorm`` modules (each a ``torch.nn.Module`` whose
    ``forward`` runs the packaged kernels). ``package.NAME`` binds its file on first access; no custom op."""


@dataclass(frozen=True)
class LoadedManifest:
    """A validated manifest and where it came from."""

    manifest: Manifest
    path: Path
    sha256: str

    @property
    def root(self) -> Path:
        return self.path.parent


# ---------------------------------------------------------------------------------------------------------
# Field docs and generic conversion
# ---------------------------------------------------------------------------------------------------------

def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right after a field) of a dataclass, by field name."""
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in itertools.pairwise(body):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _toml_name(name: str) -> str:
    return name.replace("_", "-") if name in _DASHED else name


_DASHED = ("requires_python", "compile_timeout", "tuning_data", "line_info", "trace_gpus", "package_data",
           "launch_wrappers", "optional_targets", "wheel_platforms", "do_not_specialize", "reset_to_zero",
           "restore_value", "setup_context", "every_none_combination")
"""Field names the TOML spells with dashes."""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "a boolean"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is tuple:
        return "an array"
    if origin is dict or is_dataclass(tp):
        return "a table"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    return str(tp)


class _Reader:
    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, path: str, message: str, suggestion: str | None = None) -> ManifestError:
        return ManifestError(message, file=self.file, key_path=path, suggestion=suggestion)

    def convert(self, value: Any, tp: Any, path: str) -> Any:
        origin = typing.get_origin(tp)
        if is_dataclass(tp):
            return self.dataclass(value, tp, path)
        if origin in (Union, types.UnionType):
            options = [a for a in typing.get_args(tp) if a is not type(None)]
            for option in options:
                if self._matches(value, option):
                    return self.convert(value, option, path)
            raise self.error(path, f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        if origin is tuple:
            if not isinstance(value, list):
                raise self.error(path, f"expected an array, got {type(value).__name__} {value!r}")
            (item,) = typing.get_args(tp)[:1]
            return tuple(self.convert(v, item, f"{path}[{i}]") for i, v in enumerate(value))
        if origin is dict:
            if not isinstance(value, dict):
                raise self.error(path, f"expected a table, got {type(value).__name__} {value!r}")
            _, item = typing.get_args(tp)
            return {k: self.convert(v, item, f"{path}.{k}") for k, v in value.items()}
        if not self._matches(value, tp):
            raise self.error(path, f"expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        return float(value) if tp is float else value

    @staticmethod
    def _matches(value: Any, tp: Any) -> bool:
        if tp is bool:
            return isinstance(value, bool)
        if tp is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if tp is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if tp is str:
            return isinstance(value, str)
        origin = typing.get_origin(tp)
        if origin is tuple:
            return isinstance(value, list)
        if origin is dict or is_dataclass(tp):
            return isinstance(value, dict)
        return False

    def dataclass(self, value: Any, cls: type, path: str) -> Any:
        if not isinstance(value, dict):
            raise self.error(path, f"expected a table, got {type(value).__name__} {value!r}")
        hints = typing.get_type_hints(cls)
        by_toml = {_toml_name(f.name): f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key not in by_toml:
                accepted = ", ".join(by_toml)
                raise self.error(sub, f"unknown key (accepted: {accepted})", close_match(key, by_toml))
            f = by_toml[key]
            kwargs[f.name] = self.convert(item, hints[f.name], sub)
        for key, f in by_toml.items():
            if f.default is MISSING and f.default_factory is MISSING and f.name not in kwargs:
                raise self.error(f"{path}.{key}" if path else key, "required key is missing")
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------------------
# Loading and semantic validation
# ---------------------------------------------------------------------------------------------------------

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9.]+)?$")


def _is_identifier(name: str) -> bool:
    return bool(_IDENT.match(name)) and not keyword.iskeyword(name)


def load_manifest(path: str | Path) -> LoadedManifest:
    """Read, convert and validate a manifest file. Raises ManifestError naming the key path."""
    path = Path(path).resolve()
    display = str(path.name) if path.parent == Path.cwd() else str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError("file not found (run from a project root or pass --manifest)",
                            file=str(path)) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"not valid TOML: {exc}", file=display) from None
    reader = _Reader(display)
    manifest = reader.dataclass(data, Manifest, "")
    _validate(manifest, path.parent, reader)
    return LoadedManifest(manifest=manifest, path=path, sha256=hashlib.sha256(raw).hexdigest())


def _validate(m: Manifest, root: Path, r: _Reader) -> None:
    p = m.project
    if not _is_identifier(p.name):
        raise r.error("project.name", f"'{p.name}' is not a Python identifier (it is the import name)")
    if not _VERSION.match(p.version):
        raise r.error("project.version", f"'{p.version}' is not a PEP 440 version")
    if not p.targets:
        raise r.error("project.targets", f"list at least one target (accepted: {', '.join(TARGETS)})")
    for i, t in enumerate(p.targets):
        if t not in TARGETS:
            raise r.error(f"project.targets[{i}]", f"unknown target '{t}' (accepted: {', '.join(TARGETS)})",
                          close_match(t, TARGETS))
    if len(set(p.targets)) != len(p.targets):
        raise r.error("project.targets", "a target is listed twice")
    for i, g in enumerate(p.trace_gpus):
        if g not in GPU_MODELS:
            raise r.error(f"project.trace-gpus[{i}]", f"unknown GPU '{g}' (accepted: {', '.join(GPU_MODELS)})",
                          close_match(g, GPU_MODELS))
        if GPU_MODELS[g].target not in p.targets:
            raise r.error(f"project.trace-gpus[{i}]", f"{g} is a {GPU_MODELS[g].target} GPU, which is not one of "
                          f"project.targets ({', '.join(p.targets)})")
    if len(set(p.trace_gpus)) != len(p.trace_gpus):
        raise r.error("project.trace-gpus", "a GPU is listed twice")
    check_wheel_platforms(p.wheel_platforms, lambda message, suggestion=None: r.error(
        "project.wheel-platforms", message, suggestion))
    for i, pattern in enumerate(p.package_data):
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise r.error(f"project.package-data[{i}]", f"'{pattern}' must be relative to the manifest, inside "
                          "its folder")
        if not any(f.is_file() for f in root.glob(pattern)):
            raise r.error(f"project.package-data[{i}]", f"'{pattern}' matches no file")
    if p.tuning_data is not None and not (root / p.tuning_data).is_dir():
        raise r.error("project.tuning-data", f"directory '{p.tuning_data}' does not exist")
    if p.compile_timeout <= 0:
        raise r.error("project.compile-timeout", "must be positive")
    if not m.kernels:
        raise r.error("kernels", "define at least one kernel ([kernels.NAME])")
    seen_sources: dict[str, str] = {}
    seen_ops: dict[str, str] = {}
    for name, k in m.kernels.items():
        _validate_kernel(name, k, root, r)
        if k.targets is not None:
            if not k.targets:
                raise r.error(f"kernels.{name}.targets", "list at least one target (or leave the key out: every "
                              "project target)")
            for i, t in enumerate(k.targets):
                if t not in p.targets:
                    raise r.error(f"kernels.{name}.targets[{i}]", f"'{t}' is not one of project.targets "
                                  f"({', '.join(p.targets)})", close_match(t, p.targets))
            if len(set(k.targets)) != len(k.targets):
                raise r.error(f"kernels.{name}.targets", "a target is listed twice")
        built_for = k.targets if k.targets is not None else p.targets
        for i, t in enumerate(k.optional_targets):
            if t not in built_for:
                raise r.error(f"kernels.{name}.optional-targets[{i}]", f"'{t}' is not a target this kernel is "
                              f"built for ({', '.join(built_for)})", close_match(t, built_for))
        if k.source in seen_sources:
            raise r.error(f"kernels.{name}.source",
                          f"'{k.source}' is already the source of kernels.{seen_sources[k.source]}")
        seen_sources[k.source] = name
        for op in k.ops:
            if op in seen_ops and m.kernels[seen_ops[op]].source.split(":")[0] != k.source.split(":")[0]:
                raise r.error(f"kernels.{name}.ops", f"op '{op}' is also exported by kernels.{seen_ops[op]}: "
                              f"export this file's under another name ([ops.<name>] source = "
                              f"\"{k.source.split(':')[0]}\", function = \"{op}\")")
            seen_ops[op] = name
    kernel_files = {kernel_source(root, k)[0] for k in m.kernels.values()}
    renamed: dict[tuple[Path, str], str] = {}  # (file, function) -> the op exporting it under another name
    for name, o in m.ops.items():
        if not _is_identifier(name):
            raise r.error(f"ops.{name}", f"'{name}' is not an identifier (it is the op's name in the package)")
        if name in seen_ops:
            raise r.error(f"ops.{name}", f"op '{name}' is also exported by kernels.{seen_ops[name]}")
        if not o.source.endswith(".py") or not (root / o.source).is_file():
            raise r.error(f"ops.{name}.source", f"'{o.source}' is not a Python file (relative to the manifest)")
        path = (root / o.source).resolve()
        if o.function is None and path in kernel_files:
            raise r.error(f"ops.{name}.source", f"'{o.source}' defines kernels of this manifest: list '{name}' in "
                          f"the ops of one of them (or export it under this name: ops.{name}.function)")
        if o.autograd is not None:
            for key, fn in (("setup-context", o.autograd.setup_context), ("backward", o.autograd.backward)):
                if not _is_identifier(fn):
                    raise r.error(f"ops.{name}.autograd.{key}", f"'{fn}' is not a function name")
        if o.function is not None:
            if not _is_identifier(o.function):
                raise r.error(f"ops.{name}.function", f"'{o.function}' is not an identifier")
            owner = next((k for k, e in m.kernels.items() if kernel_source(root, e)[0] == path
                          and o.function in e.ops), renamed.get((path, o.function)))
            if owner is not None:
                raise r.error(f"ops.{name}.function", f"{o.source}'s '{o.function}' is exported already, by "
                              f"{owner if owner.startswith('ops.') else 'kernels.' + owner}: a function is one op")
            renamed[(path, o.function)] = f"ops.{name}"
    for name, file in m.exports.items():
        if not _is_identifier(name):
            raise r.error(f"exports.{name}", f"'{name}' is not an identifier (it is the exported name)")
        if name in seen_ops or name in m.ops:
            raise r.error(f"exports.{name}", f"'{name}' is an op of this manifest (exported already)")
        if name == "preload":
            raise r.error(f"exports.{name}", "'preload' is the package's own function")
        if not file.endswith(".py") or not (root / file).is_file():
            raise r.error(f"exports.{name}", f"'{file}' is not a Python file (relative to the manifest)")


def kernel_source(root: Path, k: KernelEntry) -> tuple[Path, str]:
    """The kernel file (resolved, relative to the manifest's folder ``root``) and function of ``k.source``."""
    file, _, func = k.source.rpartition(":")
    return (root / file).resolve(), func


def _validate_kernel(name: str, k: KernelEntry, root: Path, r: _Reader) -> None:
    at = f"kernels.{name}"
    if not _is_identifier(name):
        raise r.error(at, f"kernel name '{name}' is not an identifier")
    file, sep, func = k.source.rpartition(":")
    if not sep or not file.endswith(".py") or not _is_identifier(func):
        raise r.error(f"{at}.source", f"'{k.source}' is not of the form 'path/to/file.py:function'")
    if not (root / file).is_file():
        raise r.error(f"{at}.source", f"file '{file}' does not exist")
    for i, op in enumerate(k.ops):
        if not _is_identifier(op):
            raise r.error(f"{at}.ops[{i}]", f"'{op}' is not an identifier")
    for op, ag in k.autograd.items():
        if op not in k.ops:
            raise r.error(f"{at}.autograd.{op}", f"'{op}' is not one of this entry's ops {list(k.ops)}",
                          close_match(op, k.ops))
        for key, fn in (("setup-context", ag.setup_context), ("backward", ag.backward)):
            if not _is_identifier(fn):
                raise r.error(f"{at}.autograd.{op}.{key}", f"'{fn}' is not a function name")
    for tv, dts in k.dtypes.items():
        if not _is_identifier(tv) or tv in ELEMENT_TYPES:
            raise r.error(f"{at}.dtypes.{tv}", "type variables are identifiers that are not element types")
        if not dts:
            raise r.error(f"{at}.dtypes.{tv}", "list at least one element type")
        for i, dt in enumerate(dts):
            if dt not in ELEMENT_TYPES:
                raise r.error(f"{at}.dtypes.{tv}[{i}]",
                              f"unknown element type '{dt}' (accepted: {', '.join(ELEMENT_TYPES)})",
                              close_match(dt, ELEMENT_TYPES))
    if not k.signature and k.examples is None:
        raise r.error(f"{at}.signature", "list the kernel's runtime parameters and their types (or name an "
                      "examples function: its calls type them)")
    pointer_vars: set[str] = set()
    for pname, ty in k.signature.items():
        desc = rt.desc_dtype(ty)
        if desc is not None:  # a host-side tensor descriptor over tensors of that element type
            if desc in k.dtypes:
                pointer_vars.add(desc)
            elif desc not in ELEMENT_TYPES:
                raise r.error(f"{at}.signature.{pname}", f"unknown element type '{desc}' in '{ty}' (an element "
                              "type or a type variable)", close_match(desc, [*ELEMENT_TYPES, *k.dtypes]))
            continue
        ty, bar, alt = ty.partition("|")
        if bar and not (ty.startswith("*") and alt in INTEGER_TYPES):  # flash-attn's "could be int or a pointer"
            raise r.error(f"{at}.signature.{pname}", f"'{ty}{bar}{alt}': a parameter that takes a pointer or an "
                          f"integer is typed '*T|i32': a pointer type, '|', then one of {', '.join(INTEGER_TYPES)}")
        base = ty[1:] if ty.startswith("*") else ty
        accepted = ELEMENT_TYPES if ty.startswith("*") else SCALAR_TYPES
        if base in k.dtypes and ty.startswith("*"):
            pointer_vars.add(base)
            continue
        if base not in accepted:
            hint = close_match(base, [*accepted, *k.dtypes])
            raise r.error(f"{at}.signature.{pname}",
                          f"unknown type '{ty}' (pointers: '*' + element type or type variable; "
                          f"scalars: {', '.join(SCALAR_TYPES)}; host-side tensor descriptors: "
                          "'tensordesc<' + element type or type variable + '>')",
                          hint and (("*" if ty[0] == "*" else "") + hint))
    for tv in k.dtypes:
        if tv not in pointer_vars:
            raise r.error(f"{at}.dtypes.{tv}", f"type variable '{tv}' types no pointer parameter, so no "
                          "argument could select its build")
    call_site = set(k.constexprs) | set(k.derive) | {n for c in k.combinations for n in c}
    for cname, values in k.constexprs.items():
        if cname in k.signature:
            raise r.error(f"{at}.constexprs.{cname}", "is also a runtime parameter in signature")
        if not values:
            raise r.error(f"{at}.constexprs.{cname}", "list every value to build")
    for i, combo in enumerate(k.combinations):
        if set(combo) != set(k.combinations[0]):
            raise r.error(f"{at}.combinations[{i}]", f"every combination gives the same names "
                          f"{sorted(k.combinations[0])}, got {sorted(combo)}")
        for cname in combo:
            if cname in k.constexprs or cname in k.derive:
                raise r.error(f"{at}.combinations[{i}].{cname}", "is also listed in constexprs or derive")
    for dname, text in k.derive.items():
        if dname in k.constexprs or dname in k.signature:
            raise r.error(f"{at}.derive.{dname}", "is also listed in constexprs or signature")
        try:
            rt.Expression(text)
        except ValueError as exc:
            raise r.error(f"{at}.derive.{dname}", str(exc)) from None
    int_params = {n for n, t in k.signature.items() if t in ("i8", "i16", "i32", "i64", "u8", "u16", "u32",
                                                                "u64")}
    for i, pname in enumerate(k.do_not_specialize if k.examples is None else ()):  # (else: the plan checks)
        if pname not in k.signature:
            raise r.error(f"{at}.do-not-specialize[{i}]", f"'{pname}' is not a runtime parameter (accepted: "
                          f"{', '.join(k.signature)})", close_match(pname, k.signature))
    key_names = int_params | call_site
    if k.refine < 0:
        raise r.error(f"{at}.refine", "must be 0 (no rows added) or more")
    # With examples, call-site constexprs (and untyped integers) are known once the plan has traced them: the plan
    # checks the key then (FLA keys on H and BT, which its host code passes by name)
    for i, kn in enumerate(() if k.examples else k.key):
        if kn not in key_names:
            raise r.error(f"{at}.key[{i}]", f"'{kn}' is not an integer parameter or call-site constexpr "
                          f"(accepted: {', '.join(sorted(key_names)) or 'none'})", close_match(kn, key_names))
    if k.shapes and k.buckets:
        raise r.error(f"{at}.buckets", "give either shapes or buckets, not both")
    if k.key and not (k.shapes or k.buckets or k.examples):
        raise r.error(f"{at}.shapes", "the kernel has a key: list the shapes that matter (shapes or buckets) or "
                      "name an examples function that calls the ops")
    for i, point in enumerate(k.shapes if k.key else ()):  # else the key comes from @triton.autotune
        if set(point) != set(k.key):
            raise r.error(f"{at}.shapes[{i}]", f"a shape gives exactly the key arguments {list(k.key)}, got "
                          f"{list(point)}")
    if k.buckets and k.key and set(k.buckets) != set(k.key):
        raise r.error(f"{at}.buckets", f"give values for exactly the key arguments {list(k.key)}")
    for bname, vals in k.buckets.items():
        if not vals:
            raise r.error(f"{at}.buckets.{bname}", "list at least one value")
    if k.examples is not None:
        file, sep, func = k.examples.rpartition(":")
        if not _is_identifier(func) or (sep and not file.endswith(".py")):
            raise r.error(f"{at}.examples", f"'{k.examples}' is not a function name (or 'path/to/file.py:function')")
    t = k.tune
    for mname, vals in t.meta.items():
        if mname in k.signature or mname in call_site or mname in RESERVED_META:
            raise r.error(f"{at}.tune.meta.{mname}", "a tuned meta-parameter must be a constexpr parameter "
                          "that is neither in signature nor chosen at the call site")
        if not vals:
            raise r.error(f"{at}.tune.meta.{mname}", "list at least one value")
    if t.configs and (t.meta or t.num_warps or t.num_stages):
        raise r.error(f"{at}.tune.configs", "give either configs or meta/num_warps/num_stages, not both")
    for i, cfg in enumerate(t.configs):
        for cname in cfg:
            if cname in k.signature or cname in call_site:
                raise r.error(f"{at}.tune.configs[{i}].{cname}", "is a runtime parameter or chosen at the call site")
    for i, w in enumerate(t.num_warps):
        if w not in (1, 2, 4, 8, 16, 32):
            raise r.error(f"{at}.tune.num_warps[{i}]", f"{w} is not a power of two between 1 and 32")
    for i, st in enumerate(t.num_stages):
        if st < 1:
            raise r.error(f"{at}.tune.num_stages[{i}]", f"{st} must be at least 1")
    for i, text in enumerate(t.constraints):
        try:
            rt.Expression(text)
        except ValueError as exc:
            raise r.error(f"{at}.tune.constraints[{i}]", str(exc)) from None
    for field_name, names in (("reset-to-zero", t.reset_to_zero), ("restore-value", t.restore_value)):
        for i, pname in enumerate(names or ()):
            if not k.signature.get(pname, "").startswith("*"):
                raise r.error(f"{at}.tune.{field_name}[{i}]", f"'{pname}' is not a pointer parameter",
                              close_match(pname, [n for n, ty in k.signature.items() if ty.startswith("*")]))
    if t.l2 not in L2_MODES:
        raise r.error(f"{at}.tune.l2", f"unknown L2 mode '{t.l2}' (accepted: {', '.join(L2_MODES)})",
                      close_match(t.l2, L2_MODES))
    if t.search not in SEARCHES:
        raise r.error(f"{at}.tune.search", f"unknown search '{t.search}' (accepted: {', '.join(SEARCHES)})",
                      close_match(t.search, SEARCHES))
    if not 0 < t.budget <= 1:
        raise r.error(f"{at}.tune.budget", "must be a fraction in (0, 1]")
    if t.tolerance is not None and t.tolerance <= 0:
        raise r.error(f"{at}.tune.tolerance", "must be positive")
    for field_name in ("inputs", "op", "reference", "prune"):
        fn_name = getattr(t, field_name)
        if fn_name is not None and not _is_identifier(fn_name):
            raise r.error(f"{at}.tune.{field_name}", f"'{fn_name}' is not a function name")
    for field_name in ("flops", "bytes"):
        text = getattr(t, field_name)
        if text is not None:
            try:
                rt.Expression(text)
            except ValueError as exc:
                raise r.error(f"{at}.tune.{field_name}", str(exc)) from None
    if t.inputs is None and (t.reference or t.op):
        raise r.error(f"{at}.tune.inputs", "name the host function that makes the op's arguments for a row")
    if t.default is not None and t.meta:
        for dname in t.default:
            if dname not in t.meta and dname not in RESERVED_META:
                raise r.error(f"{at}.tune.default.{dname}", "not a tuned meta-parameter",
                              close_match(dname, [*t.meta, *RESERVED_META]))
        for mname in t.meta:
            if mname not in t.default:
                raise r.error(f"{at}.tune.default", f"missing meta-parameter '{mname}'")


# ---------------------------------------------------------------------------------------------------------
# JSON schema
# ---------------------------------------------------------------------------------------------------------

def _schema_of(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        docs = field_docs(tp)
        props: dict[str, Any] = {}
        required = []
        for f in fields(tp):
            sub = _schema_of(hints[f.name])
            sub["description"] = docs.get(f.name, "")
            props[_toml_name(f.name)] = sub
            if f.default is MISSING and f.default_factory is MISSING:
                required.append(_toml_name(f.name))
        out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
        if tp.__doc__:
            out["description"] = " ".join(tp.__doc__.split())
        if required:
            out["required"] = required
        return out
    if origin in (Union, types.UnionType):
        options = [_schema_of(a) for a in typing.get_args(tp) if a is not type(None)]
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is tuple:
        return {"type": "array", "items": _schema_of(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(typing.get_args(tp)[1])}
    return {"type": {bool: "boolean", int: "integer", float: "number", str: "string"}[tp]}


def json_schema() -> dict[str, Any]:
    """JSON schema of kernel_manifest.toml, generated from the dataclasses above."""
    schema = _schema_of(Manifest)
    target_schema = schema["properties"]["project"]["properties"]["targets"]["items"]
    target_schema["enum"] = list(TARGETS)
    schema["properties"]["project"]["properties"]["trace-gpus"]["items"]["enum"] = list(GPU_MODELS)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://forge-aot.dev/schema/kernel_manifest.json", "title": "kernel_manifest.toml",
            **schema}
