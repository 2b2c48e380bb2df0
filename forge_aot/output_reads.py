"""Host code that reads what a recorded launch wrote: the trace records launches without running them, so such a
value is whatever the buffer held before (native-sparse-attention's topk backward sizes ``BLOCK_SIZE_N`` from
``cu_topk_q_count.max().item()``, which ``count_kernel`` has just written: the build saw 0 and built
``BLOCK_SIZE_N=1`` only, and every GPU call of that backward failed). Nothing can give the GPU's value on the CPU;
the build says where it happens, so the manifest can list what the GPU needs.

``OutputReads`` follows the launches' written tensors (by storage) through the torch calls host code makes on them
(results of a call given such a tensor are such tensors) and records where host code turns one into Python values
(``.item()``, ``.tolist()``, ``int()``, ``bool()``, a size given to a factory...). It watches the examples'
torch calls through ``ongpu.watching_torch_calls``."""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any

DATA_READS = frozenset({"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "__complex__", "numpy",
                        "equal", "allclose"})
"""Torch calls that hand host code a tensor's values as Python values."""
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "randperm",
                       "empty_strided", "linspace", "new_zeros", "new_ones", "new_empty", "new_full", "eye"})
"""Torch calls whose tensor arguments are read as sizes or ranges (``torch.zeros(h, counts[-1])``): their results
hold none of those values."""
_IN_PLACE_ALSO = frozenset({"__setitem__", "copy_"})


def _tensors(value: Any, depth: int = 0) -> Iterable[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 2 and isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth + 1)


def _storage(t: Any) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # (a tensor subclass, or one without storage)
        return 0


class OutputReads:
    """What recorded launches wrote, followed through host code's torch calls; where host code read it."""

    def __init__(self, host_files: Callable[[str], bool]) -> None:
        self.host_files = host_files
        """Whether a file is the project's host code (where a read is reported)."""
        self.written: dict[int, tuple[tuple[str, ...], list[Any]]] = {}
        """Storage address -> the kernels whose recorded launches wrote it (or what it was computed from), and weak
        references to the tensors seen on it: once all are gone the address may be another tensor's (the allocator
        reuses it), and it no longer counts."""
        self.reads: dict[tuple[str, tuple[str, ...]], str] = {}
        """(host location, kernels) -> what read it (first seen), in the order seen."""

    def launched(self, kernel: str, tensors: Iterable[Any]) -> None:
        """A recorded launch of ``kernel`` would write ``tensors``."""
        for t in tensors:
            ptr = _storage(t)
            if ptr:
                kernels = self._kernels(ptr)
                if kernel in kernels:
                    self.written[ptr][1].append(weakref.ref(t))
                else:
                    refs = self.written[ptr][1] if kernels else []
                    self.written[ptr] = (tuple(sorted({*kernels, kernel})), [*refs, weakref.ref(t)])

    def _kernels(self, ptr: int) -> tuple[str, ...]:
        entry = self.written.get(ptr)
        if entry is None:
            return ()
        alive = [r for r in entry[1] if r() is not None]
        if not alive:  # (its tensors are gone: the address may be a new allocation's)
            del self.written[ptr]
            return ()
        entry[1][:] = alive
        return entry[0]

    def _writers(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
        found: set[str] = set()
        for t in (*_tensors(args), *_tensors(kwargs)):
            found.update(self._kernels(_storage(t)))
        return tuple(sorted(found))

    def __call__(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if not self.written:
            return
        writers = self._writers(args, kwargs)
        if not writers:
            return
        name = getattr(func, "__name__", "")
        if name in DATA_READS or name in FACTORIES:
            where = self._where()
            if where is not None:
                self.reads.setdefault((where, writers), f".{name}()" if name in DATA_READS else f"torch.{name}(...)")
            if name in FACTORIES:
                return
        self.launched_from(writers, _tensors(out))
        if args and (name in _IN_PLACE_ALSO or (name.endswith("_") and not name.startswith("_"))):
            self.launched_from(writers, _tensors(args[:1]))

    def launched_from(self, writers: tuple[str, ...], tensors: Iterable[Any]) -> None:
        for kernel in writers:
            self.launched(kernel, tensors)

    def _where(self) -> str | None:
        frame = sys._getframe(2)
        while frame is not None:
            if self.host_files(frame.f_code.co_filename):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back  # type: ignore[assignment]
        return None

    def warnings(self, root: str | None) -> list[str]:
        """One warning per place host code read such values."""
        out = []
        for (where, writers), what in self.reads.items():
            shown = os.path.relpath(where, root) if root else where
            out.append(f"{shown}: host code reads values ({what}) that {', '.join(writers)} "
                       f"{'writes' if len(writers) == 1 else 'write'}; the build records launches without running "
                       "them, so it read what the buffer held before: what host code derives from that (block "
                       "sizes, shapes, grids) follows it, not the GPU's results; where a launch's constexprs follow "
                       "from it, list the values a GPU run needs (kernels.NAME.constexprs)")
        return out
