"""Running a shipped file of host code (a host module, a project module) as the import system would, with what it needs
bound before its first line, and the package index without its kernels. Both bindings (``cold_binding``, the full
``host_modules``) and the project modules' loader (``local_imports``) run files through here, so a first call through
cold handles loads neither ``host_modules`` nor ``tables``, and the set-up is written once. Imports: stdlib, ``basics``,
``host_values``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from .basics import INDEX_FORMAT
from .host_values import SmallTriton, small_triton  # noqa: F401  (one per process)


def host_file_module(module_name: str, filename: str) -> types.ModuleType | None:
    """The module of a shipped file as the import system makes it (spec, loader, ``__file__``), not yet run; None
    where Python cannot load such a file."""
    spec = importlib.util.spec_from_file_location(module_name, filename)
    if spec is None or spec.loader is None:
        return None
    return importlib.util.module_from_spec(spec)


def run_host_file(module: types.ModuleType, bound: dict[str, Any], builtins: dict[str, Any] | None = None,
                  package: str | None = None, aliases: tuple[str, ...] = (), compiles: bool = False,
                  code: Any = None) -> None:
    """Run a host file's module (``host_file_module``) with ``bound`` in its namespace before its first line (kernel
    handles, ``triton``, the build's hooks). ``builtins``: the import rules of code that imports project modules
    (``local_imports.local_builtins``); ``package``: the ``__package__`` its relative imports resolve against (a kernel
    file inside a package); ``aliases``: the other names project code imports the file by, which are this module
    from before its first line (as a module importing itself back finds it), set on their packages after it;
    ``compiles``: the code names
    ``torch.compile`` (``run_module_code``); ``code``: the code to run instead of the file's (development mode: the
    host code taken from the kernel file). On failure no name of the module stays in ``sys.modules``."""
    namespace = module.__dict__
    namespace.update(bound)
    if builtins is not None:
        namespace["__builtins__"] = builtins
    if package is not None:
        namespace["__package__"] = package
        spec = module.__spec__
        if spec is not None and spec.parent != package and spec.origin:
            # Relative imports resolve against the spec's package (Python 3.12 warns where ``__package__`` says
            # otherwise; later versions read the spec alone): a spec named in the file's package, as ``python -m``
            # gives ``__main__`` the spec of its module. The module keeps its name.
            stem = os.path.splitext(os.path.basename(spec.origin))[0]
            name = next((a for a in aliases if a.rpartition(".")[0] == package), f"{package}.{stem}")
            spec = importlib.util.spec_from_file_location(name, spec.origin)
            if spec is not None:
                module.__spec__, module.__loader__ = spec, spec.loader
    names = (module.__name__, *aliases)
    for name in names:
        sys.modules[name] = module
    try:
        if code is not None:
            exec(code, namespace)
        else:
            run_module_code(module.__spec__.loader, module, compiles)
    except BaseException:
        for name in names:
            if sys.modules.get(name) is module:
                del sys.modules[name]
        raise
    for alias in aliases:  # as the import system sets a submodule on its package (a.b.c)
        parent, _, child = alias.rpartition(".")
        if parent in sys.modules and not hasattr(sys.modules[parent], child):
            setattr(sys.modules[parent], child, module)


def bind_pre_hooks(module: types.ModuleType, filename: str, hooks: Any) -> None:
    """Bind the config pre-hooks of a host module's kernel handles (``triton.Config(pre_hook=...)``: functions of the
    module, by name): ``hooks`` gives (handle, its pre-hooks' names) pairs. A name that is no host function (one that
    uses Triton, which the packaged host code leaves out) raises ``ForgeRuntimeError`` naming it."""
    side = sys.modules.get(f"{__package__}.host_triton")  # (a file's kernel-side stand-ins exist only once loaded)
    kernel_side_class = side.KernelSide if side is not None else ()
    for handle, names in hooks:
        for hook in names:
            fn = module.__dict__.get(hook)
            if not callable(fn) or isinstance(fn, kernel_side_class):
                from .errors import ForgeRuntimeError

                why = "uses Triton, so the packaged host code leaves it out" if callable(fn) else \
                    "is not a function of the host module"
                raise ForgeRuntimeError(f"{filename}: config pre-hook '{hook}' of {handle.function} {why}")
            handle.pre_hooks[hook] = fn


def run_module_code(loader: Any, module: types.ModuleType, compiles: bool) -> None:
    """Run a shipped module's code as ``loader.exec_module`` would, with two of torch's compiler entry points swapped
    while it runs (``swapped``: a global swap, which other threads see meanwhile). ``torch.compiler.disable``, where
    ``torch._dynamo`` is not imported yet, is ``lazy_disable``: FLA marks its ops and its backend dispatch so at import,
    and the real one imports ``torch._dynamo``, with Triton through it where installed (4.1 - 4.4 s of an FLA op's
    first call on an H200). Where the code names ``torch.compile`` (the build's word: ``compiles``) and the process
    has no Triton, ``torch.compile`` gives the function back as it is (as a decorator too): Cut Cross-Entropy's
    ``@torch.compile(fullgraph=True)`` helpers, in a host module or a project module, would need Triton for the GPU
    (Inductor's code generation) at their first call, in the backward, and the wheel runs without Triton, so they run
    eagerly. With Triton installed they stay compiled helpers."""
    code = loader.get_code(getattr(loader, "name", module.__name__))  # (the spec's name: see run_host_file)
    torch = sys.modules.get("torch")
    with contextlib.ExitStack() as swaps:
        compiler = getattr(torch, "compiler", None) if "torch._dynamo" not in sys.modules else None
        if getattr(compiler, "disable", None) is not None:
            swaps.enter_context(swapped(compiler, "disable", lazy_disable))
        if compiles and importlib.util.find_spec("triton") is None:
            import torch

            swaps.enter_context(swapped(torch, "compile", _eager_compile))
        exec(code, module.__dict__)


def _eager_compile(model: Any = None, **options: Any) -> Any:
    return (lambda fn: fn) if model is None else model


_SWAPS: dict[tuple[int, str], list[Any]] = {}
_SWAP_LOCK = threading.Lock()


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` while any thread runs inside (nested or at once: the first in swaps it, the last
    out puts the original back, so two threads never restore each other's swap)."""
    key = (id(owner), name)
    with _SWAP_LOCK:
        entry = _SWAPS.get(key)
        if entry is None:
            entry = _SWAPS[key] = [0, getattr(owner, name)]
            setattr(owner, name, value)
        entry[0] += 1
    try:
        yield
    finally:
        with _SWAP_LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                setattr(owner, name, entry[1])
                del _SWAPS[key]


def lazy_disable(fn: Any = None, recursive: bool = True, **options: Any) -> Any:
    """``torch.compiler.disable`` in shipped code run before ``torch._dynamo`` is imported (``run_module_code``): a
    function wrapped without importing it (anything else, or once ``torch._dynamo`` is imported: the real one). The
    wrapper carries Dynamo's marks (a compiled caller does not inline it, ``fullgraph=True`` refuses it, as with the
    real one) and Dynamo never compiles its frame (``_skipped_by_dynamo``); called while ``torch._dynamo`` is still
    not imported (so nothing can be compiling), it calls the function; from the first call after, the real
    ``torch._dynamo.disable`` of it, made then."""
    if fn is None:  # (``@torch.compiler.disable(recursive=False)``)
        return lambda f: lazy_disable(f, recursive, **options)
    if "torch._dynamo" in sys.modules or not isinstance(fn, types.FunctionType):  # (a class, a module: the real one)
        import torch._dynamo

        return torch._dynamo.disable(fn, recursive, **options)
    made: list[Any] = []

    def disabled(*args: Any, **kwargs: Any) -> Any:
        if not made:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            import torch._dynamo

            made.append(torch._dynamo.disable(fn, recursive, **options))
        return made[0](*args, **kwargs)

    _skipped_by_dynamo(disabled.__code__)
    functools.update_wrapper(disabled, fn)
    disabled._torchdynamo_disable = True  # type: ignore[attr-defined]
    disabled._torchdynamo_disable_msg = options.get("reason")  # type: ignore[attr-defined]
    disabled._torchdynamo_disable_recursive = recursive  # type: ignore[attr-defined]
    return disabled


@functools.cache
def _skipped_by_dynamo(code: types.CodeType) -> None:
    """Dynamo never compiles ``lazy_disable``'s wrapper (one code object for every wrapper: compiled, it would be
    recompiled per function, past Dynamo's limit), as the real wrapper's code is skipped; through torch's C module,
    which does not import ``torch._dynamo`` (``torch._dynamo.eval_frame.skip_code`` does this)."""
    try:
        from torch._C._dynamo import eval_frame

        strategy = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT)
        eval_frame.set_code_exec_strategy(code, strategy)
    except (ImportError, AttributeError, TypeError):  # (a torch without it: compiled per function, still correct)
        pass


def kernel_side(name: str, module: str, file: str | None = None) -> Any:
    """What a shipped file binds where it defines Triton code the package has no binary of
    (``host_triton.KernelSide``, whose module loads on first need)."""
    from .host_triton import KernelSide

    return KernelSide(name, module, file)


_MODULES: dict[str, dict[str, Any]] = {}


def load_modules(root: str) -> dict[str, Any]:
    """The package index without its kernels (``_forge/modules.json``: host modules, project modules, targets), read
    once per package; the whole index where the package has no such file (built by an older forge-aot)."""
    index = _MODULES.get(root)
    if index is None:
        path = os.path.join(root, "_forge", "modules.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                index = json.load(f)
        if index is None or index.get("format") != INDEX_FORMAT:
            from .host_modules import load_index

            index = load_index(root)  # (which names the format it refuses)
        index = _MODULES.setdefault(root, index)
    return index
