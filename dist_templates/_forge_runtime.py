"""forge-aot runtime: launches the binaries packaged in this wheel through the GPU driver API.

Shipped verbatim inside every generated package. It needs torch (tensors, streams) and the GPU driver
(``libcuda.so.1`` or ``libamdhip64.so``) only: never Triton, never forge-aot, never a compiler. forge-aot
imports this same file for its development mode and its build-time checks, so the rules below (table
lookup, binary selection, constraints) are the same in the source tree and in the wheel.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import importlib.util
import json
import math
import operator
import os
import struct
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

INDEX_FORMAT = 2
_SCRATCH_ALIGN = 256
_MAX_CACHED_KEYS = 4096
_NO_CONSTEXPRS: dict[str, Any] = {}


class ForgeRuntimeError(RuntimeError):
    """Base of the errors the packaged runtime raises."""


class UnsupportedDeviceError(ForgeRuntimeError):
    """The GPU is not one this package has binaries for (or the tensors are not on a GPU)."""


class UnsupportedDtypeError(ForgeRuntimeError, TypeError):
    """The arguments' dtype has no build in this package."""


class NotBuiltError(ForgeRuntimeError, ValueError):
    """A constexpr value or shape that no packaged binary covers."""


class DriverError(ForgeRuntimeError):
    """The GPU driver refused a call."""


class IntegrityError(ForgeRuntimeError):
    """A packaged binary does not match the sha256 recorded when the package was built: never launched."""


# ---------------------------------------------------------------------------------------------------------
# Constraint expressions: a small, safe subset of Python evaluated over config and key values.
# ---------------------------------------------------------------------------------------------------------

_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}  # and the host helpers, below
_ALLOWED_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
                  ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.LShift,
                  ast.RShift, ast.BitAnd, ast.BitOr, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE,
                  ast.Gt, ast.GtE, ast.Name, ast.Load, ast.Constant, ast.Call, ast.IfExp, ast.In, ast.NotIn,
                  ast.Tuple)


class Expression:
    """A constraint such as ``BLOCK_M * BLOCK_K <= 8192 and num_warps >= 4``, checked when built."""

    def __init__(self, text: str) -> None:
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ValueError(f"invalid expression {text!r}: {exc.msg}") from None
        names: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED_NODES):
                raise ValueError(f"{type(node).__name__} is not allowed in constraint {text!r}")
            if isinstance(node, ast.Call):
                if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS) or node.keywords:
                    raise ValueError(f"only {', '.join(f + '()' for f in _FUNCS)} may be called in {text!r}")
            elif isinstance(node, ast.Name) and node.id not in _FUNCS:
                names.add(node.id)
        self.text = text
        self.names = frozenset(names)
        self._code = compile(tree, "<constraint>", "eval")

    def __call__(self, env: dict[str, Any]) -> bool:
        return bool(self.value(env))

    def value(self, env: dict[str, Any]) -> Any:
        """The expression's value (derived constexprs are expressions of the key, not conditions)."""
        return eval(self._code, {"__builtins__": {}, **_FUNCS}, env)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


# ---------------------------------------------------------------------------------------------------------
# The `triton` name inside host code: the host-side helpers only.
# ---------------------------------------------------------------------------------------------------------

def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


_FUNCS.update(cdiv=cdiv, next_power_of_2=next_power_of_2)


class _HostTriton(types.ModuleType):
    """Bound to ``triton`` in packaged host code, so ``triton.cdiv`` works and nothing imports Triton."""

    HOST_HELPERS = ("cdiv", "next_power_of_2")

    def __init__(self) -> None:
        super().__init__("triton", "host-side helpers of Triton, provided by the forge-aot runtime")
        self.cdiv = cdiv
        self.next_power_of_2 = next_power_of_2

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"packaged host code may use triton.cdiv and triton.next_power_of_2 only, "
                             f"not triton.{name}")


host_triton = _HostTriton()


# ---------------------------------------------------------------------------------------------------------
# Variants, specializations, configs and tables
# ---------------------------------------------------------------------------------------------------------

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
"""Triton launch options a call site may pass (``kernel[grid](..., num_warps=8)``)."""
LAUNCH_DEFAULTS: dict[str, Any] = {"num_ctas": 1, "maxnreg": None}
"""Launch options every binary is built with unless declared otherwise: a call passing these needs nothing."""
TRITON_DEFAULTS: dict[str, int] = {"num_warps": 4, "num_stages": 3}
"""Triton's own defaults, for a call that leaves out a launch option the kernel takes at the call site."""
HEURISTICS_HOOK = "__forge_heuristics__"
"""Name bound in host modules: ``@triton.heuristics`` decorators become calls of it (see sourcesplit)."""
SPEC_NONE, SPEC_DIV16, SPEC_ONE = "x", "D", "1"
"""Per-argument specialization codes, as Triton's JIT: no assumption; pointer 16-byte aligned or integer
divisible by 16; integer equal to 1 (compiled as the constant 1)."""


def variant_id(assignment: dict[str, Any], axes: Sequence[str]) -> str:
    """Text id of a build variant in the kernel's canonical axis order, e.g. ``T=fp16,BLOCK_SIZE=1024``.

    ``axes`` is the one order used everywhere (build, index, runtime, dev mode): type variables, then
    call-site constexprs in parameter order, then call-site launch options; ``base`` when there are none.
    """
    return ",".join(f"{name}={assignment[name]}" for name in axes) or "base"


def spec_fits(built: str, actual: str) -> bool:
    """Whether a binary specialized as ``built`` is correct for a call whose arguments give ``actual``:
    every assumption it makes must hold (an unspecialized position accepts anything)."""
    return all(b in (SPEC_NONE, a) for b, a in zip(built, actual))


def spec_rank(spec: str) -> int:
    """How specialized a binary is (the more assumptions, the faster it usually runs)."""
    return sum(c != SPEC_NONE for c in spec)


def argument_spec(slots: Sequence[tuple[int, bool]], values: Sequence[Any]) -> str:
    """A call's specialization with Triton's rules, over ``values`` (pointers already as addresses):
    for each (position, is pointer) slot, ``D`` for an aligned pointer or an integer divisible by 16, ``1``
    for an integer equal to 1, ``x`` otherwise."""
    spec = ""
    for i, is_ptr in slots:
        v = values[i]
        if is_ptr:
            spec += SPEC_NONE if v & 15 else SPEC_DIV16
        else:
            spec += SPEC_ONE if v == 1 else (SPEC_NONE if v % 16 else SPEC_DIV16)
    return spec


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


class ConfigTable:
    """Key values → config, for one kernel variant on one target (and GPU model, when tuned for it).

    A lookup never compiles: it returns the config of the nearest row (see ``rank_rows``) that is usable on
    this device and satisfies the kernel's constraints for the actual key values, else any such config.
    """

    def __init__(self, kernel: str, key_names: Sequence[str], rows: Sequence[Sequence[Any]],
                 configs: dict[str, Config], constraints: Sequence[Expression],
                 usable: set[str] | None = None) -> None:
        self.kernel = kernel
        self.key_names = tuple(key_names)
        self.rows = [tuple(int(v) for v in r[:-1]) for r in rows]
        self.row_configs = [str(r[-1]) for r in rows]
        self.configs = configs
        self.constraints = list(constraints)
        self.usable = set(configs) if usable is None else set(usable)
        self._cache: dict[tuple[int, ...], Config] = {}
        self._lock = threading.Lock()

    def _fits(self, cfg: Config, key: tuple[int, ...]) -> bool:
        if cfg.id not in self.usable:
            return False
        if not self.constraints:
            return True
        env = dict(cfg.launch_meta)
        env.update(zip(self.key_names, key))
        return all(c(env) for c in self.constraints)

    def lookup(self, key: tuple[int, ...]) -> Config:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        chosen = None
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


# ---------------------------------------------------------------------------------------------------------
# Which packaged target runs on this device
# ---------------------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------------------
# Drivers (ctypes)
# ---------------------------------------------------------------------------------------------------------

class _CudaDriver:
    backend = "cuda"

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DriverError(f"cannot load the NVIDIA driver library libcuda.so.1: {exc}") from None
        vp, i, u, p = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER
        sigs: dict[str, list[Any]] = {
            "cuInit": [u],
            "cuGetErrorName": [i, p(ctypes.c_char_p)],
            "cuDeviceGet": [p(i), i],
            "cuDeviceGetAttribute": [p(i), i, i],
            "cuDeviceGetName": [ctypes.c_char_p, i, i],
            "cuDevicePrimaryCtxRetain": [p(vp), i],
            "cuCtxGetCurrent": [p(vp)],
            "cuCtxPushCurrent_v2": [vp],
            "cuCtxPopCurrent_v2": [p(vp)],
            "cuModuleLoadData": [p(vp), ctypes.c_char_p],
            "cuModuleGetFunction": [p(vp), vp, ctypes.c_char_p],
            "cuFuncGetAttribute": [p(i), i, vp],
            "cuFuncSetAttribute": [vp, i, i],
            "cuLaunchKernel": [vp, u, u, u, u, u, u, u, vp, vp, vp],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        self.lib = lib
        self.launch = lib.cuLaunchKernel
        self.ctx_get_current = lib.cuCtxGetCurrent
        self.check(lib.cuInit(0), "cuInit")
        self._ctx: dict[int, int] = {}

    def check(self, code: int, what: str) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            label = name.value.decode() if name.value else "unknown"
            raise DriverError(f"{what} failed: {label} ({code})")

    def _device(self, index: int) -> int:
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        return dev.value

    def attribute(self, index: int, attr: int) -> int:
        out = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(out), attr, self._device(index)),
                   "cuDeviceGetAttribute")
        return out.value

    def describe(self, index: int) -> dict[str, Any]:
        buf = ctypes.create_string_buffer(256)
        self.check(self.lib.cuDeviceGetName(buf, 256, self._device(index)), "cuDeviceGetName")
        major, minor = self.attribute(index, 75), self.attribute(index, 76)
        return {"name": buf.value.decode(), "capability": (major, minor), "arch": f"sm_{major}{minor}",
                "max_shared": self.attribute(index, 97)}  # 97: MAX_SHARED_MEMORY_PER_BLOCK_OPTIN

    def primary_context(self, index: int) -> int:
        ctx = self._ctx.get(index)
        if ctx is None:
            handle = ctypes.c_void_p()
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(handle), self._device(index)),
                       "cuDevicePrimaryCtxRetain")
            ctx = self._ctx[index] = int(handle.value or 0)
        return ctx

    def load(self, index: int, image: bytes, name: str, shared: int, max_shared: int) -> int:
        """Load a cubin into the device's primary context (the one torch uses) and return the function."""
        ctx = self.primary_context(index)
        self.check(self.lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            module = ctypes.c_void_p()
            self.check(self.lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
            fn = ctypes.c_void_p()
            self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                       "cuModuleGetFunction")
            if shared > 49152:
                # Above 48 KB dynamic shared memory must be opted into, as Triton's own loader does.
                static = ctypes.c_int()
                self.check(self.lib.cuFuncGetAttribute(ctypes.byref(static), 1, fn), "cuFuncGetAttribute")
                self.check(self.lib.cuFuncSetAttribute(fn, 8, max_shared - static.value), "cuFuncSetAttribute")
            return int(fn.value or 0)
        finally:
            self.check(self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p())), "cuCtxPopCurrent")

    def current_context(self) -> int:
        ctx = ctypes.c_void_p()
        self.ctx_get_current(ctypes.byref(ctx))
        return int(ctx.value or 0)

    def push(self, ctx: int) -> None:
        self.check(self.lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")

    def pop(self) -> None:
        self.check(self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p())), "cuCtxPopCurrent")


class _HipDriver:
    backend = "hip"

    def __init__(self) -> None:
        lib = None
        for candidate in ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7", "libamdhip64.so.5"):
            try:
                lib = ctypes.CDLL(candidate)
                break
            except OSError:
                continue
        if lib is None:
            raise DriverError("cannot load the ROCm HIP runtime library libamdhip64.so")
        vp, i, u, p = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER
        sigs: dict[str, list[Any]] = {
            "hipGetErrorName": [i],
            "hipGetDevice": [p(i)],
            "hipSetDevice": [i],
            "hipModuleLoadData": [p(vp), ctypes.c_char_p],
            "hipModuleGetFunction": [p(vp), vp, ctypes.c_char_p],
            "hipModuleLaunchKernel": [vp, u, u, u, u, u, u, u, vp, vp, vp],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        lib.hipGetErrorName.restype = ctypes.c_char_p
        self.lib = lib
        self.launch = lib.hipModuleLaunchKernel

    def check(self, code: int, what: str) -> None:
        if code != 0:
            label = self.lib.hipGetErrorName(code)
            raise DriverError(f"{what} failed: {label.decode() if label else 'unknown'} ({code})")

    def describe(self, index: int) -> dict[str, Any]:
        import torch

        props = torch.cuda.get_device_properties(index)
        gfx = str(getattr(props, "gcnArchName", "")).split(":")[0]
        return {"name": props.name, "capability": None, "arch": gfx,
                "max_shared": int(getattr(props, "shared_memory_per_block_optin", 65536) or 65536)}

    def load(self, index: int, image: bytes, name: str, shared: int, max_shared: int) -> int:
        previous = ctypes.c_int()
        self.check(self.lib.hipGetDevice(ctypes.byref(previous)), "hipGetDevice")
        self.check(self.lib.hipSetDevice(index), "hipSetDevice")
        try:
            module = ctypes.c_void_p()
            self.check(self.lib.hipModuleLoadData(ctypes.byref(module), image), "hipModuleLoadData")
            fn = ctypes.c_void_p()
            self.check(self.lib.hipModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                       "hipModuleGetFunction")
            return int(fn.value or 0)
        finally:
            self.lib.hipSetDevice(previous.value)


_driver: Any = None
_driver_lock = threading.Lock()


def driver() -> Any:
    """The process's driver, picked from torch's build (ROCm or CUDA) and loaded once."""
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                import torch

                _driver = _HipDriver() if getattr(torch.version, "hip", None) else _CudaDriver()
    return _driver


# ---------------------------------------------------------------------------------------------------------
# Argument packing
# ---------------------------------------------------------------------------------------------------------

def _pack_fp16(x: float) -> int:
    return struct.unpack("<H", struct.pack("<e", x))[0]


def _pack_bf16(x: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even


_STRUCT_CODES = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u8": "B", "u16": "H", "u32": "I",
                 "u64": "Q", "fp16": "e", "bf16": "H", "fp32": "f", "fp64": "d"}
_CTYPES: dict[str, Any] = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
    "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64, "fp16": ctypes.c_uint16, "bf16": ctypes.c_uint16, "fp32": ctypes.c_float,
    "fp64": ctypes.c_double,
}
_INT_RANGES = {"i8": (-(2**7), 2**7 - 1), "i16": (-(2**15), 2**15 - 1), "i32": (-(2**31), 2**31 - 1),
               "i64": (-(2**63), 2**63 - 1), "u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1),
               "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}
_TORCH_DTYPE_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
                      "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
                      "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "i1",
                      "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


_DTYPE_CACHE: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """Triton's element-type name of a torch dtype (``torch.float16`` → ``fp16``)."""
    name = _DTYPE_CACHE.get(dtype)
    if name is None:
        text = str(dtype).rpartition(".")[2]
        name = _DTYPE_CACHE[dtype] = _TORCH_DTYPE_NAMES.get(text, text)
    return name


# ---------------------------------------------------------------------------------------------------------
# Kernel handles: what host code calls as ``kernel[grid](*args)``
# ---------------------------------------------------------------------------------------------------------

class _Launch:
    __slots__ = ("grid", "kernel")

    def __init__(self, kernel: Kernel, grid: Any) -> None:
        self.kernel = kernel
        self.grid = grid

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.kernel.run(self.grid, args, kwargs)


class _VariantState:
    """Everything one (variant, device) needs at launch time, resolved once."""

    __slots__ = ("assignment", "device", "launchers", "lock", "table", "target", "variant")

    def __init__(self, variant: str, assignment: dict[str, Any], device: int, target: str,
                 table: ConfigTable) -> None:
        self.variant = variant
        self.assignment = assignment
        self.device = device
        self.target = target
        self.table = table
        self.launchers: dict[tuple[Any, ...], Any] = {}
        """(config id, heuristic values, specialization) → launcher of the binary that serves them."""
        self.lock = threading.Lock()


class Kernel:
    """One packaged kernel, called from host code exactly like a Triton JIT function.

    ``kernel[grid](*args, **kwargs)`` binds the arguments like Triton does (call-site constexprs and launch
    options such as ``num_warps`` included), picks the build variant from the dtypes and the call-site
    values, the config from the table, evaluates the kernel's ``@triton.heuristics`` on the host, picks the
    binary from each argument's specialization (pointer alignment, integers divisible by 16 or equal to 1,
    as Triton's JIT) and launches on torch's current stream.
    """

    def __init__(self, name: str, spec: dict[str, Any], targets: dict[str, dict[str, Any]],
                 backend: Any) -> None:
        self.name = name
        self.function = spec["function"]
        self.spec = spec
        self.targets = targets
        self.backend = backend
        params = spec["params"]
        kinds = {"meta", "constexpr", "heuristic"}
        self.param_names = [p[0] for p in params]
        self.runtime = [(n, t) for n, t in params if t not in kinds]
        self.runtime_names = [n for n, _ in self.runtime]
        self.meta_names = {n for n, t in params if t == "meta"}
        self.heuristic_names = [n for n, t in params if t == "heuristic"]
        self.axes: list[str] = list(spec["axes"])
        self.launch_axes = [a for a in self.axes if a in LAUNCH_OPTIONS]
        # Call-site constexprs and launch options: the values the call passes select the build.
        self.call_constexprs = [n for n, t in params if t == "constexpr"]
        self.call_names = set(self.call_constexprs) | set(self.launch_axes)
        self.constexpr_defaults = spec.get("constexpr_defaults", {})
        self.n_runtime = len(self.runtime)
        # Fast binding applies when the runtime parameters come first, as is usual.
        self._runtime_first = self.param_names[: self.n_runtime] == self.runtime_names
        self.ptr_pos = [i for i, (_, t) in enumerate(self.runtime) if t.startswith("*")]
        self.int_pos = [i for i, (_, t) in enumerate(self.runtime) if t in _INT_RANGES]
        spec_params = spec.get("spec_params", [])
        # (position, is pointer) of every argument specialized like Triton's JIT does, in order.
        self.spec_slots = [(self.runtime_names.index(n), self.runtime[self.runtime_names.index(n)][1]
                            .startswith("*")) for n in spec_params]
        self.int_checks = [(i, self.runtime[i][0], self.runtime[i][1], *_INT_RANGES[self.runtime[i][1]])
                           for i in self.int_pos]
        type_args = spec["dtype_args"]
        self.type_vars = [(tv, self.runtime_names.index(type_args[tv])) for tv in self.axes if tv in type_args]
        # How each variant axis is read from a call: (True, runtime position) for a type variable's tensor,
        # (False, name) for a call-site value.
        self.axis_sources = [(True, self.runtime_names.index(type_args[a])) if a in type_args else (False, a)
                             for a in self.axes]
        self.key_sources = [(True, self.runtime_names.index(k)) if k in self.runtime_names
                            else (False, k) for k in spec["key"]]
        self.constraints = [Expression(c) for c in spec.get("constraints", [])]
        self.variants = spec["variants"]
        self.heuristics: list[tuple[str, Callable[[dict[str, Any]], Any]]] = []
        """(name, function) in Triton's order of evaluation, registered by the host module's decorators."""
        self.pre_hooks: dict[str, Callable[[dict[str, Any]], Any]] = {}
        """Config pre-hooks by name, bound from the host module (``triton.Config(pre_hook=...)``)."""
        # The common call: runtime parameters first, passed positionally, nothing chosen at the call site.
        self._plain = self._runtime_first and not self.call_names
        positions = [src for is_rt, src in self.key_sources if is_rt]
        self._runtime_key: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None
        if len(positions) == len(self.key_sources):
            if not positions:
                self._runtime_key = lambda runtime: ()
            elif len(positions) == 1:
                only = positions[0]
                self._runtime_key = lambda runtime: (runtime[only],)
            else:
                self._runtime_key = operator.itemgetter(*positions)
        self._states: dict[tuple[Any, ...], _VariantState] = {}
        self._lock = threading.Lock()
        register = getattr(backend, "register", None)
        if register is not None:
            register(self)

    def __getitem__(self, grid: Any) -> _Launch:
        return _Launch(self, grid)

    def __repr__(self) -> str:
        return f"<forge-aot kernel {self.name} ({self.function}), builds: {list(self.variants)}>"

    def add_heuristics(self, values: dict[str, Callable[[dict[str, Any]], Any]]) -> None:
        """Register one ``@triton.heuristics`` decorator's values (outer decorators register first)."""
        for name, fn in values.items():
            if name not in self.heuristic_names:
                raise ForgeRuntimeError(f"{self.function}: heuristic '{name}' is not a constexpr parameter the "
                                        f"package knows as heuristic ({self.heuristic_names})")
            self.heuristics.append((name, fn))

    # -- binding ------------------------------------------------------------------------------------------
    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Sequence[Any], dict[str, Any]]:
        if self._runtime_first and len(args) == self.n_runtime and all(k not in self.runtime_names
                                                                          for k in kwargs):
            runtime: Sequence[Any] = args
            given = dict(kwargs)
        else:
            if len(args) > len(self.param_names):
                raise TypeError(f"{self.function}() takes {len(self.param_names)} arguments, got {len(args)}")
            given = dict(zip(self.param_names, args))
            for k, v in kwargs.items():
                if k in given:
                    raise TypeError(f"{self.function}() got multiple values for argument '{k}'")
                given[k] = v
            missing = [n for n in self.runtime_names if n not in given]
            if missing:
                raise TypeError(f"{self.function}() is missing arguments {missing}")
            runtime = [given.pop(n) for n in self.runtime_names]
        call: dict[str, Any] = {}
        for k, v in given.items():
            if k in self.call_names:
                call[k] = v
            elif k in self.meta_names:
                raise TypeError(f"{self.function}(): {k} is tuned by forge-aot and comes from the config table; "
                                "do not pass it (or declare it a call-site constexpr in the manifest)")
            elif k in LAUNCH_OPTIONS:
                if v != LAUNCH_DEFAULTS.get(k, object()):
                    raise NotBuiltError(f"{self.function}(): the call passes {k}={v!r}, but {k} was not built as a "
                                        "call-site option; list it under constexprs or derive in the manifest")
            elif k in self.heuristic_names:
                pass  # as with Triton, the kernel's heuristics compute it (and win)
            elif k not in self.param_names:
                raise TypeError(f"{self.function}() got an unexpected keyword argument '{k}'")
        for n in self.call_constexprs:
            if n not in call:
                if n in self.constexpr_defaults:
                    call[n] = self.constexpr_defaults[n]
                else:
                    raise TypeError(f"{self.function}() is missing the constexpr argument '{n}'")
        for n in self.launch_axes:
            if n not in call:
                call[n] = LAUNCH_DEFAULTS.get(n, TRITON_DEFAULTS.get(n))
        return runtime, call

    # -- resolution ---------------------------------------------------------------------------------------
    def _device(self, runtime: Sequence[Any]) -> int:
        device = -2
        for i in self.ptr_pos:
            arg = runtime[i]
            try:
                d = arg.get_device()
            except AttributeError:
                raise TypeError(f"{self.function}(): argument '{self.runtime_names[i]}' must be a tensor, got "
                                f"{type(arg).__name__}") from None
            if d < 0:
                raise UnsupportedDeviceError(
                    f"{self.function}(): argument '{self.runtime_names[i]}' is a CPU tensor; packaged kernels "
                    "run on the GPU (move it with .cuda())")
            if device == -2:
                device = d
            elif d != device:
                raise UnsupportedDeviceError(f"{self.function}(): tensors on cuda:{device} and cuda:{d}")
        return device

    def axis_values(self, runtime: Sequence[Any], call: dict[str, Any]) -> tuple[Any, ...]:
        """The call's value of every variant axis, in canonical order (dtype names for type variables)."""
        return tuple(dtype_name(runtime[src].dtype) if is_rt else call[src] for is_rt, src in self.axis_sources)

    def _state(self, runtime: Sequence[Any], call: dict[str, Any]) -> _VariantState:
        device = self._device(runtime)
        values = self.axis_values(runtime, call)
        state_key = (*values, device)
        state = self._states.get(state_key)
        if state is None:
            state = self._make_state(values, device, state_key)
        return state

    def find_variant(self, values: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
        """The built variant for the axis values of a call, or a clear error naming what was built."""
        assignment: dict[str, Any] = {}
        for axis, value in zip(self.axes, values):
            built = [v["assign"][axis] for v in self.variants.values()]
            if axis in dict(self.type_vars):
                if value not in built:
                    raise UnsupportedDtypeError(f"{self.function}(): no build for {axis}={value}; this package "
                                                f"has {', '.join(sorted(set(built)))}")
            elif value not in built:
                kind = "launch option" if axis in LAUNCH_OPTIONS else "constexpr"
                raise NotBuiltError(f"{self.function}(): {kind} {axis}={value!r} was not built; built values: "
                                    f"{sorted(set(map(repr, built)))}")
            else:
                value = next(b for b in built if b == value)
            assignment[axis] = value
        vid = variant_id(assignment, self.axes)
        if vid not in self.variants:
            raise NotBuiltError(f"{self.function}(): the combination {vid} was not built; built: "
                                f"{list(self.variants)}")
        return vid, assignment

    def _make_state(self, values: tuple[Any, ...], device: int, state_key: tuple[Any, ...]) -> _VariantState:
        vid, assignment = self.find_variant(values)
        target, table = self.backend.resolve(self, self.variants[vid], assignment, device)
        state = _VariantState(vid, assignment, device, target, table)
        with self._lock:
            self._states.setdefault(state_key, state)
        return self._states[state_key]

    def named_args(self, runtime: Sequence[Any], call: dict[str, Any], config: Config) -> dict[str, Any]:
        """What Triton's heuristics, pre-hooks and grid functions see: every argument by name, the call-site
        values and the config's keyword arguments."""
        return {**dict(zip(self.runtime_names, runtime)), **call, **config.all_kwargs()}

    # -- the call -----------------------------------------------------------------------------------------
    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if kwargs or not self._plain or len(args) != self.n_runtime:
            runtime, call = self._bind(args, kwargs)
        else:
            runtime, call = args, _NO_CONSTEXPRS
        state = self._state(runtime, call)
        if self._runtime_key is not None:
            key = self._runtime_key(runtime)
        else:
            key = tuple(runtime[src] if is_rt else call[src] for is_rt, src in self.key_sources)
        config = state.table.lookup(key)
        heur: tuple[Any, ...] = ()
        if self.heuristics or config.pre_hook:
            nargs = self.named_args(runtime, call, config)
            for name, fn in self.heuristics:
                nargs[name] = fn(nargs)
            heur = tuple(nargs[n] for n in self.heuristic_names)
            if config.pre_hook:
                self.pre_hooks[config.pre_hook](nargs)
            if callable(grid):
                try:
                    grid = grid({**config.launch_meta, **dict(zip(self.heuristic_names, heur))})
                except KeyError:
                    grid = grid(nargs)
        elif callable(grid):
            try:
                grid = grid(config.launch_meta)
            except KeyError:  # the grid function reads an argument by name, as Triton allows
                grid = grid(self.named_args(runtime, call, config))
        self.backend.launch(self, state, config, grid, runtime, call, heur)


def resolve_table(kernel: Kernel, variant: dict[str, Any], assignment: dict[str, Any], backend: str,
                  info: dict[str, Any]) -> tuple[str, ConfigTable]:
    """The target and config table one build of a kernel uses on a device described by ``info``.

    Shared by the packaged runtime and forge-aot's development mode, so both choose alike.
    """
    built = {t: kernel.targets[t] for t in variant["targets"]}
    cuda = backend == "cuda"
    target = pick_cuda_target(info["capability"], built) if cuda else pick_hip_target(info["arch"], built)
    if target is None:
        raise UnsupportedDeviceError(
            f"{kernel.function}(): this package has no binaries for {info['name']} ({info['arch']}); it "
            f"was built for {', '.join(variant['targets']) or 'no target'}. Rebuild with this target "
            "added to kernel_manifest.toml.")
    entry = variant["targets"][target]
    call_values = {k: v for k, v in assignment.items() if k in kernel.call_names}
    configs = {cid: Config(cid, c["meta"], c["num_warps"], c["num_stages"], call_values, c.get("maxnreg"),
                           c.get("pre_hook"))
               for cid, c in entry["configs"].items()}
    # A binary for an older GPU of the same major may ask for more shared memory than this one has.
    usable = {cid for cid, c in entry["configs"].items()
              if max((b["shared"] for b in c.get("binaries", {}).values()), default=0) <= info["max_shared"]}
    rows = entry["tables"].get(info["name"], entry["tables"]["default"])
    table = ConfigTable(f"{kernel.function} [{variant_id(assignment, kernel.axes)}] on {target}",
                        kernel.spec["key"], rows, configs, kernel.constraints, usable)
    return target, table


def choose_binary(kernel: Kernel, binaries: dict[str, dict[str, Any]], heur: tuple[Any, ...],
                  spec: str) -> dict[str, Any]:
    """The binary of a config serving a call: same heuristic values, every specialization assumption true
    for the call's arguments, the most specialized such (the generic one assumes nothing, so it always fits)."""
    names = kernel.heuristic_names
    best: dict[str, Any] | None = None
    for b in binaries.values():
        if tuple(b.get("heur", {}).get(n) for n in names) != heur or not spec_fits(b["spec"], spec):
            continue
        if best is None or spec_rank(b["spec"]) > spec_rank(best["spec"]):
            best = b
    if best is None:
        built = sorted({tuple(b.get("heur", {}).get(n) for n in names) for b in binaries.values()}, key=repr)
        raise NotBuiltError(f"{kernel.function}(): heuristics gave {dict(zip(names, heur))}, which was not "
                            f"built for this config; built: {[dict(zip(names, h)) for h in built]}")
    return best


class BinaryBackend:
    """Launches packaged binaries with the driver API; loads each lazily (or at ``preload``), once per device."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._devices: dict[int, dict[str, Any]] = {}
        self._loaded: dict[tuple[int, str], _BinaryLauncher] = {}
        self._load_lock = threading.Lock()
        self.kernels: list[Kernel] = []

    def register(self, kernel: Kernel) -> None:
        self.kernels.append(kernel)

    def device(self, index: int) -> dict[str, Any]:
        info = self._devices.get(index)
        if info is None:
            info = self._devices[index] = driver().describe(index)
        return info

    def resolve(self, kernel: Kernel, variant: dict[str, Any], assignment: dict[str, Any],
                device: int) -> tuple[str, ConfigTable]:
        return resolve_table(kernel, variant, assignment, driver().backend, self.device(device))

    def load(self, kernel: Kernel, binary: dict[str, Any], device: int) -> _BinaryLauncher:
        """The launcher of a binary on a device, loading it the first time (integrity checked)."""
        key = (device, binary["path"])
        launcher = self._loaded.get(key)
        if launcher is None:
            with self._load_lock:
                launcher = self._loaded.get(key)
                if launcher is None:
                    launcher = _BinaryLauncher(kernel, binary, os.path.join(self.root, binary["path"]), device,
                                               self.device(device)["max_shared"])
                    self._loaded[key] = launcher
        return launcher

    def preload(self, device: Any = None) -> int:
        """Load every binary this device can run, so nothing loads later (a module load during CUDA-graph
        capture breaks the capture). Returns how many binaries are loaded for the device."""
        import torch

        where = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        index = torch.cuda.current_device() if where.index is None else where.index
        info = self.device(index)
        cuda = driver().backend == "cuda"
        for kernel in self.kernels:
            for variant in kernel.variants.values():
                built = {t: kernel.targets[t] for t in variant["targets"]}
                target = pick_cuda_target(info["capability"], built) if cuda else pick_hip_target(info["arch"], built)
                if target is None:
                    continue
                for config in variant["targets"][target]["configs"].values():
                    for binary in config.get("binaries", {}).values():
                        if binary["shared"] <= info["max_shared"]:
                            self.load(kernel, binary, index)
        return sum(1 for d, _ in self._loaded if d == index)

    def _launcher(self, kernel: Kernel, state: _VariantState, config: Config, heur: tuple[Any, ...],
                  spec: str) -> Any:
        with state.lock:
            launcher = state.launchers.get((config.id, heur, spec))
            if launcher is None:
                binaries = kernel.variants[state.variant]["targets"][state.target]["configs"][config.id]["binaries"]
                launcher = self.load(kernel, choose_binary(kernel, binaries, heur, spec), state.device)
                state.launchers[(config.id, heur, spec)] = launcher
        return launcher

    def launch(self, kernel: Kernel, state: _VariantState, config: Config, grid: Sequence[int],
               runtime: Sequence[Any], call: dict[str, Any], heur: tuple[Any, ...]) -> None:
        values = list(runtime)
        for i in kernel.ptr_pos:
            values[i] = runtime[i].data_ptr()
        spec = argument_spec(kernel.spec_slots, values)
        launcher = state.launchers.get((config.id, heur, spec))
        if launcher is None:
            launcher = self._launcher(kernel, state, config, heur, spec)
        try:
            launcher(grid, values)
        except struct.error:
            for i, name, ty, lo, hi in kernel.int_checks:
                if not lo <= values[i] <= hi:
                    raise OverflowError(f"{kernel.function}(): {name}={values[i]} does not fit {ty}") from None
            raise


class _ArgBuffer:
    """One thread's kernel-parameter block and the pointer array handed to the driver (reused each launch)."""

    __slots__ = ("args", "ctx", "ctx_ref", "params")

    def __init__(self, launcher: _BinaryLauncher) -> None:
        self.args = launcher.args_type()
        base = ctypes.addressof(self.args)
        self.params = launcher.params_type(*[base + off for off in launcher.offsets])
        self.ctx = ctypes.c_void_p()
        self.ctx_ref = ctypes.byref(self.ctx)


class _BinaryLauncher:
    """One loaded binary on one device, with its argument layout precomputed."""

    def __init__(self, kernel: Kernel, binary: dict[str, Any], path: str, device: int, max_shared: int) -> None:
        import torch

        with open(path, "rb") as f:
            image = f.read()
        digest = hashlib.sha256(image).hexdigest()
        if digest != binary["sha256"]:
            raise IntegrityError(f"{path}: sha256 {digest[:16]}… does not match the {binary['sha256'][:16]}… "
                                 "recorded when the package was built; the binary was modified or corrupted and is "
                                 "not launched (reinstall the package)")
        self.path = path
        self.spec = binary["spec"]
        self.drv = driver()
        self.device = device
        self.function = self.drv.load(device, image, binary["function"], binary["shared"], max_shared)
        self.block = binary["warp_size"] * binary["num_warps"]
        self.shared = binary["shared"]
        self.global_scratch = int(binary.get("global_scratch_size", 0))
        self.profile_scratch = int(binary.get("profile_scratch_size", 0))
        self.name = kernel.function
        # Arguments specialized to the constant 1 are compiled into the binary, not passed.
        ones = {pos for (pos, _), code in zip(kernel.spec_slots, binary["spec"]) if code == SPEC_ONE}
        kept = [i for i in range(len(kernel.runtime)) if i not in ones]
        self.select = (operator.itemgetter(*kept) if len(kept) > 1 else (lambda v, k=kept: [v[i] for i in k])) \
            if ones else None
        params = [kernel.runtime[i] for i in kept]
        fields = []
        self.bf16_pos = [j for j, (_, ty) in enumerate(params) if ty == "bf16"]
        for j, (_, ty) in enumerate(params):
            fields.append((f"a{j}", ctypes.c_uint64 if ty.startswith("*") else _CTYPES[ty]))
        # Triton 3.6 kernels take two trailing pointers: global scratch and profile scratch.
        fields += [("global_scratch", ctypes.c_uint64), ("profile_scratch", ctypes.c_uint64)]
        self.args_type = type("Args", (ctypes.Structure,), {"_fields_": fields})
        self.offsets = [getattr(self.args_type, name).offset for name, _ in fields]
        # One struct.pack_into fills the whole parameter block: explicit padding reproduces the C layout.
        codes = ["Q" if ty.startswith("*") else _STRUCT_CODES[ty] for _, ty in params] + ["Q", "Q"]
        fmt, pos = "<", 0
        for off, code in zip(self.offsets, codes):
            fmt += "x" * (off - pos) + code
            pos = off + struct.calcsize("<" + code)
        self.packer = struct.Struct(fmt)
        self.params_type = ctypes.c_void_p * len(fields)
        self.cuda = self.drv.backend == "cuda"
        self.ctx = self.drv.primary_context(device) if self.cuda else 0
        self._tls = threading.local()
        try:
            self.raw_stream = torch._C._cuda_getCurrentRawStream
        except AttributeError:  # pragma: no cover - older torch
            self.raw_stream = lambda d: torch.cuda.current_stream(d).cuda_stream
        self.torch = torch

    def _scratch(self, size: int, programs: int) -> tuple[Any, int]:
        buf = self.torch.empty(programs * size + _SCRATCH_ALIGN, dtype=self.torch.uint8,
                               device=f"cuda:{self.device}")
        ptr = buf.data_ptr()
        return buf, (ptr + _SCRATCH_ALIGN - 1) // _SCRATCH_ALIGN * _SCRATCH_ALIGN

    def __call__(self, grid: Sequence[int], values: list[Any]) -> None:
        gx = grid[0]
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        if gx * gy * gz == 0:
            return
        if self.select is not None:
            values = list(self.select(values))
        for i in self.bf16_pos:
            values[i] = _pack_bf16(values[i])
        keep = None
        gs = ps = 0
        if self.global_scratch:
            keep, gs = self._scratch(self.global_scratch, gx * gy * gz)
        if self.profile_scratch:
            keep2, ps = self._scratch(self.profile_scratch, gx * gy * gz)
            keep = (keep, keep2)
        buf = getattr(self._tls, "buf", None)
        if buf is None:
            buf = self._tls.buf = _ArgBuffer(self)
        self.packer.pack_into(buf.args, 0, *values, gs, ps)
        stream = self.raw_stream(self.device)
        drv = self.drv
        if self.cuda:
            drv.ctx_get_current(buf.ctx_ref)
            if buf.ctx.value != self.ctx:
                # This thread runs under another context (another device, or none yet): launch under ours.
                drv.push(self.ctx)
                try:
                    code = drv.launch(self.function, gx, gy, gz, self.block, 1, 1, self.shared, stream,
                                      buf.params, None)
                finally:
                    drv.pop()
            else:
                code = drv.launch(self.function, gx, gy, gz, self.block, 1, 1, self.shared, stream, buf.params,
                                  None)
        else:
            code = drv.launch(self.function, gx, gy, gz, self.block, 1, 1, self.shared, stream, buf.params, None)
        if code != 0:
            drv.check(code, f"launch of {self.name} (grid {gx}x{gy}x{gz}, block {self.block})")
        del keep


# ---------------------------------------------------------------------------------------------------------
# Host modules and the package entry point
# ---------------------------------------------------------------------------------------------------------

def exec_host_module(module_name: str, filename: str, kernels: dict[str, Any],
                     source: str | None = None) -> types.ModuleType:
    """Run a host-code module with its kernel handles and ``triton`` helpers bound before its first line.

    From the wheel the module is the packaged file; in development ``source`` is the same host code taken
    from the kernel file, compiled under the kernel file's name so tracebacks point at the author's lines.
    """
    if source is None:
        spec = importlib.util.spec_from_file_location(module_name, filename)
        if spec is None or spec.loader is None:
            raise ForgeRuntimeError(f"cannot load host module {filename}")
        module = importlib.util.module_from_spec(spec)
    else:
        module = types.ModuleType(module_name)
        module.__file__ = filename
    by_function = {getattr(k, "function", name): k for name, k in kernels.items()}

    def register_heuristics(function: str, values: dict[str, Callable[[dict[str, Any]], Any]]) -> None:
        by_function[function].add_heuristics(values)

    module.__dict__.update(kernels)
    module.__dict__["triton"] = host_triton
    module.__dict__[HEURISTICS_HOOK] = register_heuristics
    sys.modules[module_name] = module
    try:
        if source is None:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    for handle in kernels.values():
        for hook in getattr(handle, "spec", {}).get("pre_hooks", []):
            fn = module.__dict__.get(hook)
            if not callable(fn):
                raise ForgeRuntimeError(f"{filename}: config pre-hook '{hook}' of {handle.function} is not a "
                                        "function of the host module")
            handle.pre_hooks[hook] = fn
    return module


def load_index(root: str) -> dict[str, Any]:
    with open(os.path.join(root, "_forge", "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    if index.get("format") != INDEX_FORMAT:
        raise ForgeRuntimeError(f"{root}: index format {index.get('format')} is not {INDEX_FORMAT}; reinstall "
                                "a package built by a matching forge-aot")
    return index


def bind_module(module_name: str, index: dict[str, Any], mod_name: str, backend: Any, kernel_class: Any,
                source: tuple[str, str | None]) -> types.ModuleType:
    """Create the kernel handles of one host module and run it (``source``: filename, text or None to read
    the file)."""
    specs = {spec["function"]: (name, spec) for name, spec in index["kernels"].items()}
    bound = {}
    for fn in index["modules"][mod_name]["kernels"]:
        name, spec = specs[fn]
        bound[fn] = kernel_class(name, spec, index["targets"], backend)
    return exec_host_module(module_name, source[0], bound, source[1])


def bind_ops(package: str, index: dict[str, Any], backend: Any,
             sources: dict[str, tuple[str, str | None]]) -> dict[str, Callable[..., Any]]:
    """Run every host module with its kernel handles; returns the exported ops by name.

    ``sources`` maps each host module to (filename, source or None to read the file).
    """
    ops: dict[str, Callable[..., Any]] = {}
    for mod_name, mod in sorted(index["modules"].items()):
        module = bind_module(f"{package}._ops.{mod_name}", index, mod_name, backend, Kernel, sources[mod_name])
        for op in mod["ops"]:
            ops[op] = getattr(module, op)
    return ops


def load_package(package: str, root: str) -> tuple[dict[str, Callable[..., Any]], Callable[..., int]]:
    """Entry point of a generated package: its ops, launching its packaged binaries, and its ``preload``."""
    index = load_index(root)
    sources = {m: (os.path.join(root, spec["path"]), None) for m, spec in index["modules"].items()}
    backend = BinaryBackend(root)
    return bind_ops(package, index, backend, sources), backend.preload
