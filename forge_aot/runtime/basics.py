"""What every path of the runtime reads alike, which the lean first calls (``lean``, ``lean_launch``) need: dtype
names, specializations and binary fit, nearest rows, targets, config fit, ``cdiv``/``next_power_of_2``,
``LAUNCHES``, the C extension and the driver through it, the C reading of a handle's calls (``fast_kernel``). Defined
once here (``rules``, ``packing``, ``fastpath``, ``cuda``, ``cold``... import them). Imports: stdlib (torch where
``fast_kernel`` is called)."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .lean import FILENAME

_TORCH_DTYPE_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
                      "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
                      "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "i1",
                      "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5",
                      # Triton's own spellings: a reinterpreted tensor's dtype (host_triton.TensorWrapper)
                      "float8e4nv": "fp8e4nv", "float8e5": "fp8e5", "float8e5b16": "fp8e5b16", "float8e4b8": "fp8e4b8",
                      "float8e4b15": "fp8e4b15", "int1": "i1"}
_KNOWN = frozenset(_TORCH_DTYPE_NAMES.values())
"""Element types a torch dtype maps to (a ``*T`` whose variable is not in the variant checks nothing)."""
_DTYPE_CACHE: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """Triton's element-type name of a torch dtype (``torch.float16`` → ``fp16``)."""
    name = _DTYPE_CACHE.get(dtype)
    if name is None:
        text = str(dtype).rpartition(".")[2]
        name = _DTYPE_CACHE[dtype] = _TORCH_DTYPE_NAMES.get(text, text)
    return name


SPEC_NONE, SPEC_DIV16, SPEC_ONE, SPEC_ABSENT, SPEC_DESC = "x", "D", "1", "N", "T"
"""Per-argument specialization codes, as Triton's JIT: no assumption; pointer 16-byte aligned or integer divisible
by 16; integer equal to 1 (compiled in); pointer passed None (compiled in, as Triton does: FLA's ``h0=None``); a
pointer parameter passed a host-side tensor descriptor (compiled as a ``tensordesc``: the tutorial's attention)."""
SPEC_INT, SPEC_INT_DIV16, SPEC_INT_ONE = "i", "d", "o"
"""A pointer parameter passed an integer, typed as the manifest's ``*i32|i32`` says (flash-attn's rotary
``SEQLEN_OFFSETS``, "this could be int or a pointer"): any integer, one divisible by 16, the constant 1."""
_EXACT, _INTS = (SPEC_ABSENT, SPEC_DESC), (SPEC_INT, SPEC_INT_DIV16, SPEC_INT_ONE)


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


def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    if type(n) is not int:  # plain ints (every eager call) skip the thread-local read
        hinted = SIZE_HINTS.values
        hint = getattr(getattr(n, "node", None), "hint", None)  # a symbolic size (torch.SymInt) and its example
        if hinted is not None and type(hint) is int:
            value = next_power_of_2(hint * SIZE_HINTS.scale if SIZE_HINTS.scale else 1)
            hinted.add(value)
            return value
        n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class _SizeHints(threading.local):
    values: set[int] | None = None  # class defaults: reading them never raises
    scale = 1


SIZE_HINTS = _SizeHints()
"""While a custom op's fake implementation runs host code on symbolic sizes (``hinted_sizes``): see there."""


INDEX_FORMAT = 2  # the version of ``_forge/index.json``: a package refuses an index of another format
HEURISTICS_HOOK = "__forge_heuristics__"
"""Name bound in host modules: ``@triton.heuristics`` decorators become calls of it (see sourcesplit)."""
KERNEL_SIDE_HOOK = "__forge_kernel_side__"
"""Bound in host modules: ``NAME = __forge_kernel_side__("NAME", __name__)`` stands where a file defines Triton code."""


class _LaunchState(threading.local):
    skip: Any = False  # a class default: reading it never raises, in Python or from the C path
    """True: calls on this thread bind and return without launching (torch_ops.call_without_launches); a
    ``guard.Guard``: a custom op's real implementation runs, its launches checked against it (guard.py)."""


LAUNCHES = _LaunchState()
"""Per thread, whether launches are skipped or guarded: the one object every C reading (``FastKernel``) of every
handle checks, lean, cold or full (``fastpath.LAUNCHES``, ``kernel.LAUNCHES`` are this)."""


def fast_kernel(c: Any, read: dict[str, Any], defaults: tuple[Any, ...], missing: Any, heuristics: Any,
                ignored: Any) -> Any:
    """The C reading of a handle's calls (``c.FastKernel``) from ``fastpath.reading``'s dict or a lean plan's
    ``reading`` (its JSON): one call for every binding. ``defaults``: per name, the value a call leaving it out gets
    (else ``missing``); ``heuristics``: (name, function) pairs in calling order. Raises TypeError, ValueError or
    OverflowError for a kernel beyond the C path's limits."""
    import torch

    t = tuple
    return c.FastKernel(
        bytes(read["kinds"]), t(read["device_pos"]), t(read["spec_pos"]), t(read["spec_ptr"]), t(read["axis_pos"]),
        t(read["key_pos"]), t(read["names"]), defaults, missing, (torch.Tensor, torch.nn.Parameter),
        torch.Tensor.get_device, torch.Tensor.data_ptr, LAUNCHES, t(read["runtime_names"]), t(map(t, heuristics)),
        t(read["heuristic_names"]), t(read["type_next"]), t(read["param_slots"]), t(read.get("pointer_ints", ())),
        bytes(read.get("pointer_int_kinds", b"")), t(read["written_pos"]), ignored)


# -- the C extension and the driver through it ----------------------------------------------------------------

ABI = 14
"""The extension's interface version (14: FastKernel takes ``ignored``, launch options passed at their defaults; 13:
``Driver``, the driver calls of a first launch, see cuda.py; 12: ``FastKernel.last``; 11: a launch returns its
``Launcher.result``; 10: FastKernel takes ``written``); an extension of another version is not used."""
_EXTENSION: list[Any] = []
_EXTENSION_LOCK = threading.Lock()


def _from_file() -> Any:
    """The extension loaded straight from its file, as the import system would (its spec and loader, in
    sys.modules and on the package) but without a trip through the finders: 0.1 - 0.15 ms less per fresh process,
    locally."""
    from importlib.machinery import ExtensionFileLoader
    from importlib.util import module_from_spec, spec_from_file_location

    name, path = f"{__package__}._fastlaunch", os.path.join(os.path.dirname(__file__), FILENAME)
    if name in sys.modules:  # (imported before)
        return sys.modules[name]
    if not os.path.isfile(path):
        raise ImportError(path)
    spec = spec_from_file_location(name, path, loader=ExtensionFileLoader(name, path))
    module = module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    sys.modules[name] = module
    sys.modules[__package__]._fastlaunch = module  # type: ignore[attr-defined]
    return module


def extension() -> Any:
    """The C extension module (loaded once, under the import lock of whoever asks first), or None: absent, built
    for another platform or interface, or turned off (``FORGE_NO_C_LAUNCH=1``)."""
    if not _EXTENSION:
        with _EXTENSION_LOCK:
            if not _EXTENSION:
                _EXTENSION.append(_load_extension())
    return _EXTENSION[0]


def _load_extension() -> Any:
    if os.environ.get("FORGE_NO_C_LAUNCH", "") not in ("", "0"):
        return None
    try:
        module = _from_file()
    except Exception:  # absent, or built for another platform: the Python path serves every call
        try:  # (a copy of the runtime with the extension under another name)
            from . import _fastlaunch as module  # type: ignore[attr-defined,no-redef]
        except Exception:
            return None
    return module if getattr(module, "ABI", None) == ABI else None


CUDA_FUNCTIONS = ("cuInit", "cuGetErrorName", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetAttribute",
                  "cuDeviceGetName", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxPushCurrent_v2",
                  "cuCtxPopCurrent_v2", "cuModuleLoadData", "cuModuleGetFunction", "cuFuncGetAttribute",
                  "cuFuncSetAttribute", "cuLaunchKernel", "cuLaunchKernelEx", "cuTensorMapEncodeTiled")
"""What the C ``Driver`` calls (the last two are CUDA 12's, and may be missing)."""
_DRIVERS: dict[str, Any] = {}


def c_driver(name: str = "libcuda.so.1") -> tuple[int, Any] | None:
    """The NVIDIA driver library opened once per process for the C extension: (its ``dlopen`` handle, the C
    ``Driver`` of its functions, initialized), or None where the extension or the library is missing or lacks a
    function (``cuda.open_driver`` then goes through ctypes and says why). The lean path and ``cuda`` share it."""
    opened = _DRIVERS.get(name, False)
    if opened is False:
        opened = None
        c = extension()
        if c is not None and hasattr(c, "Driver"):
            import _ctypes
            import ctypes

            try:
                handle = _ctypes.dlopen(name, ctypes.DEFAULT_MODE)
                points = {fn: _symbol(_ctypes, handle, fn) for fn in CUDA_FUNCTIONS}
                opened = (handle, c.Driver(points))
            except (OSError, ValueError):  # no library, or one without a function the Driver needs
                opened = None
        opened = _DRIVERS.setdefault(name, opened)
    return opened


def _symbol(ctypes_module: Any, handle: int, name: str) -> int:
    try:
        return ctypes_module.dlsym(handle, name)
    except OSError:  # (a CUDA 12 function an older driver lacks: Driver takes 0 as missing)
        return 0


def check_cuda(driver: Any, code: int, what: str) -> None:
    """Raise ``DriverError`` for a failed driver call of the C ``Driver`` (its error name read from the driver)."""
    if code != 0:
        from .errors import DriverError  # (loaded where an error is raised: a first launch needs none)

        raise DriverError(f"{what} failed: {driver.error_name(code) or 'unknown'} ({code})")


def max_shared(config: dict[str, Any]) -> int:
    """The most shared memory any binary of a config asks for (recorded by the build beside the binaries)."""
    if "max_shared" in config:
        return int(config["max_shared"])
    return max((b["shared"] for b in config.get("binaries", {}).values()), default=0)


def target_table(root: str, mod: str, variant: dict[str, Any], targets: dict[str, Any], info: tuple[Any, ...],
                 ) -> tuple[Any, ...] | None:
    """A (device ``info``: name, capability, max shared memory; variant) as ``tables.resolve_table`` resolves it:
    (target, directory, configs, usable ids, rows, row ids), for cold and lean handles; None if no target runs."""
    name, capability, most = info
    target = pick_cuda_target(capability, {t: targets[t] for t in variant["targets"]})
    if target is None:
        return None
    directory = os.path.join(root, "_forge", "modules", mod, variant["target_files"])
    with open(os.path.join(directory, f"{target}.json"), "rb") as f:
        entry = json.load(f)
    configs = entry["configs"]
    rows = entry["tables"].get(name, entry["tables"]["default"])
    return (target, directory, configs, {c for c, v in configs.items() if max_shared(v) <= most},
            [tuple(int(v) for v in r[:-1]) for r in rows], [str(r[-1]) for r in rows])


def pick_config(table: tuple[Any, ...], key: tuple[Any, ...], fits: Callable[[], Callable[[str], bool]]) -> Any:
    """As ``ConfigTable.lookup``: a row of this key (the build checked its config there), else the nearest row whose
    config fits (``fits()``: the check, made only where the key misses every row), else any config that fits."""
    _, _, configs, usable, rows, ids = table
    cid = next((c for r, c in zip(rows, ids) if r == key and c in usable), None)
    if cid is None:
        check = fits()
        cid = next((ids[i] for i in rank_rows(rows, key) if check(ids[i])), None)
        if cid is None:
            cid = next((c for c in configs if check(c)), None)
    return cid


def compile_constraints(texts: Sequence[str]) -> list[Any]:
    """A kernel's constraints (the index's texts) compiled (``expressions``, loaded where a kernel has any)."""
    if not texts:
        return []
    from .expressions import Expression

    return [Expression(text) for text in texts]


def config_fits(constraints: Sequence[Any], configs: dict[str, Any], usable: set[str], keys: dict[str, Any],
                assignment: dict[str, Any]) -> Callable[[str], bool]:
    """Whether a config (its id in ``configs``, the index's) fits a call: usable on the device, every constraint
    true for the call's key values ``keys`` (by name) and variant ``assignment`` (``ConfigTable._fits`` over the
    index's configs; cold and lean handles alike)."""

    def fits(cid: str) -> bool:
        if cid not in usable:
            return False
        if not constraints:
            return True
        c = configs[cid]
        env = {**c["meta"], "num_warps": c["num_warps"], "num_stages": c["num_stages"], "maxnreg": c.get("maxnreg"),
               **keys, **assignment}
        return all(e(env) for e in constraints)
    return fits
