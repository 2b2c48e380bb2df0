"""The ``triton`` name inside packaged host code: the host-side helpers only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from . import names  # noqa: F401  (keeps the package's attribute host_triton this module's object: names._Runtime)
from .errors import ForgeRuntimeError
from .host_language import HOST_DTYPES, HostDtype, _HostLanguage, host_constexpr, host_language  # noqa: F401
from .host_values import SmallTriton
from .rules import (  # noqa: F401  (host helpers every path shares)
    _SCRATCH_ALIGN,
    SCRATCH_ALLOCATOR,
    SIZE_HINTS,
    _SizeHints,
    cdiv,
    next_power_of_2,
    scratch_buffer,
    set_allocator,
)


@contextlib.contextmanager
def hinted_sizes(scale: int = 1) -> Iterator[set[int]]:
    """Host code's ``triton.next_power_of_2(n)`` of a symbolic size (torch.compile with dynamic shapes,
    torch.export with ``Dim``) gives the power of two of the size's example value (times ``scale``; 0: of the
    smallest size) and records it, instead of ``int(n)``, which would make torch specialize the size to that value
    (a recompile for every other size, an export error). Such a value picks a block size for a launch the fake
    implementation skips; ``torch_ops.fake_call`` checks that it reaches no output. Yields the values given."""
    previous = SIZE_HINTS.values, SIZE_HINTS.scale
    given: set[int] = set()
    SIZE_HINTS.values, SIZE_HINTS.scale = given, scale
    try:
        yield given
    finally:
        SIZE_HINTS.values, SIZE_HINTS.scale = previous


class KernelSide(str):
    """What shipped host code binds where its file defines Triton code the package has no binary of: a
    ``@triton.jit`` function the manifest does not list, ``exp = tl.exp``... Importable, as a package ``__init__``
    that re-exports it needs (FLA's ``from fla.ops.utils.softplus import softplus``); calling or launching it raises.
    Its text, ``jit:<module's last name>.<name>``, is what a kernel's constexpr holds where host code passes such a
    function (SGLang's ``SCORE_MOD=score_mod``): the build compiles a binary per function under that text, and the
    wheel's call matches it as any string constexpr."""

    name: str
    module: str
    file: str | None

    def __new__(cls, name: str, module: str, file: str | None = None) -> KernelSide:
        side = super().__new__(cls, f"jit:{module.rpartition('.')[2]}.{name}")
        side.name, side.module, side.file = name, module, file
        return side

    def __repr__(self) -> str:
        return f"<Triton code {self.module}.{self.name}, not packaged>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:

        raise ForgeRuntimeError(f"{self.module}.{self.name} is Triton code that the package does not ship: packaged "
                                "host code runs without Triton, and only the kernels listed in the package's "
                                "kernel_manifest.toml are built (a kernel needs an entry there)")

    __getitem__ = __call__


def _built_with() -> str:
    """The version of the Triton that compiled the package's binaries (its build record); in forge-aot's own copy,
    while a build runs host code, the Triton it compiles with."""
    import json
    import os

    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "_forge", "build_info.json"), "rb") as f:
            return str(json.load(f)["triton_version"])
    except OSError:
        from importlib.metadata import version

        return version("triton")


class TensorWrapper:
    """``triton.reinterpret(tensor, tl.float8e4nv)`` (FBGEMM's fp8 matmuls on uint8 storage): the tensor, typed as
    that element type where a kernel takes it, as Triton's own wrapper is."""

    def __init__(self, base: Any, dtype: Any) -> None:
        self.base, self.dtype, self.device, self.shape = base, dtype, base.device, base.shape

    def data_ptr(self) -> int:
        return self.base.data_ptr()

    def __getattr__(self, name: str) -> Any:  # stride, get_device, element_size, untyped_storage...: the base's
        if name == "base":  # (not set yet: a copy being made)
            raise AttributeError(name)
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"TensorWrapper[{self.dtype}]({self.base})"


def reinterpret(tensor: Any, dtype: Any) -> Any:
    """Triton's ``reinterpret``: ``tensor`` typed as ``dtype`` (back to itself where that is its own)."""
    if isinstance(tensor, TensorWrapper):
        return tensor.base if dtype == tensor.base.dtype else TensorWrapper(tensor.base, dtype)
    if not hasattr(tensor, "data_ptr"):
        raise TypeError(f"Cannot reinterpret a {type(tensor)}.")
    return TensorWrapper(tensor, dtype)


class _HostTriton(SmallTriton):
    """Bound to ``triton`` in packaged host code, so ``triton.cdiv`` works and nothing imports Triton: the small
    ``triton`` (``cdiv``, ``next_power_of_2``, ``language``, ``_host_constexpr``, ``set_allocator``) with the rest of
    its host helpers, the rarer ones loaded where first read (``_other``)."""

    HOST_HELPERS = ("cdiv", "next_power_of_2", "runtime", "set_allocator", "__version__", "heuristics", "Config",
                    "autotune", "reinterpret", "TensorWrapper")

    LAZY = ("runtime", "_wrap_triton", "_triton_op", "_custom_op", "_op_name", "_ops_namespace",
            "_namespace")
    """From ``host_driver``, loaded where host code first reads them: ``triton.runtime.driver`` and torch.library's
    Triton entry points (see sourcesplit.TORCH_TRITON), which most host code never touches."""

    def __init__(self) -> None:
        super().__init__()
        self.set_allocator, self._host_constexpr = set_allocator, host_constexpr
        self.reinterpret, self.TensorWrapper = reinterpret, TensorWrapper

    def _other(self, name: str) -> Any:
        if name == "tools":  # ``from triton.tools.tensor_descriptor import TensorDescriptor`` (see sourcesplit)
            from .descriptors import tools_module

            return tools_module()
        if name == "__version__":  # FLA's version checks: the Triton the package's binaries were compiled with
            return _built_with()
        if name in ("heuristics", "Config", "autotune"):  # a kernel's decorators applied in host code
            from . import host_decorators

            return getattr(host_decorators, "HostConfig" if name == "Config" else name)
        if name in self.LAZY:
            from . import host_driver

            return host_driver.HOST_RUNTIME if name == "runtime" else getattr(host_driver, name)
        helpers = ", ".join("triton." + h for h in self.HOST_HELPERS if h != "runtime")
        raise AttributeError(f"packaged host code may use {helpers} only (and triton.runtime.driver, "
                             f"triton.language's element types, triton.tools.tensor_descriptor), not triton.{name}")


host_triton = _HostTriton()
