"""forge-aot runtime: launches the binaries packaged in this wheel through the GPU driver API.

Shipped verbatim inside every generated package. It needs torch (tensors, streams) and the GPU driver
(``libcuda.so.1`` or ``libamdhip64.so``) only: never Triton, never forge-aot, never a compiler. forge-aot
imports this same file for its development mode and its build-time checks, so the rules below (table
lookup, binary selection, constraints) are the same in the source tree and in the wheel.
"""

from __future__ import annotations

import ast
import ctypes
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

INDEX_FORMAT = 1
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


# ---------------------------------------------------------------------------------------------------------
# Constraint expressions: a small, safe subset of Python evaluated over config and key values.
# ---------------------------------------------------------------------------------------------------------

_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
_ALLOWED_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
                  ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.LShift,
                  ast.RShift, ast.BitAnd, ast.BitOr, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE,
                  ast.Gt, ast.GtE, ast.Name, ast.Load, ast.Constant, ast.Call, ast.IfExp)


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
                    raise ValueError(f"only min(), max() and abs() may be called in constraint {text!r}")
            elif isinstance(node, ast.Name) and node.id not in _FUNCS:
                names.add(node.id)
        self.text = text
        self.names = frozenset(names)
        self._code = compile(tree, "<constraint>", "eval")

    def __call__(self, env: dict[str, Any]) -> bool:
        return bool(eval(self._code, {"__builtins__": {}, **_FUNCS}, env))

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
# Variants, configs and tables
# ---------------------------------------------------------------------------------------------------------

def variant_id(assignment: dict[str, Any]) -> str:
    """Stable text id of a build variant, e.g. ``T=fp16`` (``base`` when there is nothing to choose)."""
    return ",".join(f"{k}={v}" for k, v in assignment.items()) or "base"


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
    """One compiled config: tuned meta-parameter values plus num_warps and num_stages."""

    __slots__ = ("id", "launch_meta", "meta", "num_stages", "num_warps")

    def __init__(self, cid: str, meta: dict[str, Any], num_warps: int, num_stages: int,
                 call_constexprs: dict[str, Any]) -> None:
        self.id = cid
        self.meta = dict(meta)
        self.num_warps = num_warps
        self.num_stages = num_stages
        # What a grid function sees, as with Triton: meta-parameters, call-site constexprs, warps, stages.
        self.launch_meta = {**meta, **call_constexprs, "num_warps": num_warps, "num_stages": num_stages}

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

    __slots__ = ("device", "launchers", "lock", "table", "target", "variant")

    def __init__(self, variant: str, device: int, target: str, table: ConfigTable) -> None:
        self.variant = variant
        self.device = device
        self.target = target
        self.table = table
        self.launchers: dict[tuple[str, bool], Any] = {}
        self.lock = threading.Lock()


class Kernel:
    """One packaged kernel, called from host code exactly like a Triton JIT function.

    ``kernel[grid](*args, **call_constexprs)`` binds the arguments like Triton does, picks the build from
    the dtypes and call-site constexprs, the config from the table, the binary (aligned or generic) from the
    arguments, computes the grid from the config and launches on torch's current stream.
    """

    def __init__(self, name: str, spec: dict[str, Any], targets: dict[str, dict[str, Any]],
                 backend: Any) -> None:
        self.name = name
        self.function = spec["function"]
        self.spec = spec
        self.targets = targets
        self.backend = backend
        params = spec["params"]
        self.param_names = [p[0] for p in params]
        self.runtime = [(n, t) for n, t in params if t not in ("meta", "constexpr")]
        self.runtime_names = [n for n, _ in self.runtime]
        self.meta_names = {n for n, t in params if t == "meta"}
        self.call_constexprs = [n for n, t in params if t == "constexpr"]
        self.constexpr_defaults = spec.get("constexpr_defaults", {})
        self.n_runtime = len(self.runtime)
        # Fast binding applies when the runtime parameters come first, as is usual.
        self._runtime_first = self.param_names[: self.n_runtime] == self.runtime_names
        self.ptr_pos = [i for i, (_, t) in enumerate(self.runtime) if t.startswith("*")]
        self.int_pos = [i for i, (_, t) in enumerate(self.runtime) if t in _INT_RANGES]
        divisible = set(spec.get("divisible", self.runtime_names))
        # (position, name, type, low, high, must be divisible by 16 for the aligned binary)
        self.int_checks = [(i, self.runtime[i][0], self.runtime[i][1], *_INT_RANGES[self.runtime[i][1]],
                            self.runtime[i][0] in divisible) for i in self.int_pos]
        self.divisible_pos = [c[0] for c in self.int_checks if c[5]]
        self.type_vars = [(tv, self.runtime_names.index(arg)) for tv, arg in spec["dtype_args"].items()]
        self.key_sources = [(True, self.runtime_names.index(k)) if k in self.runtime_names
                            else (False, k) for k in spec["key"]]
        self.constraints = [Expression(c) for c in spec.get("constraints", [])]
        self.variants = spec["variants"]
        # The common call: runtime parameters first, passed positionally, no call-site constexprs.
        self._plain = self._runtime_first and not self.call_constexprs
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

    def __getitem__(self, grid: Any) -> _Launch:
        return _Launch(self, grid)

    def __repr__(self) -> str:
        return f"<forge-aot kernel {self.name} ({self.function}), builds: {list(self.variants)}>"

    # -- binding ------------------------------------------------------------------------------------------
    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Sequence[Any], dict[str, Any]]:
        if self._runtime_first and len(args) == self.n_runtime and all(k in self.call_constexprs
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
                if k not in self.param_names:
                    raise TypeError(f"{self.function}() got an unexpected keyword argument '{k}'")
                given[k] = v
            missing = [n for n in self.runtime_names if n not in given]
            if missing:
                raise TypeError(f"{self.function}() is missing arguments {missing}")
            runtime = [given.pop(n) for n in self.runtime_names]
        tuned = self.meta_names.intersection(given)
        if tuned:
            raise TypeError(f"{self.function}(): {sorted(tuned)} are tuned by forge-aot and come from the "
                            "config table; do not pass them")
        constexprs = {}
        for n in self.call_constexprs:
            if n in given:
                constexprs[n] = given[n]
            elif n in self.constexpr_defaults:
                constexprs[n] = self.constexpr_defaults[n]
            else:
                raise TypeError(f"{self.function}() is missing the constexpr argument '{n}'")
        return runtime, constexprs

    # -- resolution ---------------------------------------------------------------------------------------
    def _state(self, runtime: Sequence[Any], constexprs: dict[str, Any]) -> _VariantState:
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
        dtypes = tuple(dtype_name(runtime[pos].dtype) for _, pos in self.type_vars)
        state_key = (*dtypes, *constexprs.values(), device)
        state = self._states.get(state_key)
        if state is None:
            state = self._make_state(dtypes, constexprs, device, state_key)
        return state

    def _make_state(self, dtypes: tuple[str, ...], constexprs: dict[str, Any], device: int,
                    state_key: tuple[Any, ...]) -> _VariantState:
        assignment = dict(zip([tv for tv, _ in self.type_vars], dtypes))
        for (tv, _), dt in zip(self.type_vars, dtypes):
            built = sorted({v["assign"][tv] for v in self.variants.values()})
            if dt not in built:
                raise UnsupportedDtypeError(f"{self.function}(): no build for {tv}={dt}; this package has "
                                            f"{', '.join(built)}")
        for name, value in constexprs.items():
            built_values = [v["assign"][name] for v in self.variants.values()]
            if value not in built_values:
                raise NotBuiltError(f"{self.function}(): constexpr {name}={value!r} was not built; built "
                                    f"values: {sorted(set(map(repr, built_values)))}")
            assignment[name] = next(b for b in built_values if b == value)
        vid = variant_id(assignment)
        variant = self.variants.get(vid)
        if variant is None:
            raise NotBuiltError(f"{self.function}(): the combination {vid} was not built; built: "
                                f"{list(self.variants)}")
        target, table = self.backend.resolve(self, variant, assignment, device)
        state = _VariantState(vid, device, target, table)
        with self._lock:
            self._states.setdefault(state_key, state)
        return self._states[state_key]

    # -- the call -----------------------------------------------------------------------------------------
    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if kwargs or not self._plain or len(args) != self.n_runtime:
            runtime, constexprs = self._bind(args, kwargs)
        else:
            runtime, constexprs = args, _NO_CONSTEXPRS
        state = self._state(runtime, constexprs)
        if self._runtime_key is not None:
            key = self._runtime_key(runtime)
        else:
            key = tuple(runtime[src] if is_rt else constexprs[src] for is_rt, src in self.key_sources)
        config = state.table.lookup(key)
        g = grid(config.launch_meta) if callable(grid) else grid
        self.backend.launch(self, state, config, g, runtime, constexprs)


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
    call_constexprs = {k: v for k, v in assignment.items() if k in kernel.call_constexprs}
    configs = {cid: Config(cid, c["meta"], c["num_warps"], c["num_stages"], call_constexprs)
               for cid, c in entry["configs"].items()}
    # A binary for an older GPU of the same major may ask for more shared memory than this one has.
    usable = {cid for cid, c in entry["configs"].items()
              if max((b["shared"] for b in c.get("binaries", {}).values()), default=0) <= info["max_shared"]}
    rows = entry["tables"].get(info["name"], entry["tables"]["default"])
    table = ConfigTable(f"{kernel.function} [{variant_id(assignment)}] on {target}", kernel.spec["key"],
                        rows, configs, kernel.constraints, usable)
    return target, table


class BinaryBackend:
    """Launches packaged binaries with the driver API; loads each lazily, once per device."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._devices: dict[int, dict[str, Any]] = {}

    def device(self, index: int) -> dict[str, Any]:
        info = self._devices.get(index)
        if info is None:
            info = self._devices[index] = driver().describe(index)
        return info

    def resolve(self, kernel: Kernel, variant: dict[str, Any], assignment: dict[str, Any],
                device: int) -> tuple[str, ConfigTable]:
        return resolve_table(kernel, variant, assignment, driver().backend, self.device(device))

    def _launcher(self, kernel: Kernel, state: _VariantState, config: Config, aligned: bool) -> Any:
        launcher = state.launchers.get((config.id, aligned))
        if launcher is None:
            with state.lock:
                launcher = state.launchers.get((config.id, aligned))
                if launcher is None:
                    binaries = kernel.variants[state.variant]["targets"][state.target]["configs"][config.id][
                        "binaries"]
                    binary = binaries["aligned" if aligned else "generic"]
                    launcher = _BinaryLauncher(kernel, binary, os.path.join(self.root, binary["path"]),
                                               state.device, self.device(state.device)["max_shared"])
                    state.launchers[(config.id, aligned)] = launcher
        return launcher

    def launch(self, kernel: Kernel, state: _VariantState, config: Config, grid: Sequence[int],
               runtime: Sequence[Any], constexprs: dict[str, Any]) -> None:
        values = list(runtime)
        aligned = True
        for i in kernel.ptr_pos:
            ptr = values[i] = runtime[i].data_ptr()
            if ptr & 15:
                aligned = False
        for i in kernel.divisible_pos:
            if values[i] & 15:
                aligned = False
                break
        try:
            self._launcher(kernel, state, config, aligned)(grid, values)
        except struct.error:
            for i, name, ty, lo, hi, _ in kernel.int_checks:
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
        self.drv = driver()
        self.device = device
        self.function = self.drv.load(device, image, binary["function"], binary["shared"], max_shared)
        self.block = binary["warp_size"] * binary["num_warps"]
        self.shared = binary["shared"]
        self.global_scratch = int(binary.get("global_scratch_size", 0))
        self.profile_scratch = int(binary.get("profile_scratch_size", 0))
        self.name = kernel.function
        fields = []
        self.bf16_pos = [i for i, (_, ty) in enumerate(kernel.runtime) if ty == "bf16"]
        for i, (_, ty) in enumerate(kernel.runtime):
            fields.append((f"a{i}", ctypes.c_uint64 if ty.startswith("*") else _CTYPES[ty]))
        # Triton 3.6 kernels take two trailing pointers: global scratch and profile scratch.
        fields += [("global_scratch", ctypes.c_uint64), ("profile_scratch", ctypes.c_uint64)]
        self.args_type = type("Args", (ctypes.Structure,), {"_fields_": fields})
        self.offsets = [getattr(self.args_type, name).offset for name, _ in fields]
        # One struct.pack_into fills the whole parameter block: explicit padding reproduces the C layout.
        codes = ["Q" if ty.startswith("*") else _STRUCT_CODES[ty] for _, ty in kernel.runtime] + ["Q", "Q"]
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
    module.__dict__.update(kernels)
    module.__dict__["triton"] = host_triton
    sys.modules[module_name] = module
    try:
        if source is None:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_index(root: str) -> dict[str, Any]:
    with open(os.path.join(root, "_forge", "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    if index.get("format") != INDEX_FORMAT:
        raise ForgeRuntimeError(f"{root}: index format {index.get('format')} is not {INDEX_FORMAT}; reinstall "
                                "a package built by a matching forge-aot")
    return index


def bind_ops(package: str, index: dict[str, Any], backend: Any,
             sources: dict[str, tuple[str, str | None]]) -> dict[str, Callable[..., Any]]:
    """Create the kernel handles and run every host module; returns the exported ops by name.

    ``sources`` maps each host module to (filename, source or None to read the file).
    """
    handles = {spec["function"]: Kernel(name, spec, index["targets"], backend)
               for name, spec in index["kernels"].items()}
    ops: dict[str, Callable[..., Any]] = {}
    for mod_name, mod in sorted(index["modules"].items()):
        filename, source = sources[mod_name]
        bound = {fn: handles[fn] for fn in mod["kernels"]}
        module = exec_host_module(f"{package}._ops.{mod_name}", filename, bound, source)
        for op in mod["ops"]:
            ops[op] = getattr(module, op)
    return ops


def load_ops(package: str, root: str) -> dict[str, Callable[..., Any]]:
    """Entry point of a generated package: its ops, launching its packaged binaries."""
    index = load_index(root)
    sources = {m: (os.path.join(root, spec["path"]), None) for m, spec in index["modules"].items()}
    return bind_ops(package, index, BinaryBackend(root), sources)
