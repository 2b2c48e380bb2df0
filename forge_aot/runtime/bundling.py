"""The runtime's bytecode bundle (see ``bundle``, which reads it and serves the modules from it): what it holds, and
writing it.

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

import ast
import contextlib
import marshal
import os
import threading
from importlib.util import MAGIC_NUMBER
from typing import Any

from .bundle import BUNDLE_FORMAT, source

BUNDLED = ("basics", "host_values", "selection", "lean_launch", "lean_kernel", "entry", "custom_ops", "torch_ops",
           "errors", "host_language", "host_triton", "packing", "rules", "tables", "drivers", "cuda", "fastpath",
           "cold_launch", "cold", "cold_binding", "exports", "kernel", "launch", "host_modules", "host_exec",
           "local_imports", "expressions", "names")
"""The modules the full runtime's first call imports (``lean``, imported before the bundle is read, is not among
them; ``hip`` loads as needed; ``custom_ops``, ``torch_ops``
when an op is first traced or ``torch.ops.<package>`` used; ``local_imports``, ``expressions`` where needed)."""


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
