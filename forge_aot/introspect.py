"""Import a kernel file with Triton and read what its decorators say (build machine only).

``@triton.autotune`` configs are often computed (a list comprehension, a ``get_configs()`` function), so
they are read from the live ``Autotuner`` object rather than from the source text. The same loader serves
the compile workers, which import the file under the path the manifest gives so the line info Triton writes
into binaries does not depend on where the checkout lives.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SourceError
from .ongpu import tensors_on_gpu
from .runtime.host_triton import HOST_DTYPES, HostDtype
from .sourcesplit import TRITON_REEXPORTS
from .targets import torch_answers_as

_modules: dict[str, types.ModuleType] = {}
IMPORT_TARGET_ENV = "FORGE_AOT_IMPORT_TARGET"
"""``backend:arch:warp_size`` a kernel file sees as Triton's active target when the build machine has no GPU."""


class _BuildTargetDriver:
    """Stands in for Triton's active driver on a machine without a GPU, so kernel files that ask it at import
    time (``triton.runtime.driver.active.get_current_target().backend == "cuda"`` to pick a config list, as
    the Triton tutorials do) import; it reports the build's first target."""

    def __init__(self, spec: str) -> None:
        from triton.backends.compiler import GPUTarget

        backend, arch, warp = spec.split(":")
        self.target = GPUTarget(backend, int(arch) if arch.isdigit() else arch, int(warp))
        self.utils = self

    def get_current_target(self) -> Any:
        return self.target

    def get_device_properties(self, device: Any = None) -> dict[str, Any]:
        """``driver.active.utils.get_device_properties``: a representative GPU of the target (kernel files that
        read it at import, as the tutorial softmax does, import on the build machine)."""
        from .targets import representative_device

        return representative_device(self.name)[1]

    @property
    def name(self) -> str:
        """The manifest's name of the target (``sm_90``)."""
        t = self.target
        return f"sm_{t.arch}" if t.backend == "cuda" else str(t.arch)

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")

    def get_current_device(self) -> int:
        return 0


def _ensure_driver() -> str | None:
    """Triton's active driver, a stand-in where there is no GPU; returns the target it stands for (or None)."""
    from triton.runtime import driver

    if driver._active is not None:
        stand_in = driver._active
    else:
        try:
            driver.active  # noqa: B018 - a real GPU driver, where there is one
            return None
        except RuntimeError:
            stand_in = _BuildTargetDriver(os.environ.get(IMPORT_TARGET_ENV, "cuda:90:32"))
            driver.set_active(stand_in)
    if not isinstance(stand_in, _BuildTargetDriver):
        return None
    return stand_in.name


PROJECT_DIRS: set[str] = set()
"""Directories ``make_importable`` added (projects planned in this process): never where an installed module is."""


def forget_projects() -> None:
    """Take the directories of projects planned earlier in this process off ``sys.path`` (a plan starts with its
    own: two projects may both have a ``mylib``, and the first on the path would win)."""
    for directory in PROJECT_DIRS:
        while directory in sys.path:
            sys.path.remove(directory)
    PROJECT_DIRS.clear()


def make_importable(directory: Path | str) -> None:
    """Put a directory last on ``sys.path`` (once): the project root, each kernel file's directory and the
    directory holding a kernel file's package, so kernel files import the project's helper modules as
    ``mylib.ops.utils`` or ``utils`` (see localmods.py). Last: a project file named like a standard or installed
    module (``build.py``, ``math.py``) never shadows it in the build's own process."""
    directory = str(Path(directory).resolve())
    PROJECT_DIRS.add(directory)
    if directory not in sys.path:
        sys.path.append(directory)


def make_kernel_importable(path: Path | str) -> str | None:
    """Make what a kernel file imports importable (its directory, like a script's, and the directory holding its
    package where it lies in one); returns that package's dotted name (its ``__package__``) or None."""
    from .localmods import package_of

    path = Path(path).resolve()
    make_importable(path.parent)
    package = package_of(path)
    if package is None:
        return None
    make_importable(package[1])
    return package[0]


def load_kernel_module(path: str) -> types.ModuleType:
    """Execute a kernel file as a module (once per path), its directory importable like a script's. A file inside a
    package is that package's module too (``pkg.ops.foo``), its package imported first, as Python does: a package
    ``__init__`` importing its kernel files (vLLM's) reaches this module, so the file runs once (a second run
    defined its ``torch.library`` ops twice); one the project already imported under that name is the module."""
    module = _modules.get(path)
    if module is None:
        target = _ensure_driver()
        package = make_kernel_importable(path)
        real = f"{package}.{Path(path).stem}" if package is not None and Path(path).stem != "__init__" else None
        existing = sys.modules.get(real) if real is not None else None
        if existing is not None and os.path.realpath(getattr(existing, "__file__", "") or "") == \
                os.path.realpath(path):
            _modules[path] = existing
            return existing
        name = "_forge_kernel_" + hashlib.sha256(path.encode()).hexdigest()[:12]
        own = real if existing is None else None  # the name it runs under (else another file holds that name)
        module = types.ModuleType(own or name)
        module.__file__ = path
        if package is not None:
            module.__package__ = package  # its relative imports, as when its library imports it
        sys.modules[name] = module
        with open(path, encoding="utf-8") as f:
            # dont_inherit: this module's own `from __future__ import annotations` must not reach the user's file
            # (its annotations would become strings: torch.library.infer_schema then refuses them).
            code = compile(f.read(), path, "exec", dont_inherit=True)
        from .trace import TritonLaunch, no_triton_launches  # (trace imports this module)

        try:
            # Without a GPU, torch.cuda's device queries at import (``is_hopper = ...``) answer as the target too.
            with torch_answers_as(target) if target is not None else contextlib.nullcontext(), \
                    tensors_on_gpu("cpu") if target is not None else contextlib.nullcontext(), no_triton_launches(), \
                    recording_library_registrations():
                if own is not None:
                    _exec_as_package_module(module, code, own)
                else:
                    exec(code, module.__dict__)
        except TritonLaunch as exc:  # the Triton tutorials check their kernels against torch at module level
            sys.modules.pop(name, None)
            line = next((t.tb_lineno for t in _tracebacks(exc.__traceback__)
                         if t.tb_frame.f_code is code), None)  # the statement of the module's own code
            raise SourceError(f"{path}:{line}: the file launches a kernel when it is imported (a script's check or "
                              "benchmark?); the build imports kernel files to read their kernels and compiles them "
                              "without running any: put such code under 'if __name__ == \"__main__\":'") from None
        except BaseException:
            sys.modules.pop(name, None)
            _check_reexported_triton(path, module)  # a placeholder Triton: say so, rather than how it then failed
            raise
        _check_reexported_triton(path, module)
        _modules[path] = module
    return module


_LIBRARIES: list[Any] = []
"""``torch.library.Library`` objects project code registered ops on while this process imported it (weak
references): introspection runs a kernel file with Triton, then the trace binds its host code, which registers
them again (vLLM's ``direct_register_custom_op`` at module level: "Tried to register an operator ... multiple
times")."""


@contextlib.contextmanager
def recording_library_registrations() -> Iterator[None]:
    """Inside, the ``Library`` objects project code calls ``define``, ``impl`` or ``_register_fake`` on are
    remembered for ``undo_library_registrations`` (torch's own, such as a ``custom_op``'s, which may be defined
    again, are not)."""
    import weakref

    from torch.library import Library

    originals = {name: Library.__dict__[name] for name in ("define", "impl", "_register_fake")}

    def recording(original: Any) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not (caller == "torch" or caller.startswith("torch.")) \
                    and not any(ref() is self for ref in _LIBRARIES):
                _LIBRARIES.append(weakref.ref(self))
            return original(self, *args, **kwargs)
        return method

    for name, original in originals.items():
        setattr(Library, name, recording(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(Library, name, original)


def undo_library_registrations() -> None:
    """Take back what the remembered ``Library`` objects registered, each left empty and usable: the host code
    about to run registers its ops there again, as the wheel does. (Through torch's private ``Library.m``; a torch
    whose ``Library`` differs keeps them, and a second registration fails as it did before.)"""
    import torch
    import torch.library

    for ref in _LIBRARIES:
        lib = ref()
        if lib is None or lib.m is None:
            continue
        try:
            lib._destroy()  # the C++ library reset: its definitions and kernels go
            lib.m = torch._C._dispatch_library(lib.kind, lib.ns, lib.dispatch_key, __file__, 0)
        except Exception:  # another torch: the registrations stay
            continue
        torch.library._defs.difference_update(lib._op_defs)
        lib._op_defs.clear()
        lib._op_impls.clear()
    _LIBRARIES.clear()


def _exec_as_package_module(module: types.ModuleType, code: types.CodeType, real: str) -> None:
    """Run a kernel file's ``code`` in ``module`` as its package's module ``real``: the package imported first (its
    ``__init__`` importing ``real`` gets ``module``, run there), else run after it."""
    import importlib
    import importlib.util

    ran: list[bool] = []

    class Finder:
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            if fullname != real or ran:
                return None
            return importlib.util.spec_from_file_location(fullname, module.__file__, loader=self)

        def create_module(self, spec: Any) -> Any:
            return module

        def exec_module(self, _: Any) -> None:
            ran.append(True)
            exec(code, module.__dict__)

    parent, _, child = real.rpartition(".")
    finder = Finder()
    sys.meta_path.insert(0, finder)
    try:
        try:
            importlib.import_module(parent)
        except Exception:
            if ran:  # the file itself failed, imported by its package
                raise
        if not ran:  # the package does not import it (or could not be imported: the file runs as before)
            ran.append(True)
            sys.modules[real] = module
            try:
                exec(code, module.__dict__)
            except BaseException:
                sys.modules.pop(real, None)
                raise
        if parent in sys.modules and not hasattr(sys.modules[parent], child):
            setattr(sys.modules[parent], child, module)
    finally:
        sys.meta_path.remove(finder)


def _tracebacks(tb: Any) -> Iterator[Any]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _check_reexported_triton(path: str, module: types.ModuleType) -> None:
    """``triton`` and ``tl`` in a kernel file are Triton's own modules, also where the file takes them from another
    module (``from vllm.triton_utils import tl, triton``, which hands out a placeholder where it finds no active
    Triton driver): anything else would compile nothing the file means."""
    import importlib

    for name, real in TRITON_REEXPORTS.items():
        value = module.__dict__.get(name)
        if isinstance(value, types.ModuleType) and value is not importlib.import_module(real):
            raise SourceError(f"{path}: '{name}' is not {real} but {value!r} (a placeholder a re-exporting module "
                              "hands out where it finds no active Triton driver?)")


def base_jit_function(obj: Any) -> Any:
    """The ``JITFunction`` under any ``Autotuner`` / ``Heuristics`` wrappers (and launch wrappers, such as FlagGems'
    ``LibEntry``, which keep what they wrap in ``fn``)."""
    while type(obj).__name__ != "JITFunction" and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


@dataclass(frozen=True)
class AutotuneInfo:
    """What one ``@triton.autotune`` decorator says, as data."""

    configs: list[dict[str, Any]]
    """Each: ``meta`` (the Config kwargs), ``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``, ``pre_hook``
    (the name of a module-level host function, or None)."""
    key: list[str]
    reset_to_zero: list[str]
    restore_value: list[str]
    prune: dict[str, Any] = field(default_factory=dict)
    """``early_config_prune`` / ``perf_model`` (function names) and ``top_k``, for the tuner."""
    hooks: dict[str, str | None] = field(default_factory=dict)
    """The decorator's own ``pre_hook`` / ``post_hook`` (names), used only while tuning."""


TUNER_OWN_HOOK = "<its @triton.autotune's own>"
"""A pruning hook the plan names by where it is, not by a name: only the build calls it (``tuner_hook``)."""


def _hook_name(fn: Any, module: types.ModuleType) -> str:
    """A ``prune_configs_by`` hook by its top-level name in the kernel file, else ``TUNER_OWN_HOOK``: gemlite writes
    ``{"early_config_prune": lambda c, n, **kw: list(kernel_config_pruner(c, n, **kw))}``. Only the build calls these
    (``pruning``: the plan its ``early_config_prune``, tuning its ``perf_model``), with the kernel file imported
    with Triton; the wheel never does."""
    name = getattr(fn, "__name__", "")
    return str(name) if name and module.__dict__.get(name) is fn else TUNER_OWN_HOOK


def tuner_hook(module: types.ModuleType, function: str, hook: str, name: str) -> Any:
    """The pruning hook ``name`` (``early_config_prune`` or ``perf_model``: ``hook``) of ``function`` in the imported
    kernel file ``module``: the function of that name, or, for ``TUNER_OWN_HOOK``, the one its autotuner holds."""
    if name != TUNER_OWN_HOOK:
        return getattr(module, name)
    from triton.runtime.autotuner import Autotuner

    obj = getattr(module, function)
    while not isinstance(obj, Autotuner) and hasattr(obj, "fn"):
        obj = obj.fn
    return getattr(obj, hook)


def _function_name(fn: Any, module: types.ModuleType, what: str, line: str) -> str | None:
    if fn is None:
        return None
    name = getattr(fn, "__name__", "")
    if name and module.__dict__.get(name) is fn:
        return str(name)
    raise SourceError(f"{line}: {what} must be a function defined at the top level of the kernel file, so the "
                      f"packaged host code can call it by name (got {fn!r})")


def imported_kernel_module(path: str) -> types.ModuleType:
    """``load_kernel_module``, its failure a SourceError naming the file (one it raised itself as it is)."""
    try:
        return load_kernel_module(path)
    except SourceError:
        raise
    except Exception as exc:
        raise SourceError(f"{path}: importing the kernel file failed: {type(exc).__name__}: {exc}") from None


def kernel_defined_on(path: str, function: str, first: int, last: int) -> bool:
    """Whether importing the kernel file (with Triton, as the build's first target) defines ``function`` as a Triton
    kernel (under any autotuner, heuristics or launch wrapper) whose definition starts on lines ``first``..``last``."""
    obj = getattr(imported_kernel_module(path), function, None)
    jit = base_jit_function(obj)
    code = getattr(getattr(jit, "fn", None), "__code__", None)
    return type(jit).__name__ == "JITFunction" and code is not None and first <= code.co_firstlineno <= last


def read_do_not_specialize(path: str, function: str) -> tuple[str, ...]:
    """The parameters a kernel's ``@triton.jit(do_not_specialize=..., do_not_specialize_on_alignment=...)``
    computes (flash-linear-attention: ``['T', 'scale'] if IS_NVIDIA_HOPPER else ['T']``), as the imported
    ``JITFunction`` holds them (for the build's first target, which the import sees)."""
    obj = getattr(imported_kernel_module(path), function)
    while not hasattr(obj, "do_not_specialize") and hasattr(obj, "fn"):  # autotuner, heuristics, launch wrappers
        obj = obj.fn
    names = list(getattr(obj, "arg_names", ()))
    found = [*getattr(obj, "do_not_specialize", ()), *getattr(obj, "do_not_specialize_on_alignment", ())]
    return tuple(dict.fromkeys(names[v] if isinstance(v, int) else str(v) for v in found))


def read_defaults(path: str, function: str, names: list[str]) -> dict[str, Any]:
    """The defaults of ``names``, constexpr parameters whose defaults the source computes (vLLM's prefix_prefill:
    ``FP8_MIN: tl.constexpr = float8_info.min``), as the imported kernel's function holds them (for the build's
    first target, which the import sees): numbers, booleans, strings, None or Triton element types."""
    import inspect

    jit = base_jit_function(getattr(imported_kernel_module(path), function))
    parameters = inspect.signature(getattr(jit, "fn", jit)).parameters  # (the Python function the JITFunction wraps)
    by_short_name = {short: attr for attr, short in HOST_DTYPES.items()}  # str(tl.float32) is "fp32"
    out: dict[str, Any] = {}
    for name in names:
        value = parameters[name].default
        value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
        if type(value).__module__.startswith("triton") and str(value) in by_short_name:  # tl.float32 and the like
            value = HostDtype(f"tl.{by_short_name[str(value)]}")
        elif not isinstance(value, (bool, int, float, str, type(None))):
            raise SourceError(f"{path}: the default of {function}'s constexpr parameter '{name}' is a "
                              f"{type(value).__name__} ({value!r}); a packaged kernel takes numbers, booleans, "
                              "strings, None or element types there")
        out[name] = value
    return out


def read_decorators(path: str, function: str, on_def: bool = True, tune_table: str = "tune",
                    ) -> tuple[AutotuneInfo | None, list[str]]:
    """The ``@triton.autotune`` of ``function`` in ``path`` (None if it has none) and the names its
    ``@triton.heuristics`` compute, in Triton's order of evaluation. ``on_def`` False: the source has no
    ``@triton.autotune`` on the def, so an autotuner found is one host code applied after it (refused)."""
    module = imported_kernel_module(path)
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    obj = getattr(module, function)
    tuner = None
    heuristics: list[str] = []
    # Subclasses too (flash-linear-attention's caching autotuner); other wrappers keeping what they wrap in ``fn``
    # are looked through (launch wrappers, GPTQ's own autotuner, whose space the manifest then gives).
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        if isinstance(obj, Heuristics):
            heuristics += [n for n in obj.values if n not in heuristics]
        elif isinstance(obj, Autotuner):
            if tuner is not None:
                raise SourceError(f"{path}: {function} is autotuned twice")
            tuner = obj
        obj = obj.fn
    if tuner is None:
        return None, heuristics
    if not on_def:
        raise SourceError(f"{path}: host code applies triton.autotune to {function} after its def (a decorator a "
                          "helper returns, as Cut Cross-Entropy's where CCE_AUTOTUNE is set): forge-aot tunes at "
                          "build time from the decorators on the def; put @triton.autotune there, or list the configs "
                          f"in the manifest's [{tune_table}] and build where the helper returns triton.heuristics")
    where = f"{path}: @triton.autotune of {function}"
    configs = []
    for c in tuner.configs:
        if getattr(c, "ir_override", None):
            raise SourceError(f"{where}: configs with ir_override are not supported")
        configs.append({"meta": {k: as_host_value(v) for k, v in c.kwargs.items()}, "num_warps": int(c.num_warps),
                        "num_stages": int(c.num_stages),
                        "num_ctas": int(c.num_ctas or 1), "maxnreg": c.maxnreg,
                        "pre_hook": _function_name(c.pre_hook, module, "a Config pre_hook", where)})
    prune: dict[str, Any] = {}
    if tuner.early_config_prune is not None:
        prune["early_config_prune"] = _hook_name(tuner.early_config_prune, module)
    if tuner.perf_model is not None:
        prune["perf_model"] = _hook_name(tuner.perf_model, module)
        prune["top_k"] = tuner.configs_top_k
    hooks = {}
    if tuner.user_defined_pre_hook:
        hooks["pre_hook"] = _function_name(tuner.pre_hook, module, "the autotune pre_hook", where)
    if tuner.user_defined_post_hook:
        hooks["post_hook"] = _function_name(tuner.post_hook, module, "the autotune post_hook", where)
    return AutotuneInfo(configs=configs, key=list(tuner.keys), reset_to_zero=list(tuner.reset_to_zero),
                        restore_value=list(tuner.restore_value), prune=prune, hooks=hooks), heuristics


def host_dtype(value: Any) -> Any:
    """``value`` as Triton takes it: a ``tl.<name>`` text (a HostDtype, or the same text read back from JSON) is
    that ``triton.language`` type, anything else is itself. For the build and development mode, which have
    Triton."""
    if isinstance(value, str) and value.startswith("tl.") and value[3:] in HOST_DTYPES:
        import triton.language as tl

        return getattr(tl, value[3:])
    return value


def as_host_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A kernel call's arguments with Triton's element types as the runtime's (``as_host_value``): what project
    helper modules, which run with Triton itself at build time and in development mode, pass where the wheel's host
    code passes the runtime's (Liger's ``torch_to_triton_dtype[x.dtype]`` as a constexpr). The same objects where
    there is none (a type check per argument)."""
    if any(type(v).__name__ == "dtype" and type(v).__module__.startswith("triton") for v in (*args, *kwargs.values())):
        return tuple(map(as_host_value, args)), {k: as_host_value(v) for k, v in kwargs.items()}
    return args, kwargs


def as_host_value(value: Any) -> Any:
    """A value read from Triton on the build machine (a config's keyword argument) as the index writes it: a
    ``triton.language`` element type as its HostDtype (the inverse of ``host_dtype``), anything else as itself."""
    if type(value).__name__ == "dtype" and type(value).__module__.startswith("triton.language"):
        attr = next((a for a, short in HOST_DTYPES.items() if short == value.name), None)
        if attr is not None:
            return HostDtype(f"tl.{attr}")
    return value
