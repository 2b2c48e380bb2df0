"""The runtime's bytecode bundle (see the package's ``__init__``, which reads it and runs LEAN's modules from it):
serving its other modules, and writing it.

The bundle holds the modules of ``BUNDLED`` compiled from their sources as the import system compiles them
(``compile(..., dont_inherit=True)`` at the interpreter's optimisation level), less what no code reads at run time:
the docstrings of functions and classes, string statements documenting attributes, the annotations of
functions' parameters and results (with ``from __future__ import annotations`` they are strings only ``help()``
shows), and the columns of each instruction's position (PEP 657: the carets under a traceback's line; what
``python -X no_debug_ranges`` leaves out). Each module keeps its own docstring, its line numbers (tracebacks and
``inspect`` read the shipped file) and every annotated assignment. The bundle is 16% smaller for the first three and
8% more for the columns (a tenth of a first call's unmarshalling), and loading it is what a fresh process's
first call spends most on (scripts/probe_first_call_coverage.py).
"""

from __future__ import annotations

import _imp
import ast
import contextlib
import marshal
import os
import sys
import threading
from importlib.machinery import ModuleSpec, SourceFileLoader
from importlib.util import MAGIC_NUMBER, module_from_spec
from typing import Any

from . import BUNDLE_FORMAT, LEAN, source

BUNDLED = (*LEAN, "entry", "custom_ops", "torch_ops", "errors", "host_triton", "packing", "rules", "tables", "drivers",
           "cuda", "fastpath", "cold_launch", "cold", "cold_binding", "exports", "kernel", "launch", "host_modules",
           "host_exec", "local_imports", "expressions", "names")
"""The modules ``import <package>`` and a first call import (``hip`` loads as needed; ``custom_ops``, ``torch_ops``
when an op is first traced or ``torch.ops.<package>`` used; ``local_imports``, ``expressions`` where needed)."""
FIRST_CALL = ("exports", "entry", "packing", "rules", "drivers", "fastpath", "cuda", "cold_launch", "cold",
              "host_exec", "cold_binding")
"""A full-runtime first call's modules where its kernels are plain (``cold``), in the order they import each other:
run at import from the bundle where the full runtime serves from import on (``run_first_call``). The others load
from the bundle on first need, as all do after a lean package's hand-over."""


# -- serving -----------------------------------------------------------------------------------------------------

def spec(finder: Any, name: str) -> Any:
    """The spec of bundled module ``name`` for the package's finder (``_Finder``), or None (the import system then
    finds its file): on the first ask, every held module's file is checked against the size and modification time
    the bundle recorded; where any changed, none is served and the bundle is written again (``first_call_done``)."""
    held = finder.held
    if not finder.checked:
        try:
            fresh = all((st.st_mtime_ns, st.st_size) == (mtime_ns, size) for st, (mtime_ns, size, _) in
                        ((os.stat(source(n)), entry) for n, entry in held.items()))
        except OSError:
            fresh = False
        if not fresh:
            held.clear()
            sys.modules[__package__].BUNDLE_WANTED = True
        finder.checked = True
    entry = held.pop(name, None)  # taken once: the bundle's memory goes as the modules load
    if entry is None:
        return None
    fullname = f"{__package__}.{name}"
    origin = source(name)
    found = ModuleSpec(fullname, _BundleLoader(fullname, origin, entry[2]), origin=origin, loader_state="bundle")
    found.has_location = True  # __file__ and __cached__ as for the module's own file
    return found


class _BundleLoader(SourceFileLoader):
    """The import system's own loader for a module's file, with the module's code taken from the bundle (its file
    name fixed in it, as the import system does); its own way where the bundle's bytes do not load."""

    def __init__(self, fullname: str, path: str, code: Any) -> None:
        super().__init__(fullname, path)
        self.code = code

    def get_code(self, fullname: str) -> Any:
        data, self.code = self.code, None
        if data is not None:
            try:
                code = marshal.loads(data)
            except (ValueError, EOFError, TypeError):
                code = None
            if code is not None:
                _imp._fix_co_filename(code, self.path)
                return code
        return super().get_code(fullname)


def run_first_call() -> None:
    """Run FIRST_CALL's bundled modules now, as the import system would, without its finders and locks: only under
    ``import <package>``'s import lock (``lean.load_package``), where no other thread imports from the package.
    A module that fails is left to the import system, whose import then raises as it would."""
    from . import _Finder

    finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
    package = sys.modules[__package__]
    for name in FIRST_CALL if finder is not None else ():
        fullname = f"{__package__}.{name}"
        found = None if fullname in sys.modules else spec(finder, name)
        if found is None:  # imported already (by a module before), or not in the bundle
            continue
        module = module_from_spec(found)
        sys.modules[fullname] = module
        try:
            found.loader.exec_module(module)
        except Exception:
            sys.modules.pop(fullname, None)
            continue
        setattr(package, name, module)


# -- writing -----------------------------------------------------------------------------------------------------


def _is_doc(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


class _Strip(ast.NodeTransformer):
    """Leaves out docstrings, attribute docstrings and function annotations (see the module's docstring)."""

    def _body(self, node: Any) -> Any:
        self.generic_visit(node)
        body = [s for s in node.body if not _is_doc(s)]
        node.body = body or [ast.copy_location(ast.Pass(), node.body[0])]
        return node

    def visit_FunctionDef(self, node: Any) -> Any:
        node.returns = None
        for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg,
                    node.args.kwarg):
            if arg is not None:
                arg.annotation = None
        return self._body(node)

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = _body


def module_bytecode(path: str) -> bytes:
    """A runtime module's marshalled code as the bundle holds it (see the module's docstring)."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    tree.body = [tree.body[0]] + [s for s in tree.body[1:] if not _is_doc(s)] if tree.body else []
    tree = _Strip().visit(tree)  # the module's own docstring, tree.body[0], is a string statement it keeps
    for node in ast.walk(tree):  # lines only: -1 columns on one line are written as "no column" entries
        if "col_offset" in node._attributes:
            node.col_offset = node.end_col_offset = -1
            node.end_lineno = node.lineno
    return marshal.dumps(compile(tree, path, "exec", dont_inherit=True))


def write(path: str, fingerprint: str) -> bool:
    """Write the bundle of BUNDLED's modules (from their files) to ``path``, atomically, with the permissions Python
    gives a .pyc. Never raises; returns whether it wrote (False at once where the directory
    is not writable: a read-only or another user's installation)."""
    directory = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK):
            return False
        table, chunks, offset = [], [], 0
        for name in BUNDLED:
            st = os.stat(source(name))
            code = module_bytecode(source(name))
            table.append((name, st.st_mtime_ns, st.st_size, offset, len(code)))
            chunks.append(code)
            offset += len(code)
        header = marshal.dumps((fingerprint, table))
        # As the import system writes a .pyc: the source's permissions (owner-writable, umask applied), a
        # private temporary name, then one rename.
        mode = (os.stat(source("_bundle")).st_mode | 0o200) & 0o666
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_EXCL | os.O_CREAT | os.O_WRONLY, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(BUNDLE_FORMAT + MAGIC_NUMBER + len(header).to_bytes(4, "little") + header + b"".join(chunks))
        os.replace(tmp, path)
        return True
    except Exception:  # imports stay the import system's own
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
