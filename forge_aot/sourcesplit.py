"""Split a kernel source file into its Triton kernels and its host code, without importing it.

The host code is the file with every Triton-only statement blanked out, line for line, so tracebacks from
the packaged ops point at the author's own line numbers. Triton-only statements are the ``@triton.jit``
functions (with any ``@triton.autotune`` / ``@triton.heuristics`` decorators), the Triton imports, and
top-level definitions that use Triton and that no host code reaches (a config-list function used only by a
decorator, a ``tl.constexpr`` constant used only by kernels). In host code the name ``triton`` offers
``cdiv`` and ``next_power_of_2`` only, and each kernel name is bound to a forge-aot handle before the first
line runs.

A ``@triton.heuristics`` decorator is plain Python over the call's arguments: its lines become a host-side
registration ``__forge_heuristics__("kernel", {...})`` at the same line numbers, so the packaged runtime
evaluates the author's own lambdas with Triton's semantics.

A file that guards its Triton use is read as the build, which has Triton, runs it (``_triton_guard``,
``_kernel_branch``): a ``try`` that only imports Triton and sets flags is its body, and a top-level block whose test
reads Triton's availability or features is the branch the build takes, so the wheel (which has no Triton) neither
takes the library's torch fallback nor misses its kernels.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import itertools
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SourceError
from .runtime import HEURISTICS_HOOK, HOST_DTYPES, KERNEL_SIDE_HOOK, LAUNCH_OPTIONS, HostDtype, _HostTriton

_DECORATORS = {"jit": "jit", "autotune": "autotune", "heuristics": "heuristics",
               # Gluon kernels (triton.experimental.gluon): kernel-side like any other, left out of host code
               "gluon.jit": "jit", "experimental.gluon.jit": "jit"}
_WRAPPING_DECORATORS = {"autotune", "heuristics"}
"""Names of Triton's decorators that wrap a ``@triton.jit`` function: bound to another module's object, such a
decorator on a function with no ``@triton.jit`` is host code's own (a ``jit`` of a library's is taken for
Triton's, as a wrapper of it would be)."""


class _ComputedDefault:
    """A parameter default the source does not spell as a value (vLLM's prefix_prefill: ``FP8_MIN: tl.constexpr =
    float8_info.min``, ``float8_info = torch.finfo(...)`` at import): the plan reads it from the imported kernel."""

    def __repr__(self) -> str:
        return "COMPUTED_DEFAULT"


COMPUTED_DEFAULT: Any = _ComputedDefault()


@dataclass(frozen=True)
class KernelParam:
    name: str
    constexpr: bool
    default: Any = None
    """The default's value, or COMPUTED_DEFAULT where Python computes it when the ``def`` runs."""
    has_default: bool = False
    annotation_type: str = ""
    """The scalar type an annotation gives it (``stride: tl.int64`` → ``i64``, ``n: int`` → ``i32``), which Triton's
    JIT compiles it as whatever the call passes (``KernelParam.annotation_type``); empty for none."""


@dataclass(frozen=True)
class LaunchSite:
    """One ``kernel[grid](...)`` call in host code, as written."""

    kernel: str
    function: str
    """The host function it is in."""
    line: int
    positional: int
    keywords: tuple[str, ...]
    star_args: bool
    """Whether the call spreads ``*args`` or ``**kwargs`` (what it passes is then unknown to ``check``)."""
    star_kwargs: bool = False
    """Whether it spreads ``**kwargs`` (the keywords it passes are unknown: launch options among them)."""
    conditional: bool = False
    """Whether a branch, loop or ``try`` of its host function holds it (FBGEMM's ``if tma_persistent:``)."""
    qualname: str = ""
    """The def holding it, where that is a method or a nested def (attorch's ``ActFuncAutoGrad.backward``); empty
    where it is ``function`` itself."""
    path: str = ""
    """The file, where it is not the kernel's own (an op file launching a kernel it imports)."""
    grid_sets: tuple[str, ...] = ()
    """Keys the launch's grid function assigns in the dict it gets (vLLM's ``META["batch_ptr"] = ...``): Triton
    launches with what it puts there."""


@dataclass(frozen=True)
class KernelSource:
    """One Triton kernel of a file and its decorators, outermost first."""

    name: str
    line: int
    params: list[KernelParam]
    decorators: tuple[str, ...]
    """``autotune``, ``heuristics`` and ``jit`` in source order (outermost first)."""
    do_not_specialize: tuple[str, ...] | None = ()
    """Parameters named in ``@triton.jit(do_not_specialize=...)`` (names or indices resolved to names); None where
    the decorator computes them (read from the imported kernel: ``introspect.read_do_not_specialize``)."""
    writes: tuple[str, ...] = ()
    """Parameters the kernel may write through (``tl.store``, atomics, a descriptor's ``store``; see
    ``_pointer_flow``): what makes an op that passes a tensor there mutate it."""
    writes_when: tuple[tuple[tuple[tuple[str, bool], ...], tuple[str, ...]], ...] = ()
    """``writes`` for each combination of the constexpr flags the kernel branches on (FlashInfer's ``rms_norm``
    stores to ``o_ptr if HAS_OUTPUT else x_ptr``): empty where no flag changes them (``writes_for``)."""
    writes_through: tuple[tuple[str, tuple[tuple[int | str, tuple[str, ...]], ...]], ...] = ()
    """What the kernel hands to a function-valued constexpr it calls (SGLang's ``SCORE_MOD(qk, Aux0, ...)``): per
    such parameter, each argument slot of its calls (position or keyword) with the parameters that may point there.
    Which of them are written depends on the function a launch passes (``writes_for``); ``writes`` and
    ``writes_when`` leave them out, ``all_writes`` counts them."""
    rewrapped: bool = False
    """Whether host code wraps the kernel again after its def in a call that is not Triton's own (Cut
    Cross-Entropy's ``K = cce_forward_autotune()(K)``): its decorators are then read from the kernel Triton builds
    (``introspect.read_decorators``), the line stays host code."""
    autotune_line: int = 0
    """The line of the ``autotune`` decorator (0: none)."""

    def writes_for(self, named: dict[str, Any],
                   function_writes: Callable[[Any], frozenset[int | str] | None] | None = None) -> tuple[str, ...]:
        """The parameters a launch with these arguments (by name) may write through: ``writes`` for the values it
        passes to the flags it branches on, all of them where it passes no bool to one; with what it hands to a
        function-valued constexpr where that function writes it (``function_writes``: the argument slots the value
        passed writes, None where unknown: then all), or all of that without ``function_writes``."""
        found = next((w for flags, w in self.writes_when
                      if all(isinstance(named.get(n), bool) and named[n] is v for n, v in flags)), self.writes)
        return self.with_writes_through(found, [named.get(p) for p, _ in self.writes_through], function_writes)

    def with_writes_through(self, writes: tuple[str, ...], functions: list[Any],
                            function_writes: Callable[[Any], frozenset[int | str] | None] | None = None,
                            ) -> tuple[str, ...]:
        """``writes`` and the parameters handed to each function-valued constexpr where the function passed there
        (``functions``, in ``writes_through``'s order; None: no call is made) writes them (see ``writes_for``)."""
        more: set[str] = set()
        for (_, slots), value in zip(self.writes_through, functions):
            if value is None:
                continue
            written = function_writes(value) if function_writes is not None else None
            more.update(n for slot, names in slots if written is None or slot in written for n in names)
        return tuple(p.name for p in self.params if p.name in more or p.name in writes) if more else writes

    @property
    def all_writes(self) -> tuple[str, ...]:
        """Every parameter the kernel may write through, whatever function a launch passes."""
        return self.with_writes_through(self.writes, [True] * len(self.writes_through))

    @property
    def autotuned(self) -> bool:
        return "autotune" in self.decorators

    @property
    def has_heuristics(self) -> bool:
        return "heuristics" in self.decorators


@dataclass(frozen=True)
class SourceFile:
    """A kernel file, parsed."""

    path: Path
    kernels: dict[str, KernelSource]
    """Triton kernels by name."""
    host_source: str
    """The file with Triton-only statements blanked (same number of lines)."""
    host_functions: frozenset[str]
    """Functions and classes defined by the host code, and the ``NAME = Cls.apply`` of its autograd Functions."""
    kernel_refs: dict[str, frozenset[str]]
    """For each host function: the kernels it names."""
    launches: tuple[LaunchSite, ...] = ()
    """Every ``kernel[grid](...)`` call of the host code."""
    function_lines: dict[str, tuple[int, int]] = field(default_factory=dict)
    """First and last line of each top-level host function (to leave build-only helpers out of the wheel)."""
    names_used: dict[str, frozenset[str]] = field(default_factory=dict)
    """For each top-level host function: every name it reads (to keep the helpers shipped code calls)."""
    reads_device: bool = False
    """Whether host code asks about the device (see ``asks_device``)."""
    mutating_ops: dict[str, str] = field(default_factory=dict)
    """Host functions decorated ``@triton_op(..., mutates_args=...)`` that write arguments: the names given."""
    host_classes: frozenset[str] = frozenset()
    """The classes among ``host_functions`` (an op must be a function: a class goes to ``[exports]``)."""
    branch_kernels: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Kernels defined in the branch of a top-level block that guards Triton, with the block's line and the branch's
    first and last lines (the file is read with that branch in the block's place: ``_flatten_kernel_branches``)."""

    def reachable(self, roots: set[str]) -> set[str]:
        """The top-level host functions ``roots`` name, directly or through each other, and the roots."""
        kept = set(roots)
        todo = list(kept)
        while todo:
            for name in self.names_used.get(todo.pop(), frozenset()) & self.function_lines.keys():
                if name not in kept:
                    kept.add(name)
                    todo.append(name)
        return kept

    def shipped_source(self, leave_out: set[str]) -> str:
        """The host source with the named top-level functions blanked too (e.g. build-time example runners),
        except those a function that stays reaches by name (a tuning op the exported op also calls)."""
        kept = self.reachable(set(self.function_lines) - leave_out)
        lines = _split_lines(self.host_source, keepends=True)
        for name in leave_out - kept:
            first, last = self.function_lines[name]
            for i in range(first - 1, last):
                lines[i] = "\n"
        return "".join(lines)


TRITON_REEXPORTS = {"triton": "triton", "tl": "triton.language"}
"""Names a module may re-export Triton under (vLLM's kernel files all start ``from vllm.triton_utils import tl,
triton``, a module that hands out Triton or a placeholder), and what each must be."""


def _reexported_aliases(stmt: ast.stmt) -> list[ast.alias]:
    """The ``tl`` / ``triton`` a ``from <module other than Triton> import ...`` binds: Triton itself, re-exported
    (vLLM: ``from vllm.triton_utils import HAS_TRITON, tl, triton``; the build checks that they are)."""
    if not isinstance(stmt, ast.ImportFrom) or _from_triton(stmt):
        return []
    return [a for a in stmt.names if a.name in TRITON_REEXPORTS and a.asname is None]


def _is_triton_reexport(stmt: ast.stmt) -> bool:
    """``from <any module> import tl, triton`` and nothing else: a Triton import."""
    aliases = _reexported_aliases(stmt)
    return bool(aliases) and len(aliases) == len(stmt.names)  # type: ignore[attr-defined]


def _is_triton_module(module: str | None) -> bool:
    return module is not None and (module == "triton" or module.startswith("triton."))


def _from_triton(stmt: ast.ImportFrom) -> bool:
    """``from triton... import``: absolute only (FlashInfer's ``from .triton.page import ...`` is its own
    subpackage ``flashinfer.triton``)."""
    return not stmt.level and _is_triton_module(stmt.module)


def _is_triton_import(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return all(a.name == "triton" or a.name.startswith("triton.") for a in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        return _from_triton(stmt) or _is_triton_reexport(stmt)
    return False


def _block_leaves(stmt: ast.stmt) -> list[ast.stmt] | None:
    """Every statement of every branch of an ``if`` / ``try`` (those of nested ones in their place), or None for
    any other statement."""
    if isinstance(stmt, ast.If):
        bodies = [stmt.body, stmt.orelse]
    elif isinstance(stmt, ast.Try):
        bodies = [stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)]
    else:
        return None
    out: list[ast.stmt] = []
    for inner in (s for body in bodies for s in body):
        out += _block_leaves(inner) or [] if isinstance(inner, (ast.If, ast.Try)) else [inner]
    return out


def _import_block(stmt: ast.stmt) -> list[ast.Import | ast.ImportFrom] | None:
    """The imports of an ``if`` / ``try`` made of nothing but imports (and ``pass``) in every branch, as libraries
    pick an import path by Triton version (Liger-Kernel: libdevice's ``tanh`` under ``compare_version`` with an NGC
    fallback); None for any other statement."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [stmt]
    leaves = _block_leaves(stmt)
    if leaves is None or not all(isinstance(s, (ast.Import, ast.ImportFrom, ast.Pass)) for s in leaves):
        return None
    return [s for s in leaves if isinstance(s, (ast.Import, ast.ImportFrom))]


_PROBE_NAMES = frozenset({"inspect", *dir(__import__("builtins"))})
"""Names a Triton feature probe may use besides Triton's own (``hasattr(triton.language, "gather")``,
``"cache_results" in inspect.signature(triton.autotune).parameters``)."""


def _freeze_triton_probes(text: str, tree: ast.Module, triton_names: set[str]) -> str | None:
    """The source with each Triton feature probe outside kernels replaced by its value under the Triton that builds
    the package (None: none found), and each ``find_spec("triton")`` or ``has_triton()`` by True
    (``_finds_triton``).
    flash-linear-attention's ``fla/utils`` decides ``IS_TMA_SUPPORTED`` by
    ``hasattr(triton.language, 'make_tensor_descriptor')`` and its autotuners' arguments by
    ``inspect.signature(triton.autotune)``: the wheel runs the binaries that Triton compiled, so its answers stand,
    as ``triton.__version__`` does. A probe is an expression that needs Triton (not only the host helpers, which the
    wheel has), names otherwise only builtins and ``inspect``, and whose value is a bool, number, string or None;
    the driver (which answers per GPU) is never one."""
    import builtins
    import inspect

    env: dict[str, Any] = {"inspect": inspect, "__builtins__": builtins}
    imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom)) and _is_triton_import(s)]
    try:
        exec(compile(ast.Module(imports, []), "<triton names>", "exec"), env)
    except Exception:
        return None
    found: list[tuple[ast.expr, Any]] = []

    torch_probes = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module == "torch.utils._triton" for a in n.names if a.name in _TORCH_TRITON_PROBES}

    def visit(node: ast.AST) -> None:
        if _finds_triton(node, torch_probes):  # the build imports Triton: found (a ModuleSpec there: a flag)
            found.append((node, True))
            return
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if isinstance(node, (ast.Call, ast.Compare, ast.BoolOp, ast.UnaryOp)) and names & triton_names \
                and _uses_triton(node, triton_names, driver_ok=False, decorators_ok=False):
            value = _build_time_value(node, env, triton_names | _PROBE_NAMES)
            if value is None or isinstance(value, (bool, int, float, str)):
                found.append((node, value))
                return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in tree.body:
        if not _is_kernel(stmt) and not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            visit(stmt)
    if not found:
        return None
    return _with_values(text, found)


def _with_values(text: str, found: list[tuple[ast.expr, Any]]) -> str:
    """The source with each expression of ``found`` replaced by its value, parenthesized over the same lines, so
    every later line keeps its number (ast's columns count UTF-8 bytes)."""
    lines = [line.encode() for line in _split_lines(text, keepends=True)]
    for node, value in sorted(found, key=lambda f: (f[0].lineno, f[0].col_offset), reverse=True):
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        end = node.end_col_offset if node.end_col_offset is not None else len(lines[last])
        lines[first:last + 1] = [lines[first][:node.col_offset] + f"({value!r}".encode() + b"\n" * (last - first)
                                 + b")" + lines[last][end:]]
    return b"".join(lines).decode()


_TORCH_TRITON_PROBES = ("has_triton", "has_triton_package")
"""``torch.utils._triton``'s tests of whether Triton is there (torchao's kernels are guarded by ``has_triton()``)."""


def _finds_triton(node: ast.AST, torch_probes: set[str]) -> bool:
    """``importlib.util.find_spec("triton")`` (or ``find_spec("triton.language")``, however imported), or
    ``torch.utils._triton.has_triton()`` (``torch_probes``: the names the file imports it under): a test of whether
    Triton is installed (``HAS_TRITON = find_spec("triton") is not None``, as xformers and many utils modules write
    it), which the wheel, with no Triton, must answer as the build did, or its host code takes its fallback."""
    if not isinstance(node, ast.Call):
        return False
    if not node.args and not node.keywords:
        func = node.func
        return (isinstance(func, ast.Name) and func.id in torch_probes) or ast.unparse(func) in {
            f"torch.utils._triton.{name}" for name in _TORCH_TRITON_PROBES}
    return bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
        and node.args[0].value.partition(".")[0] == "triton" \
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "find_spec"


def _kernel_branch(stmt: ast.stmt, wrappers: frozenset[str], decide: Callable[[ast.expr], bool | None] | None = None,
                   ) -> list[ast.stmt] | None:
    """The branch of a top-level block that guards Triton, if ``stmt`` is one: an ``if`` whose test ``decide`` answers
    from Triton's availability and features (``if _HAS_TRITON:``, ``if triton is not None:``, ``if
    TRITON_HAS_REDUCE:`` ... ``else:``: see ``_triton_guard``), the branch it takes where that defines kernels at its
    own level; an ``if`` / ``else`` one of whose branches imports Triton and defines kernels while no other branch
    defines any (bitsandbytes: ``if not is_triton_available():`` a stub op, ``else:`` Triton's imports, the kernel
    and the op); or a ``try`` that does so, its handlers catching ImportError. Else None: a block that neither
    imports Triton nor tests for it (``if DEBUG:`` helper kernels), a ``__main__`` block, a kernel in a handler (the
    path without Triton)."""
    if isinstance(stmt, ast.If) and not _is_main_guard(stmt):
        branches = [stmt.body, stmt.orelse]
    elif isinstance(stmt, ast.Try) and not stmt.orelse and not stmt.finalbody \
            and all(_catches_import_error(h) for h in stmt.handlers):
        branches = [stmt.body, *(h.body for h in stmt.handlers)]
    else:
        return None
    taken = decide(stmt.test) if decide is not None and isinstance(stmt, ast.If) else None
    if taken is not None:  # the branch the build takes, whatever the other defines (a kernel per Triton feature)
        kept = stmt.body if taken else stmt.orelse  # type: ignore[attr-defined]
        if not any(_is_kernel(s, wrappers) for s in kept) or kept[0].lineno == stmt.lineno:
            return None
        return kept
    with_kernels = [b for b in branches if any(_is_kernel(s, wrappers) for s in b)]
    if len(with_kernels) != 1 or with_kernels[0][0].lineno == stmt.lineno:  # ``if c: x`` on one line: left alone
        return None
    kept = with_kernels[0]
    if (isinstance(stmt, ast.Try) and kept is not stmt.body) or not any(_is_triton_import(s) for s in kept):
        return None
    others = [n for b in branches if b is not kept for s in b for n in ast.walk(s)]
    return None if any(isinstance(n, ast.FunctionDef) and _is_kernel(n, wrappers) for n in others) else kept


def _flatten_kernel_branches(text: str, tree: ast.Module, wrappers: frozenset[str],
                             decide: Callable[[ast.expr], bool | None] | None = None,
                             ) -> tuple[str, dict[str, tuple[int, int, int]]]:
    """The source with each top-level block that has a ``_kernel_branch`` replaced by that branch (see
    ``_replace_blocks``), and the kernels so brought to module level, each with the block's line and the branch's
    first and last lines. The build imports the file with Triton and the GPU's answers, so that branch is the one it
    runs (the plan checks, ``plan.check_kernel_branches``); the wheel, which has no Triton, must run it too rather
    than the fallback (bitsandbytes' ``quantize_rowwise`` returning None)."""
    kept = {id(stmt): branch for stmt in tree.body if (branch := _kernel_branch(stmt, wrappers, decide)) is not None}
    moved = {s.name: (stmt.lineno, _first_line(kept[id(stmt)][0]), kept[id(stmt)][-1].end_lineno or 0)
             for stmt in tree.body if id(stmt) in kept for s in kept[id(stmt)]
             if isinstance(s, ast.FunctionDef) and _is_kernel(s, wrappers)}
    return _replace_blocks(text, tree, kept), moved


def _replace_blocks(text: str, tree: ast.Module, kept: dict[int, list[ast.stmt]]) -> str:
    """The source with each top-level block ``kept`` names (by id) replaced by the statements given for it (one of
    its branches), dedented, on the same lines: the other branches and the block's own lines blank, the lines inside
    a string that spans lines as written, so its value stays."""
    lines = _split_lines(text, keepends=True)
    for stmt in tree.body:
        branch = kept.get(id(stmt))
        if branch is None:
            continue
        first, last = _first_line(branch[0]), branch[-1].end_lineno or branch[-1].lineno
        in_string = {line for s in branch for n in ast.walk(s) if isinstance(n, (ast.Constant, ast.JoinedStr))
                     and (not isinstance(n, ast.Constant) or isinstance(n.value, (str, bytes)))
                     for line in range(n.lineno + 1, (n.end_lineno or n.lineno) + 1)}
        indent = branch[0].col_offset
        for i in range(_first_line(stmt) - 1, stmt.end_lineno or stmt.lineno):
            if first - 1 <= i < last:
                line = lines[i]
                if i + 1 not in in_string:
                    lines[i] = line[min(indent, len(line) - len(line.lstrip(" \t"))):]
            else:
                lines[i] = "\n"
    return "".join(lines)


def _triton_guard(text: str, tree: ast.Module, path: Path | None = None,
                  ) -> tuple[str, ast.Module, Callable[[ast.expr], bool | None]]:
    """How the build, which has Triton, reads a file that guards its Triton use, for the wheel (which has none) to
    read it the same way: the source, its tree and the test decider ``_kernel_branch`` takes.

    A top-level ``try`` importing Triton, whose body is nothing but Triton imports (each of which imports here),
    flags set to constants and availability flags, its handlers catching ImportError (or Exception), is replaced by
    its body, as the build runs it (``try: import triton; _HAS_TRITON = True`` / ``except ImportError: _HAS_TRITON =
    False``, or ``triton = None``): else the wheel's copy would run the handler, and host code testing the flag
    would take its fallback. An availability flag is a name the body computes and every handler sets to False
    (DeepSpeed's ``_TRITON_AVAILABLE = any(b.driver.is_active() for b in backends.values())``, which asks the GPU):
    the build imports the file with Triton and the target GPU's answers, so it takes the body and the flag is True,
    and the wheel's copy says True (the plan checks that kernels such a flag guards were defined:
    ``plan.check_kernel_branches``).

    The decider answers a test made of the file's Triton names, the top-level names set before it to values made of
    those (the flags, ``TRITON_HAS_REDUCE = hasattr(tl, "reduce")``), names a project module so sets and the file
    imports (DeepSpeed's kernel files: ``from deepspeed.ops.triton_ops._triton import _TRITON_AVAILABLE, triton, tl``;
    ``path``, the file's own, finds that module) and builtins (``if _HAS_TRITON:``, ``if triton is not None:``,
    ``if _TRITON_AVAILABLE and libdevice is not None:``) with its value here where the file reaches it, or None for
    any other test."""
    text, tree, _, decisions = _guarded_values(text, tree, path, frozenset())

    def decide(test: ast.expr) -> bool | None:
        return decisions.get(id(test))

    return text, tree, decide


def _availability_flags(stmt: ast.Try) -> list[ast.Assign]:
    """The body's ``NAME = <computed>`` statements whose name every handler sets to False (see ``_triton_guard``)."""
    def set_false(handler: ast.ExceptHandler) -> set[str]:
        return {t.id for s in handler.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
                and s.value.value is False for t in s.targets if isinstance(t, ast.Name)}

    false_in_all = set.intersection(*(set_false(h) for h in stmt.handlers))
    return [s for s in stmt.body if isinstance(s, ast.Assign) and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name) and s.targets[0].id in false_in_all and not _literal_assignment(s)]


def _guarded_values(text: str, tree: ast.Module, path: Path | None, seen: frozenset[Path],
                    wanted: frozenset[str] = frozenset()) -> tuple[str, ast.Module, dict[str, Any], dict[int, bool]]:
    """``_triton_guard``'s work: the source and tree read as the build runs them, the values known at the file's
    end (Triton's names, the flags: what a module importing from this one may take, ``wanted`` by it) and the
    value of each top-level ``if`` test known where the file reaches it (by the test's id)."""
    import builtins

    env: dict[str, Any] = {"__builtins__": builtins}

    def imports(stmts: list[ast.stmt]) -> bool:
        try:
            exec(compile(ast.Module(stmts, []), "<triton guard>", "exec"), env)
        except Exception:
            return False
        return True

    def guard_block(stmt: ast.stmt, flags: list[ast.Assign]) -> bool:
        return isinstance(stmt, ast.Try) and not stmt.orelse and not stmt.finalbody and bool(stmt.handlers) \
            and all(_catches_import_error(h) for h in stmt.handlers) \
            and any(_is_triton_import(s) for s in stmt.body) \
            and all((_is_triton_import(s) and not _reexported_aliases(s)) or isinstance(s, ast.Pass)
                    or _literal_assignment(s) or s in flags for s in stmt.body) \
            and imports([s for s in stmt.body if _is_triton_import(s)])

    flags: list[ast.Assign] = []
    for stmt in tree.body:
        own = _availability_flags(stmt) if isinstance(stmt, ast.Try) and stmt.handlers else []
        if own and guard_block(stmt, own):
            flags += own
    if flags:  # each written True: then a literal flag
        text = _with_values(text, [(f.value, True) for f in flags])
        tree = _parse(text)
    kept = {id(stmt): stmt.body for stmt in tree.body if guard_block(stmt, [])}
    if kept:
        text = _replace_blocks(text, tree, kept)
        tree = _parse(text)

    def value(expr: ast.expr) -> Any:
        """Where ``expr`` is a literal or reads a name known so far (Triton's, a flag's), its value; else ``...``
        (the file's other module code is its own import's business, not evaluated again here)."""
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        if names and not names & (env.keys() - {"__builtins__"}):
            return ...
        return _build_time_value(expr, env, env.keys() | set(_VALUE_BUILTINS))

    # the names a project module is read for: those the tests read, the flags they are set from, and ``wanted``
    relevant = set(wanted) | {n.id for s in tree.body if isinstance(s, ast.If) for n in ast.walk(s.test)
                              if isinstance(n, ast.Name)}
    assigned = [(s.targets[0].id, s.value) for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)]
    while True:
        more = {n.id for name, value in assigned if name in relevant for n in ast.walk(value)
                if isinstance(n, ast.Name)} - relevant
        if not more:
            break
        relevant |= more
    decisions: dict[int, bool] = {}  # id of a top-level if's test -> its value where the file reaches it
    for stmt in tree.body:  # in order: Triton's imports, then flags and feature probes (``hasattr(tl, "reduce")``)
        found = value(stmt.test if isinstance(stmt, ast.If) else stmt.value) if isinstance(stmt, ast.If) or (
            isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)) else ...
        if isinstance(stmt, ast.If) and found is not ...:
            decisions[id(stmt.test)] = bool(found)
        for name in _defined_names(stmt):
            env.pop(name, None)  # bound anew: unknown, but for Triton's imports and the values below
        if _is_triton_import(stmt) and not _reexported_aliases(stmt):  # Triton's own modules only
            imports([stmt])
        elif isinstance(stmt, ast.Assign) and (found is None or isinstance(found, (bool, int, float, str))):
            env[stmt.targets[0].id] = found  # type: ignore[attr-defined]
        elif isinstance(stmt, ast.ImportFrom) and path is not None and not _from_triton(stmt) \
                and any((a.asname or a.name) in relevant for a in stmt.names):
            env.update(_project_values(path, stmt, seen))
    return text, tree, env, decisions


def _project_values(path: Path, stmt: ast.ImportFrom, seen: frozenset[Path]) -> dict[str, Any]:
    """What ``from <project module> import ...`` in the file at ``path`` binds that is known in that module as the
    build reads it (``_guarded_values``): its flags and Triton's names, under the names the file gives them."""
    from .localmods import file_module, import_from_target

    target = import_from_target(stmt, file_module(path))
    found = _project_file(path, target) if target and all(a.name != "*" for a in stmt.names) else None
    if found is None or found in seen or len(seen) > 8:  # (a cycle of imports, or a deep chain: undecided)
        return {}
    wanted = frozenset(a.name for a in stmt.names)
    try:
        st = found.stat()
        other = _module_values(found, st.st_mtime_ns, st.st_size, wanted, seen | {found, path.resolve()})
    except OSError:
        return {}
    return {a.asname or a.name: other[a.name] for a in stmt.names if a.name in other}


@functools.lru_cache(maxsize=256)
def _module_values(path: Path, mtime_ns: int, size: int, wanted: frozenset[str], seen: frozenset[Path],
                   ) -> dict[str, Any]:
    """``_project_values``' reading of one module, once per version of its file (a build parses each kernel file
    several times): the ``wanted`` names it knows at its end."""
    try:
        text = path.read_text(encoding="utf-8")
        _, _, env, _ = _guarded_values(text, _parse(text), path, seen, wanted)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    return {name: env[name] for name in wanted if name in env}


_VALUE_BUILTINS = {name: getattr(__import__("builtins"), name) for name in (
    "abs", "all", "any", "bool", "callable", "dict", "dir", "divmod", "float", "frozenset", "getattr", "hasattr", "int",
    "isinstance", "issubclass", "len", "list", "max", "min", "repr", "round", "set", "sorted", "str", "tuple",
    "type")}
"""The builtins a build-time value may call: none that writes, reads files or input, or runs code (``open``,
``print``, ``exec``, ``__import__``...), which the file's own import at build time runs once already."""


def _build_time_value(expr: ast.expr, env: dict[str, Any], allowed: set[str] | Any) -> Any:
    """An expression's value at build time, evaluated in ``env`` with the side-effect-free builtins only, where it
    names only ``allowed`` names, never the driver (which answers per GPU) and defines nothing (no lambda, walrus or
    comprehension); else (or where it raises) ``...``. What both Triton feature probes (``_freeze_triton_probes``) and
    guards (``_triton_guard``) read."""
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    if not names <= allowed or "driver" in ast.unparse(expr) or any(
            isinstance(n, (ast.Lambda, ast.NamedExpr, ast.comprehension)) for n in ast.walk(expr)):
        return ...
    try:
        return eval(compile(ast.Expression(expr), "<triton at build time>", "eval"),
                    {**env, "__builtins__": _VALUE_BUILTINS})
    except Exception:
        return ...


def _literal_assignment(stmt: ast.stmt) -> bool:
    """``NAME = <literal>`` (names only): a flag."""
    if not isinstance(stmt, ast.Assign) or not all(isinstance(t, ast.Name) for t in stmt.targets):
        return False
    try:
        ast.literal_eval(stmt.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return handler.type is None or any(isinstance(k, ast.Name) and k.id in _IMPORT_ERRORS for k in kinds)


def _guarded_triton_imports(stmts: list[ast.stmt]) -> tuple[frozenset[int], list[ast.stmt]]:
    """Triton imports in host code inside a ``try`` whose handler catches ImportError (flash-linear-attention's
    NPU-only ``from triton.backends.ascend.compiler import NPUOptions`` in a helper function, its module-level
    ``try: import triton.language as tl`` that patches ``tl.extra``): each is rewritten in the shipped host code to
    raise ImportError, as where Triton is not installed, so the handler runs. Returns the ids of the nodes the
    checks skip (the import and what can only run after it: the rest of that ``try`` body and its ``else``), and
    the imports."""
    skip: set[int] = set()
    guarded: list[ast.stmt] = []
    for stmt in stmts:
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Try) or not any(_catches_import_error(h) for h in node.handlers):
                continue
            for j, s in enumerate(node.body):
                if isinstance(s, (ast.Import, ast.ImportFrom)) and _is_triton_import(s) and _host_import(s) is None:
                    guarded.append(s)
                    skip |= {id(n) for dead in [s, *node.body[j + 1:], *node.orelse] for n in ast.walk(dead)}
                    break
    return frozenset(skip), guarded


def _is_main_guard(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (the Triton tutorials' script tail, a library file's self-test): it never runs
    where the file is a package's module, so it is left out of the host code."""
    return isinstance(stmt, ast.If) and not stmt.orelse and ast.unparse(stmt.test).replace("'", '"') in (
        '__name__ == "__main__"', '"__main__" == __name__')


def _is_triton_import_block(stmt: ast.stmt) -> bool:
    """An ``if`` / ``try`` whose every branch only imports from Triton: kernel-side, like a Triton import."""
    leaves = _import_block(stmt) if isinstance(stmt, (ast.If, ast.Try)) else None
    return bool(leaves) and all(_is_triton_import(s) and _host_import(s) is None for s in leaves or [])


def _kernel_side_block(stmt: ast.stmt, triton_names: set[str]) -> set[str]:
    """The names an ``if`` / ``try`` binds where every branch binds only what kernels use: Triton imports, names
    taken from Triton (``x = tl.f``) and ``@triton.jit`` functions, at least one of the latter two (FlagGems'
    ``random_utils.py``: ``try: uint_to_uniform_float = tl.uint_to_uniform_float`` ``except AttributeError:`` a
    ``@triton.jit`` fallback); else none. Such a block is kernel-side, like a Triton import: left out of host code,
    its names Triton's."""
    def from_triton(e: ast.expr) -> bool:
        while isinstance(e, ast.Attribute):
            e = e.value
        return isinstance(e, ast.Name) and e.id in triton_names

    leaves = _block_leaves(stmt) or []
    # vLLM's triton_utils: ``if HAS_TRITON: import triton ...`` / ``else: triton = TritonPlaceholder()``: a branch
    # binding placeholders to the names another imports from Triton is the fallback the build never takes
    imported = {a.asname or a.name.partition(".")[0] for s in leaves if isinstance(s, (ast.Import, ast.ImportFrom))
                and _is_triton_import(s) and _host_import(s) is None for a in s.names}
    bound: set[str] = set()
    for s in leaves:
        if isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) for t in s.targets) \
                and (from_triton(s.value) or _defined_names(s) <= imported):
            bound |= _defined_names(s)
        elif _is_kernel(s):
            bound.add(s.name)
        elif not (isinstance(s, ast.Pass) or (isinstance(s, (ast.Import, ast.ImportFrom))
                  and _is_triton_import(s) and _host_import(s) is None)):
            return set()
    return bound


def _host_driver_import(stmt: ast.stmt) -> list[str] | None:
    """``from triton.runtime import driver [as d]``: the names it binds to Triton's driver, which host code may
    use (the runtime's ``triton.runtime.driver`` answers for it); None for any other statement. The statement's
    other names (Cut Cross-Entropy's ``from triton.runtime import autotuner, driver``) are kernel side."""
    if isinstance(stmt, ast.ImportFrom) and stmt.module == "triton.runtime" and stmt.level == 0 \
            and any(a.name == "driver" for a in stmt.names):
        return [a.asname or a.name for a in stmt.names if a.name == "driver"]
    # ``import triton.runtime.driver as driver`` (FLA's backends): the same module, under the name it gives
    if isinstance(stmt, ast.Import) and all(a.name == "triton.runtime.driver" and a.asname for a in stmt.names):
        return [a.asname for a in stmt.names]  # type: ignore[misc]
    return None


_DESCRIPTOR_MODULE = "triton.tools.tensor_descriptor"


def _host_import(stmt: ast.stmt) -> dict[str, str] | None:
    """A Triton import host code may keep, as the names it binds and what each is on the runtime's ``triton``:
    ``from triton.runtime import driver``, ``from triton.tools.tensor_descriptor import TensorDescriptor`` (the
    runtime has its own host-side tensor descriptor) and ``from triton import cdiv, next_power_of_2``; None for any
    other statement."""
    driver = _host_driver_import(stmt)
    if driver is not None:
        return dict.fromkeys(driver, "triton.runtime.driver")
    if isinstance(stmt, ast.ImportFrom) and stmt.module == _DESCRIPTOR_MODULE and stmt.level == 0 \
            and all(a.name == "TensorDescriptor" for a in stmt.names):
        return {a.asname or a.name: f"{_DESCRIPTOR_MODULE}.TensorDescriptor" for a in stmt.names}
    # ``from triton import cdiv, next_power_of_2`` (attorch's every kernel file): the runtime's own helpers; the
    # statement's other names (``from triton import jit, cdiv``) are kernel side (see _triton_names)
    if isinstance(stmt, ast.ImportFrom) and stmt.module == "triton" and stmt.level == 0 \
            and any(a.name in _HOST_HELPERS for a in stmt.names):
        return {a.asname or a.name: f"triton.{a.name}" for a in stmt.names if a.name in _HOST_HELPERS}
    # ``from triton.runtime.jit import reinterpret as tl_reinterpret, TensorWrapper`` (FBGEMM's fp8 matmuls)
    if isinstance(stmt, ast.ImportFrom) and stmt.module == "triton.runtime.jit" and stmt.level == 0 \
            and all(a.name in ("reinterpret", "TensorWrapper") for a in stmt.names):
        return {a.asname or a.name: f"triton.{a.name}" for a in stmt.names}
    return None


_DECORATOR_HELPERS = ("heuristics", "Config", "autotune")
"""Host helpers for decorators host code applies after a kernel's def (see runtime/host_decorators.py): allowed
where host code reaches them, but a definition using them counts as Triton code where nothing shipped reaches it
(a config list an ``@triton.autotune`` on a def reads stays out of the wheel)."""
_HOST_HELPERS = ("cdiv", "next_power_of_2", "reinterpret", "TensorWrapper", *_DECORATOR_HELPERS)
"""What ``from triton import ...`` may bring into host code: the helpers the runtime's ``triton`` has."""


def _driver_attributes(node: ast.AST) -> set[int]:
    """The ``triton.runtime`` nodes that are part of ``triton.runtime.driver`` (the part of Triton's runtime host
    code may use)."""
    return {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr == "driver"
            and isinstance(n.value, ast.Attribute) and n.value.attr == "runtime"
            and isinstance(n.value.value, ast.Name) and n.value.value.id == "triton"}


def asks_device(node: ast.AST) -> bool:
    """Whether code asks about the device: Triton's ``driver`` (imported from ``triton.runtime`` or reached as
    ``triton.runtime.driver``), ``torch.cuda``'s device queries (``get_device_capability``, ``is_available``...)
    or ``torch.version.cuda`` / ``hip``. Its launches
    may then differ per target, so the build traces it once per target."""
    from .targets import TORCH_DEVICE_QUERIES

    for n in ast.walk(node):
        if _host_driver_import(n) is not None if isinstance(n, ast.stmt) else False:  # type: ignore[arg-type]
            return True
        if isinstance(n, ast.Attribute) and n.attr in TORCH_DEVICE_QUERIES and (
                (isinstance(n.value, ast.Attribute) and n.value.attr == "cuda")
                or (isinstance(n.value, ast.Name) and n.value.id == "cuda")):
            return True
        # torch.version.hip / .cuda: which backend (SGLang's is_hip(), Unsloth's device type) is the target's too
        if isinstance(n, ast.Attribute) and n.attr in ("hip", "cuda") and isinstance(n.value, ast.Attribute) \
                and n.value.attr == "version":
            return True
    return bool(_driver_attributes(node))


TORCH_TRITON = {"wrap_triton": "_wrap_triton", "capture_triton": "_wrap_triton", "triton_op": "_triton_op",
                "custom_op": "_custom_op"}
"""torch.library's Triton entry points in host code → the runtime's stand-ins on the host ``triton`` (see
host_triton): ``wrap_triton(kernel)`` gives the packaged kernel handle back, ``@triton_op`` leaves the function
as it is (the package registers its ops as ``torch.ops.<package>.<op>``), ``@custom_op("ns::name")`` defines the op
as ``<package>__ns::name`` (host_driver._custom_op: never the library's own name, which the library may define too)."""
_TORCH_LIBRARY_MODULES = ("torch.library", "torch._library.triton", "torch._library")


def _mixed_triton_import(stmt: ast.stmt) -> bool:
    """``import torch, triton, math``: an import of Triton and of other modules in one statement."""
    if not isinstance(stmt, ast.Import):
        return False
    triton = [a.name == "triton" or a.name.startswith("triton.") for a in stmt.names]
    return any(triton) and not all(triton)


def _without_triton_names(lines: list[str], stmt: ast.Import) -> None:
    """A mixed import's text with only its other modules imported (gemlite's ``utils.py``: ``import torch, triton,
    math``; kept whole, the wheel would import Triton at run time), a Triton alias bound to what it names on the
    runtime's ``triton`` (``import triton.language as tl`` → ``tl = triton.language``). Line numbers are kept."""
    kept = [a for a in stmt.names if not (a.name == "triton" or a.name.startswith("triton."))]
    text = "import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
    text += "".join(f"; {a.asname} = {a.name}" for a in stmt.names if a.asname and a not in kept)
    first, last = stmt.lineno - 1, (stmt.end_lineno or stmt.lineno) - 1
    head, tail = lines[first].encode(), lines[last].encode()
    end = stmt.end_col_offset if stmt.end_col_offset is not None else len(tail.rstrip(b"\r\n"))
    joined = head[:stmt.col_offset] + text.encode() + tail[end:]
    lines[first:last + 1] = [joined.decode()] + ["\n"] * (last - first)


def _replace_statement(lines: list[str], stmt: ast.stmt, text: str) -> None:
    """Put ``text`` (one line) in place of a statement, at its indentation, its other lines blank: line numbers
    stay the author's."""
    first, last = stmt.lineno - 1, (stmt.end_lineno or stmt.lineno) - 1
    indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
    lines[first:last + 1] = [f"{indent}{text}\n"] + ["\n"] * (last - first)


def _import_from(stmt: ast.ImportFrom, aliases: list[ast.alias]) -> str:
    """``from <stmt's module> import <aliases>``."""
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    return f"from {'.' * stmt.level}{stmt.module or ''} import {names}"


def _op_reference_spans(stmts: list[ast.stmt], names: set[str], namespaces: set[str], any_op: bool,
                        spans: dict[int, list[tuple[int, int, str]]], skip: frozenset[int] = frozenset()) -> None:
    """Add to ``spans`` (line index -> (start, end byte offset, replacement)) the references of ``stmts`` to ops
    the package defines in its own namespace (``<package>__ns``, host_driver._namespace): a string naming one of
    ``names`` (or, with ``any_op``, any ``"ns::op"`` of ``namespaces``) → ``triton._op_name(...)``;
    ``torch.ops.ns`` → ``triton._ops_namespace(ns)``; with ``any_op``, a ``Library("ns", ...)``'s namespace →
    ``triton._namespace(ns)``. Strings inside those calls already, and the nodes ``skip`` (ids), are left."""
    done = set(skip) | {id(a) for stmt in stmts for c in ast.walk(stmt) if isinstance(c, ast.Call)
            and ast.unparse(c.func) in _RENAMED_CALLS for a in c.args}
    libraries = {id(c.args[0]) for stmt in stmts for c in ast.walk(stmt) if any_op and isinstance(c, ast.Call)
                 and c.args and _is_library_call(c)}
    attributes = {f"torch.ops.{n}": n for n in namespaces}
    for stmt in stmts:
        for node in ast.walk(stmt):
            if not isinstance(node, (ast.Constant, ast.Attribute)) or node.lineno != node.end_lineno \
                    or id(node) in done:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                ns, sep, op = node.value.partition("::")
                if id(node) in libraries and node.value in namespaces:
                    text = f"triton._namespace({node.value!r})"
                elif node.value in names or (any_op and sep and ns in namespaces
                                             and op.partition(".")[0].isidentifier()):  # "ns::op" or "ns::op.out"
                    text = f"triton._op_name({node.value!r})"
                else:
                    continue
            elif isinstance(node, ast.Attribute) and ast.unparse(node) in attributes:
                text = f"triton._ops_namespace({attributes[ast.unparse(node)]!r})"
            else:
                continue
            spans.setdefault(node.lineno - 1, []).append((node.col_offset, node.end_col_offset or 0, text))


_RENAMED_CALLS = frozenset({"triton._op_name", "triton._ops_namespace", "triton._namespace"})
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "_prims", "quantized", "sparse", "torchvision"})
"""Namespaces torch or its libraries define: a ``Library`` on one adds to theirs, never the project's own."""


def _is_library_call(call: ast.Call) -> bool:
    """``Library(...)`` / ``torch.library.Library(...)`` (any spelling ending in ``Library``)."""
    return ast.unparse(call.func).rpartition(".")[2] == "Library"


def _apply_spans(lines: list[str], spans: dict[int, list[tuple[int, int, str]]]) -> None:
    for i, found in spans.items():
        raw = lines[i].encode()
        for start, end, text in sorted(found, reverse=True):
            raw = raw[:start] + text.encode() + raw[end:]
        lines[i] = raw.decode()


def library_namespaces(texts: list[str]) -> set[str]:
    """The namespaces shipped code defines ops in with ``Library("ns", "DEF")`` or ``Library("ns", "FRAGMENT")``
    (vLLM's ``direct_register_custom_op``: ``Library("vllm", "FRAGMENT")`` in ``vllm/utils``, its callers in the
    kernel files using ``torch.ops.vllm.<op>``), a literal name torch does not own."""
    found: set[str] = set()
    for text in texts:
        for node in ast.walk(_parse(text)):
            if not isinstance(node, ast.Call) or not node.args or not _is_library_call(node):
                continue
            kind = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "kind"),
                                                                  None)
            ns = node.args[0]
            if isinstance(ns, ast.Constant) and isinstance(ns.value, str) and ns.value not in _TORCH_NAMESPACES \
                    and isinstance(kind, ast.Constant) and kind.value in ("DEF", "FRAGMENT"):
                found.add(ns.value)
    return found


def rename_library_namespaces(text: str, namespaces: set[str]) -> str:
    """Shipped code with every reference to the ``namespaces`` shipped code defines with ``Library`` in the
    package's own (``<package>__ns``, line for line): the library's ``Library("ns", ...)``, ``torch.ops.ns`` and
    ``"ns::op"`` strings, across all the files the package ships. Under the library's name, a process importing
    the wheel and the library itself would stop at the second definition of an op."""
    if not namespaces:
        return text
    lines = _split_lines(text, keepends=True)
    spans: dict[int, list[tuple[int, int, str]]] = {}
    _op_reference_spans(_parse(text).body, set(), namespaces, True, spans)
    _apply_spans(lines, spans)
    return "".join(lines)


def _torch_library_rewrites(host: list[ast.stmt], lines: list[str]) -> None:
    """Rewrite, in place and line for line, host code's ``from torch.library import wrap_triton`` (and
    ``triton_op``, ``capture_triton``, ``custom_op``) to bind the runtime's stand-ins, and
    ``torch.library.wrap_triton`` to ``triton._wrap_triton``; and, as the package defines the file's
    ``custom_op("ns::name")`` ops in its own namespace, the file's other references to them by name (the string
    in ``register_fake("ns::name")``, ``torch.ops.ns``) to ``triton._op_name`` / ``triton._ops_namespace``."""
    spans: dict[int, list[tuple[int, int, str]]] = {}  # line index -> (start, end byte offset, replacement)
    defined = [c.args[0] for stmt in host for c in ast.walk(stmt) if isinstance(c, ast.Call) and c.args
               and ast.unparse(c.func).rpartition(".")[2] in ("custom_op", "triton_op")
               and isinstance(c.args[0], ast.Constant)
               and isinstance(c.args[0].value, str) and "::" in c.args[0].value]
    names = {d.value for d in defined}
    if names:  # (the definitions themselves stay: _custom_op renames them)
        _op_reference_spans(host, names, {n.partition("::")[0] for n in names}, False, spans,
                            frozenset(id(d) for d in defined))
    for stmt in host:
        for node in ast.walk(stmt):
            if isinstance(node, ast.ImportFrom) and node.module in _TORCH_LIBRARY_MODULES and node.level == 0 \
                    and any(a.name in TORCH_TRITON for a in node.names):
                keep = [a for a in node.names if a.name not in TORCH_TRITON]
                parts = [_import_from(node, keep)] if keep else []
                parts += [f"{a.asname or a.name} = triton.{TORCH_TRITON[a.name]}" for a in node.names
                          if a.name in TORCH_TRITON]
                _replace_statement(lines, node, "; ".join(parts))
            elif isinstance(node, ast.Attribute) and node.attr in TORCH_TRITON and node.lineno == node.end_lineno \
                    and ast.unparse(node.value) in _TORCH_LIBRARY_MODULES:
                spans.setdefault(node.lineno - 1, []).append((node.col_offset, node.end_col_offset or 0,
                                                             f"triton.{TORCH_TRITON[node.attr]}"))
    _apply_spans(lines, spans)


def _triton_op_mutates(fn: ast.stmt, names: set[str]) -> str | None:
    """The ``mutates_args`` of a host function's ``@triton_op(...)`` decorator (``names``: what the file calls
    it) where it names arguments (the op writes them), else None."""
    for dec in getattr(fn, "decorator_list", []):
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).rpartition(".")[2] in names:
            for kw in dec.keywords:
                if kw.arg == "mutates_args":
                    text = ast.unparse(kw.value)
                    return None if text in ("{}", "()", "[]", "set()", "''", '""') else text
    return None


def _kernel_only_imports(host: list[ast.stmt], kernel_side: list[ast.stmt], heuristics: list[ast.expr],
                         exported: Collection[str] = (), whole: bool = False) -> dict[ast.stmt, list[ast.alias]]:
    """Imports of the host code that bind names only kernels use (flash-linear-attention's kernel files take
    ``exp`` and ``@triton.jit`` helpers from ``fla.ops.utils.op``): each such ``import`` → the aliases host code does
    use (none: the statement belongs to the kernels and is left out of the host code, so the wheel neither needs
    the helper nor runs it; the build's compile still imports the file whole). A name nothing uses stays imported,
    as the author wrote it (its module may be imported for what its import does; see localmods.referenced_names)."""
    kernel_uses = set().union(*(_names_in(s) for s in kernel_side))
    host_uses = set().union(*(_names_in(s) for s in host if not isinstance(s, (ast.Import, ast.ImportFrom))),
                            *(_names_in(h) for h in heuristics), exported,  # (what other modules take from it)
                            # ``whole``: a module imported whole, whose importers may take the flag a Triton import
                            # block tests (vLLM's triton_utils: mamba_ssm imports its HAS_TRITON)
                            *(_names_in(s.test) for s in kernel_side if whole and isinstance(s, ast.If)))
    out: dict[ast.stmt, list[ast.alias]] = {}
    for stmt in host:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)) or (
                isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"):
            continue
        bound = {(a.asname or a.name.split(".")[0]): a for a in stmt.names if a.name != "*"}
        only_kernels = {n for n in bound if n in kernel_uses and n not in host_uses}
        # Triton re-exported next to host names: never the host's (it has the runtime's triton, and its tl types)
        only_kernels |= {a.name for a in _reexported_aliases(stmt)}
        if not only_kernels or (isinstance(stmt, ast.Import) and len(only_kernels) < len(bound)):
            continue  # a plain ``import a, b`` is left whole where host code uses one of its names
        out[stmt] = [a for n, a in bound.items() if n not in only_kernels]
    return out


def kernel_only_imports(tree: ast.Module) -> dict[ast.stmt, list[ast.alias]]:
    """``_kernel_only_imports`` of a whole module's top level, its ``@triton.jit`` functions (and their decorators)
    the kernel side: what the module's shipped host code keeps of each import that kernels use. For the project
    modules a kernel file imports (localmods), whose own kernels may take names host code never does (FLA's
    ``fla/ops/utils/index.py`` spreads ``autotune_cache_kwargs`` into its kernels' autotuners)."""
    kernels = [s for s in tree.body if _is_kernel(s)]
    return _kernel_only_imports([s for s in tree.body if not _is_kernel(s)], kernels, [])


def _triton_names(tree: ast.Module) -> set[str]:
    """Names a file binds to Triton modules or objects (``triton``, ``tl``, ``jit``…)."""
    names: set[str] = set()
    for stmt in tree.body:
        if _is_triton_import_block(stmt):
            names.update(a.asname or a.name.split(".")[0] for s in _import_block(stmt) or [] for a in s.names)
        elif isinstance(stmt, ast.Import):
            host = _host_import(stmt) or {}
            for a in stmt.names:
                if (a.name == "triton" or a.name.startswith("triton.")) and (a.asname or a.name) not in host:
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(stmt, ast.ImportFrom) and _is_triton_import(stmt):  # all but the host helpers it may bind
            host = _host_import(stmt) or {}
            names.update(n for n in (a.asname or a.name for a in stmt.names) if n not in host)
        else:  # ``from vllm.triton_utils import HAS_TRITON, tl, triton``: its tl and triton
            names.update(a.name for a in _reexported_aliases(stmt))
    return names


def _parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, with every decorator or call named ``autotune`` or ``heuristics`` by something the file
    imports from elsewhere than Triton marked (lightllm's ``from lightllm.common.triton_utils.autotuner import
    autotune``, a host function's decorator): ``_kernel_decorators`` then does not take a function it decorates
    without ``@triton.jit`` for a kernel missing its ``@triton.jit``."""
    tree = ast.parse(text, filename=filename)
    bound: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            bound.update(a.asname or a.name.split(".")[0] for a in stmt.names)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(stmt.name)
    foreign = (bound & _WRAPPING_DECORATORS) - _triton_names(tree)
    if foreign:
        for node in ast.walk(tree):
            targets = [node.func] if isinstance(node, ast.Call) else []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                targets += [d for d in node.decorator_list if not isinstance(d, ast.Call)]
            for target in targets:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in foreign:
                    target._forge_foreign = True  # type: ignore[attr-defined]
    return tree


def _decorator_kind(dec: ast.expr, library: bool = True) -> str | None:
    target = dec.func if isinstance(dec, ast.Call) else dec
    text = ast.unparse(target)
    kind = _DECORATORS.get(text.removeprefix("triton.").removeprefix("runtime."))
    if kind is None and library and isinstance(dec, ast.Call) \
            and {"configs", "key"} <= {k.arg for k in dec.keywords}:
        # A library's own autotuner with triton.autotune's arguments (flash-linear-attention's fla_cache_autotune,
        # an Autotuner subclass that caches its picks): read as one, once introspect.read_decorators has seen that
        # the object it makes is a Triton Autotuner.
        return "autotune"
    return kind


def _kernel_decorators(fn: ast.FunctionDef,
                       wrappers: frozenset[str] = frozenset()) -> list[tuple[str, ast.expr]] | None:
    """The Triton decorators of a kernel (None: not a kernel); ``wrappers``: the manifest's launch wrappers, allowed
    outside them and left out."""
    found = [(_decorator_kind(d), d) for d in fn.decorator_list]
    outer = 0
    while outer < len(found) and found[outer][0] is None and _is_wrapper(found[outer][1], wrappers):
        outer += 1
    found = found[outer:]
    kinds = [k for k, _ in found]
    if "jit" not in kinds:
        # not a library's autotuner: no jit, no kernel; a decorator of Triton's name that the file imports from
        # elsewhere (lightllm's own ``autotune`` of host functions) is host code's
        if any(_decorator_kind(d, library=False) and not getattr(d.func if isinstance(d, ast.Call) else d,
                                                                  "_forge_foreign", False) for _, d in found):
            raise SourceError(f"line {fn.lineno}: {fn.name} is decorated with @triton.autotune or "
                              "@triton.heuristics but not @triton.jit")
        return None
    others = [ast.unparse(d) for k, d in found if k is None]
    if others:
        raise SourceError(f"line {fn.lineno}: {fn.name} has decorators forge-aot cannot package: "
                          f"{', '.join('@' + o for o in others)} (supported: @triton.autotune, "
                          "@triton.heuristics, @triton.jit; a decorator that only wraps the launch, outside them, "
                          "may be listed in project.launch-wrappers)")
    if kinds[-1] != "jit":
        raise SourceError(f"line {fn.lineno}: @triton.jit must be the innermost decorator of {fn.name}")
    return [(k, d) for k, d in found if k is not None]  # type: ignore[misc]


def _is_kernel(stmt: ast.stmt, wrappers: frozenset[str] = frozenset()) -> bool:
    """Whether a statement defines a kernel (a ``@triton.jit`` function); one whose decorators this cannot package is
    one too (its error is said where the kernel is read), not host code."""
    try:
        return isinstance(stmt, ast.FunctionDef) and _kernel_decorators(stmt, wrappers) is not None
    except SourceError:
        return True


def _is_wrapper(dec: ast.expr, wrappers: frozenset[str]) -> bool:
    text = ast.unparse(dec.func if isinstance(dec, ast.Call) else dec)
    return text in wrappers or text.rpartition(".")[2] in wrappers


def _params(fn: ast.FunctionDef, constants: dict[str, Any] | None = None) -> list[KernelParam]:
    """The kernel's parameters; a default that names a module constant (``BLOCK: tl.constexpr = BLOCK_DEFAULT``)
    takes its value from ``constants``, as Python binds it when the ``def`` runs; any other expression is
    COMPUTED_DEFAULT."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[Any] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = []
    for a, d in zip([*positional, *args.kwonlyargs], [*defaults, *args.kw_defaults], strict=True):
        # As Triton's KernelParam.is_constexpr: any annotation that says "constexpr", written as an expression
        # (``tl.constexpr``) or as a string (``"tl.constexpr"``, what ``from __future__ import annotations`` gives)
        annotation = a.annotation.value if isinstance(a.annotation, ast.Constant) and \
            isinstance(a.annotation.value, str) else ast.unparse(a.annotation) if a.annotation is not None else ""
        has_default = d is not None
        value = None
        if has_default:
            try:
                value = ast.literal_eval(d)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                value = COMPUTED_DEFAULT
                if isinstance(d, ast.Name) and d.id in (constants or {}):
                    value = (constants or {})[d.id]
                # ``ACC_TYPE: tl.constexpr = tl.float32``: a Triton element type, as host code would pass it
                if isinstance(d, ast.Attribute) and d.attr in HOST_DTYPES \
                        and ast.unparse(d.value) in ("tl", "language", "triton.language"):
                    value = HostDtype(f"tl.{d.attr}")
        out.append(KernelParam(a.arg, "constexpr" in annotation, value, has_default,
                               _ANNOTATION_TYPES.get(annotation.rpartition(".")[2], "") if "[" not in annotation
                               and "constexpr" not in annotation else ""))
    return out


_ANNOTATION_TYPES = {**dict.fromkeys(("bool", "int1", "uint1", "i1", "u1"), "i1"),
                     **{t: t for t in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32",
                                       "fp64")},
                     "int8": "i8", "int16": "i16", "int": "i32", "int32": "i32", "int64": "i64", "uint8": "u8",
                     "uint16": "u16", "uint32": "u32", "uint64": "u64", "half": "fp16", "float16": "fp16",
                     "bfloat16": "bf16", "float": "fp32", "float32": "fp32", "double": "fp64", "float64": "fp64"}
"""Scalar annotations and the types Triton's JIT gives them (its ``type_canonicalisation_dict``; a bool is ``i1``
here, as the manifest spells it)."""


def _do_not_specialize(fn: ast.FunctionDef, jit: ast.expr, params: list[KernelParam]) -> tuple[str, ...] | None:
    """The parameters ``@triton.jit(do_not_specialize=...)`` names; None where it is computed (FLA:
    ``['T', 'scale'] if IS_NVIDIA_HOPPER else ['T']``), which the plan reads from the imported kernel instead."""
    if not isinstance(jit, ast.Call):
        return ()
    names: list[str] = []
    for kw in jit.keywords:
        if kw.arg not in ("do_not_specialize", "do_not_specialize_on_alignment"):
            continue
        try:
            values = ast.literal_eval(kw.value)
        except ValueError:
            return None
        for v in values:
            names.append(params[v].name if isinstance(v, int) else str(v))
    return tuple(dict.fromkeys(names))


def _names_in(node: ast.AST, skip: frozenset[int] | set[int] = frozenset()) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in skip}


def _triton_annotations(statements: list[ast.stmt], triton_names: set[str], element_types: frozenset[int],
                        ) -> list[ast.expr]:
    """The annotations of host functions that name Triton, each on one line (Cut Cross-Entropy's ``def
    cce_forward_autotune() -> Callable[..., autotuner.Autotuner | autotuner.Heuristics]``): without ``from
    __future__ import annotations`` Python evaluates them at the def, so the shipped copy has them as strings
    (``_replace_spans``), which nothing in host code reads; one over several lines stays what it is (an error), and
    one naming ``constexpr`` marks a kernel's parameter (a def left undecorated is Triton code, not host code)."""
    def names_triton(ann: ast.expr) -> bool:  # (a ``tl.constexpr`` parameter makes a kernel, not host code)
        return "constexpr" not in ast.unparse(ann) and _uses_triton(ann, triton_names, driver_ok=False,
                                                                    element_types=element_types)

    out = []
    for stmt in statements:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                for ann in (*(p.annotation for p in params if p is not None), node.returns):
                    if ann is not None and ann.lineno == ann.end_lineno and names_triton(ann):
                        out.append(ann)
    return out


def _second_handles(tree: ast.Module, kernels: Collection[str]) -> dict[int, tuple[str, str, str, int]]:
    """Top-level ``H = triton.autotune(...)(K)``, or ``D = triton.autotune(...)`` then ``H = D(K)``, for a kernel
    ``K`` and another name ``H`` (SGLang's ``fused_softcap_kernel_autotuned``, launched beside the plain kernel):
    statement id -> (H, K, the decorator's kind, its line)."""
    decorators: dict[str, tuple[str, int]] = {}
    found: dict[int, tuple[str, str, str, int]] = {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Call)):
            continue
        name, call = stmt.targets[0].id, stmt.value
        if (kind := _decorator_kind(call)) is not None:
            decorators[name] = (kind, stmt.lineno)
        elif len(call.args) == 1 and isinstance(call.args[0], ast.Name) and call.args[0].id in kernels \
                and call.args[0].id != name and not call.keywords:
            if isinstance(call.func, ast.Call) and (kind := _decorator_kind(call.func)) is not None:
                found[id(stmt)] = (name, call.args[0].id, kind, stmt.lineno)
            elif isinstance(call.func, ast.Name) and call.func.id in decorators:
                found[id(stmt)] = (name, call.args[0].id, *decorators[call.func.id])
    return found


def _local_annotations(statements: list[ast.stmt]) -> list[ast.expr]:
    """The annotations of variables inside function bodies (flash-attn's ``FP8_MAX: tl.constexpr = ...`` in its
    host wrapper): Python never evaluates them (PEP 526), so they may name anything. A class body's are evaluated
    when the class is made, so the walk stops at one."""
    out: list[ast.expr] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, False)
                continue
            if in_function and isinstance(child, ast.AnnAssign):
                out.append(child.annotation)
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for stmt in statements:
        walk(ast.Module(body=[stmt], type_ignores=[]), False)
    return out


def _replace_spans(lines: list[str], spans: list[tuple[ast.expr, Callable[[str], str]]]) -> None:
    """Each expression's source text ``t`` replaced, in ``lines``, by ``text(t)`` on its first line, the lines it
    spanned after that left empty (the file's line numbers stay). Spans must not overlap."""
    for node, text in sorted(spans, key=lambda s: (s[0].lineno, s[0].col_offset), reverse=True):  # right to left
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        head, tail = lines[first].encode("utf-8"), lines[last].encode("utf-8")  # (offsets count UTF-8 bytes)
        start, end = node.col_offset, node.end_col_offset or node.col_offset
        source = b"".join([head[start:]] + [ln.encode("utf-8") for ln in lines[first + 1:last]] + [tail[:end]]) \
            if last > first else head[start:end]
        lines[first] = (head[:start] + text(source.decode("utf-8")).encode("utf-8") + tail[end:]).decode("utf-8")
        for i in range(first + 1, last + 1):
            lines[i] = "\n"


def _host_autotune_calls(statements: list[ast.stmt]) -> list[ast.Call]:
    """The ``triton.autotune(...)`` calls in host code (Cut Cross-Entropy's helper returns one where
    ``CCE_AUTOTUNE`` is set, else ``triton.heuristics``). The build reads the decorators a kernel got from the kernel
    Triton built, and refuses an autotuner applied after the def; the shipped copy calls ``triton.autotune()``,
    which raises (runtime/host_decorators.py), so what the arguments name (configs, pruning functions using
    ``triton.testing``) is never run there: Triton code, as unreached definitions are."""
    return [node for stmt in statements for node in ast.walk(stmt)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "autotune"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "triton"]


_POINTER_FUNCTIONS = ("make_block_ptr", "advance", "make_tensor_descriptor", "multiple_of", "max_contiguous",
                      "max_constancy", "where", "cast", "broadcast_to", "reshape", "view", "expand_dims")
"""``tl`` functions whose result may still point into the memory their arguments point into."""
_NO_POINTER_ATTRIBUTES = ("dtype", "element_ty", "shape", "type", "numel")
"""Attributes of a pointer (or tensor, block pointer, descriptor) that point nowhere: ``acc.to(ptr.dtype.
element_ty)`` (Cut Cross-Entropy's backward) derives no pointer from ``ptr``."""
_PURE_BUILTINS = ("min", "max", "range", "len", "int", "float", "bool", "isinstance", "hasattr", "getattr", "print")
"""Python functions a kernel may call (at compile time) that write through no pointer."""
_WRITES = ("store", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_xchg",
           "atomic_xor", "scatter")


_Helpers = dict[str, ast.FunctionDef]
"""``@triton.jit`` functions by name."""


def _decided(test: ast.expr, flags: dict[str, bool]) -> bool | None:
    """A branch test's value where it is made of flags (``HAS_OUTPUT``, ``not X``, ``A and not B``), else None."""
    if isinstance(test, ast.Name):
        return flags.get(test.id)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = _decided(test.operand, flags)
        return None if value is None else not value
    if isinstance(test, ast.BoolOp):  # decided by one operand where it settles it (``A and False``)
        values = [_decided(v, flags) for v in test.values]
        settles = isinstance(test.op, ast.Or)
        return settles if settles in values else None if None in values else not settles
    return None


def _live(node: ast.AST, flags: dict[str, bool]) -> Iterator[ast.AST]:
    """``ast.walk`` without the branches the flags rule out (``if`` statements and ``a if FLAG else b``)."""
    yield node
    if isinstance(node, (ast.If, ast.IfExp)) and flags and (value := _decided(node.test, flags)) is not None:
        branch = node.body if value else node.orelse
        for child in [node.test, *(branch if isinstance(branch, list) else [branch])]:
            yield from _live(child, flags)
        return
    for child in ast.iter_child_nodes(node):
        yield from _live(child, flags)


def _branch_flags(fn: ast.FunctionDef, constexprs: set[str]) -> list[str]:
    """The constexpr parameters a kernel's ``if`` and ``... if ... else ...`` test as flags, in order."""
    out: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.IfExp)):
            names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
            if names and set(names) <= constexprs and _decided(node.test, dict.fromkeys(names, True)) is not None:
                out += [n for n in names if n not in out]
    return out


@functools.lru_cache(maxsize=512)  # (per kernel, not per flag combination: _pointer_flow runs once for each)
def _reaching_definitions(fn: ast.FunctionDef) -> Callable[[str, ast.AST], list[ast.stmt] | None]:
    """For a name and a node of ``fn``, the assignments to the name that may reach the node, or None where the name
    is bound some other way (a ``for`` target, ``with ... as``, ``:=``, an import), which the caller then takes
    flow-insensitively. An ``x = ...`` earlier in the same block kills those before it; one in a nested block, or
    in a loop around the node (its back edge), may reach it. Reaching the function's start, the name's own value
    (a parameter's) reaches too: the list holds ``fn`` itself then. So FLA's ``p_v = v + o; load(p_v)`` then
    ``p_v = v_new + o; store(p_v)`` stores through ``v_new`` only."""
    where: dict[int, tuple[list[ast.stmt], int, ast.AST]] = {}  # id(stmt) -> (its block, index, the block's owner)
    owner_of: dict[int, ast.stmt] = {}  # id(any node) -> the statement it is in

    def index(owner: ast.AST, stmt_owner: ast.AST) -> None:
        """``stmt_owner``: the statement the blocks of ``owner`` belong to (a handler's: its ``try``)."""
        for attr in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(owner, attr, None)
            if not isinstance(block, list):
                continue
            for i, st in enumerate(block):
                if isinstance(st, ast.ExceptHandler):
                    index(st, stmt_owner)
                    continue
                where[id(st)] = (block, i, stmt_owner)
                for n in ast.walk(st):
                    owner_of[id(n)] = st  # (the statements inside it index theirs after: innermost wins)
                index(st, st)

    index(fn, fn)
    stores: dict[str, int] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            stores[n.id] = stores.get(n.id, 0) + 1
    assigned: dict[str, list[ast.stmt]] = {}
    inside: dict[tuple[int, str], list[ast.stmt]] = {}  # (id(stmt), name) -> the assignments to name within it
    for st in ast.walk(fn):
        if isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and st.value is not None:
            for t in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        assigned.setdefault(n.id, []).append(st)
                        up: ast.AST = st
                        while id(up) in where:
                            inside.setdefault((id(up), n.id), []).append(st)
                            up = where[id(up)][2]
    other = {n for n, count in stores.items() if count != len(assigned.get(n, ()))}  # bound other ways too

    def reaching(name: str, node: ast.AST) -> list[ast.stmt] | None:
        st = owner_of.get(id(node))
        if name in other or st is None or id(st) not in where:
            return None
        found: list[ast.stmt] = []
        while st is not None and id(st) in where:
            block, i, owner = where[id(st)]
            for earlier in reversed(block[:i]):
                if isinstance(earlier, (ast.Assign, ast.AnnAssign)) and earlier in assigned.get(name, []):
                    return [*found, earlier]  # unconditional at this level: what came before is killed
                found += inside.get((id(earlier), name), [])
            if isinstance(owner, (ast.For, ast.AsyncFor, ast.While)):
                found += inside.get((id(owner), name), [])  # the loop's back edge
            st = owner if isinstance(owner, ast.stmt) and owner is not fn else None
        return [*found, fn]

    return reaching


def _pointer_flow(fn: ast.FunctionDef, jit_functions: dict[str, ast.FunctionDef], language: set[str],
                  memo: dict[str, tuple[set[int], set[int]]],
                  namespaces: dict[str, _Helpers | None] | None = None,
                  flags: dict[str, bool] | None = None,
                  through: dict[str, list[tuple[int | str, set[int]]]] | None = None) -> tuple[set[int], set[int]]:
    """(positions of ``fn``'s parameters it may write through, those its return value may point into).

    Written: a pointer (or block pointer, or descriptor) derived from the parameter by assignments reaches the
    target of ``tl.store`` / ``tl.atomic_*``, a ``.store`` / ``.atomic_*`` method, or an argument of a
    ``@triton.jit`` function of the file or of a project module (``jit_functions``, ``namespaces``: see
    ``_imported_jit_functions``) that writes that argument; passed to any other function it counts as written.
    ``language``: the names the file binds to ``triton.language``, whose other functions (loads,
    ``make_block_ptr``…) write nothing. ``memo``: each function analysed once per file (one in progress counts as
    neither: Triton has no recursion). ``flags``: values of ``fn``'s constexpr flags, whose branches not taken
    then count for nothing (``KernelSource.writes_when``; the helpers it calls are read without them). ``through``:
    where given, a call of one of the parameters it has as keys (``fn``'s function-valued constexprs) writes nothing
    here; what each of its argument slots may point into is put there instead (``KernelSource.writes_through``)."""
    namespaces, flags = namespaces or {}, flags or {}
    if fn.name in memo and through is None:
        return memo[fn.name]
    before = memo.get(fn.name)
    memo[fn.name] = (set(), set())
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]]
    taint: dict[str, set[int]] = {p: {i} for i, p in enumerate(params)}

    def is_language(e: ast.expr) -> bool:
        return (isinstance(e, ast.Name) and e.id in language) or ast.unparse(e).startswith("triton.language")

    def helper(call: ast.Call) -> ast.FunctionDef | None:
        return jit_functions.get(call.func.id) if isinstance(call.func, ast.Name) else None

    def by_position(call: ast.Call, callee: ast.FunctionDef, positions: set[int]) -> set[int]:
        names = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args, *callee.args.kwonlyargs]]
        out = set().union(*(sources(a) for i, a in enumerate(call.args) if i in positions))
        return out | set().union(*(sources(k.value) for k in call.keywords
                                   if k.arg in names and names.index(k.arg) in positions))

    def sources(node: ast.AST | None, at: ast.AST | None = None) -> set[int]:
        """The parameters an expression's value may point into: not through what a ``tl`` function computes
        (a load gives values) except the functions that give pointers back, nor through a helper of the file
        that returns none of its pointer arguments. ``at``: the store the expression is the target of, where a
        name's value is what its assignments reaching there give (``_reaching_definitions``)."""
        if node is None or (isinstance(node, ast.Attribute) and node.attr in _NO_POINTER_ATTRIBUTES):
            return set()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_language(node.func.value) \
                and node.func.attr not in _POINTER_FUNCTIONS:
            return set()
        if isinstance(node, ast.Call) and (callee := helper(node)) is not None:
            return by_position(node, callee, _pointer_flow(callee, jit_functions, language, memo, namespaces)[1])
        if isinstance(node, ast.Name):
            defs = reaching(node.id, at) if at is not None else None
            if defs is None:
                return set(taint.get(node.id, ()))
            return set().union(*({params.index(node.id)} if d is fn and node.id in params else set() if d is fn
                                 else sources(d.value) | (set(taint.get(node.id, ())) if isinstance(
                                     d, ast.AugAssign) else set()) for d in defs))
        if isinstance(node, ast.IfExp):  # its value is a branch's, never the test's
            value = _decided(node.test, flags)
            return sources(node.orelse, at) if value is False else sources(node.body, at) if value \
                else sources(node.body, at) | sources(node.orelse, at)
        return set().union(*(sources(child, at) for child in ast.iter_child_nodes(node)))

    reaching = _reaching_definitions(fn)

    changed = True
    while changed:  # what each local name may derive from, through assignments (loops: until nothing changes)
        changed = False
        for node in _live(fn, flags):
            if isinstance(node, ast.For):  # ``for p in (a_ptr, b_ptr):`` (a static loop over pointers)
                node = ast.Assign(targets=[node.target], value=node.iter)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                src = sources(node.value) | (sources(node.target) if isinstance(node, ast.AugAssign) else set())
                for name in set().union(*(_names_in(t) for t in targets)):
                    if not src <= taint.setdefault(name, set()):
                        taint[name] |= src
                        changed = True
    written: set[int] = set()
    returned: set[int] = set()
    for node in _live(fn, flags):
        if isinstance(node, ast.Return):
            returned |= sources(node.value)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _WRITES:
            if is_language(func.value):  # tl.store(pointer, ...)
                target = node.args[0] if node.args else next((k.value for k in node.keywords
                                                              if k.arg in ("pointer", "ptr")), None)
                written |= sources(target, node)
            else:  # desc.store(offsets, value), ptr.atomic_add(...)
                written |= sources(func.value, node)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in namespaces \
                and not is_language(func.value):  # a helper of an imported module: ``utils.store_row(p, v)``
            callee = (namespaces[func.value.id] or {}).get(func.attr)
            written |= by_position(node, callee, _pointer_flow(callee, jit_functions, language, memo, namespaces)[0]) \
                if callee is not None else set().union(*(sources(a) for a in node.args),
                                                       *(sources(k.value) for k in node.keywords))
        elif isinstance(func, ast.Attribute):
            continue  # tl.load, tl.make_block_ptr, x.to(...), desc.load(...): they write nothing
        elif through is not None and isinstance(func, ast.Name) and func.id in through:
            slots = through.setdefault(func.id, [])
            slots += [(i, sources(a)) for i, a in enumerate(node.args)]
            slots += [(k.arg, sources(k.value)) for k in node.keywords if k.arg is not None]
        elif (callee := helper(node)) is not None:
            written |= by_position(node, callee, _pointer_flow(callee, jit_functions, language, memo, namespaces)[0])
        elif not (isinstance(func, ast.Name) and func.id in _PURE_BUILTINS):
            written |= set().union(*(sources(a) for a in node.args), *(sources(k.value) for k in node.keywords))
    found = ({i for i in written if i < len(params)}, {i for i in returned if i < len(params)})
    if through is None:
        memo[fn.name] = found
    elif before is None:
        memo.pop(fn.name)
    else:
        memo[fn.name] = before
    return found


def function_writes(path: str | Path, name: str) -> frozenset[int | str] | None:
    """The argument slots (positions and parameter names) the ``@triton.jit`` function ``name`` of the file at
    ``path`` may write through (``_pointer_flow``, with its file's helpers and those it imports), or None where it
    cannot be read: what a kernel hands it there is written (``KernelSource.writes_through``)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _function_writes(str(path), name, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)  # (each traced launch asks; the file's time and size keep it current)
def _function_writes(file: str, name: str, mtime_ns: int, size: int) -> frozenset[int | str] | None:
    path = Path(file)
    try:
        tree = _parse(path.read_text(encoding="utf-8"), filename=file)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    own = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef) and _is_kernel(f)}
    if name not in own:
        return None
    imported, namespaces, language = _imported_jit_functions(path, tree, frozenset())
    fn = own[name]
    positions = _pointer_flow(fn, {**imported, **own}, _language_aliases(tree) | language, {}, namespaces)[0]
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]]
    return frozenset(positions) | {params[i] for i in positions}


def _project_file(path: Path, dotted: str) -> Path | None:
    """The file of the project module ``dotted`` as the file at ``path`` imports it (from its own directory, or
    from the directory holding its topmost package), resolved; None where it is no file there."""
    from .localmods import package_of

    package = package_of(path)
    parts = dotted.split(".")
    return next((f.resolve() for d in (path.parent.resolve(), *([package[1]] if package else []))
                 for f in (d.joinpath(*parts).with_suffix(".py"), d.joinpath(*parts, "__init__.py")) if f.is_file()),
                None)


def _imported_jit_functions(path: Path, tree: ast.Module, wrappers: frozenset[str],
                            ) -> tuple[_Helpers, dict[str, _Helpers | None], set[str]]:
    """The ``@triton.jit`` helpers a kernel file takes from project modules (gemlite's ``from .utils import *``
    brings ``load_ptr``), by the names the file calls them, with the functions of those modules their own calls
    reach (by their names there, below the file's); the modules it binds to a name (``from . import utils``,
    ``import mylib.ops as ops``: ``ops.store_row(...)``) with their helpers, or None for a module that is not a file
    of the project; and the names those modules bind to ``triton.language``. So a pointer handed to such a helper
    counts as written only where the helper writes it, and one handed to a helper of a module that cannot be read
    (or a name it does not define) as written. Triton's own modules are none of these."""
    from .localmods import file_module, import_from_target

    module = file_module(path)
    named: _Helpers = {}
    inner: _Helpers = {}
    namespaces: dict[str, _Helpers | None] = {}
    language: set[str] = set()

    def helpers_of(dotted: str) -> _Helpers | None:
        found = _project_file(path, dotted)
        try:
            other = _parse(found.read_text(encoding="utf-8"), filename=str(found)) if found else None
        except (OSError, SyntaxError, UnicodeDecodeError):
            other = None
        if other is None:
            return None
        found = {f.name: f for f in other.body if isinstance(f, ast.FunctionDef) and _is_kernel(f, wrappers)}
        inner.update(found)
        language.update(_language_aliases(other))
        return found

    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if not _is_triton_module(alias.name):
                    namespaces[alias.asname or alias.name.partition(".")[0]] = \
                        helpers_of(alias.name) if alias.asname else None
            continue
        target = import_from_target(stmt, module) if isinstance(stmt, ast.ImportFrom) else None
        if not target or _from_triton(stmt):  # type: ignore[arg-type]
            continue
        helpers = helpers_of(target) or {}
        for alias in stmt.names:  # type: ignore[union-attr]
            if alias.name == "*":
                named.update({n: f for n, f in helpers.items() if not n.startswith("_")})
            elif alias.name in helpers:
                named[alias.asname or alias.name] = helpers[alias.name]
            else:  # a submodule (``from . import utils``) or a name that is no helper
                namespaces[alias.asname or alias.name] = helpers_of(f"{target}.{alias.name}")
    return {**inner, **named}, namespaces, language


def _uses_triton(node: ast.AST, triton_names: set[str], driver_ok: bool = True,
                 element_types: frozenset[int] = frozenset(), skip: frozenset[int] = frozenset(),
                 decorators_ok: bool = True) -> bool:
    """Whether code needs Triton itself (not just the host helpers ``triton.cdiv`` / ``next_power_of_2``, nor,
    where ``decorators_ok``, those of ``_DECORATOR_HELPERS``, nor, where ``driver_ok``, ``triton.runtime.driver``,
    which the runtime answers too, nor the element types ``tl.bfloat16`` whose nodes are in ``element_types``)."""
    helpers = set(_HostTriton.HOST_HELPERS) - {"runtime", *(() if decorators_ok else _DECORATOR_HELPERS)}
    driver = _driver_attributes(node) if driver_ok else set()
    for n in ast.walk(node):
        if id(n) in skip:  # a guarded Triton import and what follows it (see _guarded_triton_imports)
            continue
        if isinstance(n, (ast.Import, ast.ImportFrom)) and _is_triton_import(n) and _host_import(n) is None \
                and (n is node or _language_import(n) is None):  # (inside code: the runtime's triton.language)
            return True
        if isinstance(n, ast.Name) and n.id in triton_names - {"triton"} and id(n) not in element_types:
            return True
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "triton" \
                and n.attr not in helpers and id(n) not in driver and id(n) not in element_types:
            return True
    return False


def _constexpr_value(stmt: ast.stmt, triton_names: set[str]) -> tuple[str, ast.expr, bool] | None:
    """``NAME = tl.constexpr(value)`` (how Triton lets kernels read a global), ``NAME: tl.constexpr = value`` or
    both (Liger: ``_REDUCTION_MODE_MEAN: tl.constexpr = tl.constexpr(1)``) at the top level: (NAME, value, whether
    the value is a ``tl.constexpr`` object, whose ``.value`` host code may read)."""
    def is_constexpr(e: ast.expr) -> bool:
        return ast.unparse(e).rpartition(".")[2] == "constexpr" and _uses_triton(e, triton_names)

    def unwrapped(e: ast.expr) -> ast.expr | None:
        if isinstance(e, ast.Call) and is_constexpr(e.func) and len(e.args) == 1 and not e.keywords:
            return e.args[0]
        return None

    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None \
            and is_constexpr(stmt.annotation):
        inner = unwrapped(stmt.value)
        return stmt.target.id, inner or stmt.value, inner is not None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        inner = unwrapped(stmt.value)
        if inner is not None:
            return stmt.targets[0].id, inner, True
    return None


def _constexpr_globals(rest: list[ast.stmt], triton_names: set[str],
                       element_types: frozenset[int]) -> dict[int, tuple[str, ast.expr, bool]]:
    """The top-level constexpr globals (``_constexpr_value``) whose value needs no Triton, by statement id: kernels
    read them as constexprs, host code as plain values (vLLM-style block sizes shared by a kernel and its grid),
    so the host module keeps them as ``NAME = value`` and needs no Triton for them."""
    out = {}
    for stmt in rest:
        found = _constexpr_value(stmt, triton_names)
        if found and not _uses_triton(found[1], triton_names, element_types=element_types):
            out[id(stmt)] = found
    return out


def _language_aliases(tree: ast.Module) -> set[str]:
    """Names a file binds to ``triton.language`` (``import triton.language as tl``, ``from triton import
    language as tl``), at module level or inside a function (``_language_import``)."""
    out: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and not _from_triton(stmt):
            out.update(a.name for a in _reexported_aliases(stmt) if a.name == "tl")
    for node in ast.walk(tree):
        out.update(n for n in (_language_import(node) or ()) if n != "triton")
    return out


def _language_import(node: ast.AST) -> list[str] | None:
    """The names an ``import triton.language [as tl]`` or ``from triton import language [as tl]`` binds, None for
    any other node. Inside a host function (mlstm_kernels' ``torch2triton_dtype`` imports it to map dtypes) it
    becomes the runtime's ``triton.language``, whose element types host code may use."""
    if isinstance(node, ast.Import) and all(a.name == "triton.language" for a in node.names):
        return [a.asname or "triton" for a in node.names]
    if isinstance(node, ast.ImportFrom) and _from_triton(node) and node.module == "triton" \
            and all(a.name == "language" for a in node.names):
        return [a.asname or a.name for a in node.names]
    return None


def _element_type_nodes(tree: ast.Module, aliases: set[str]) -> frozenset[int]:
    """In ``tl.bfloat16`` / ``triton.language.float16`` (read, not assigned): the ``tl`` name or the
    ``triton.language`` attribute, which host code may use: the runtime's ``triton.language`` has Triton's
    element types, so host code can pass one to a kernel as a constexpr (vLLM's ``compute_type``), and their
    class ``tl.dtype`` (vLLM's ``invoke_fused_moe_kernel(..., compute_type: tl.dtype, ...)`` annotates with it)."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and (n.attr in HOST_DTYPES or n.attr == "dtype") \
                and isinstance(n.ctx, ast.Load):
            v = n.value
            if (isinstance(v, ast.Name) and v.id in aliases) or ast.unparse(v) == "triton.language":
                out.add(id(v))
    return frozenset(out)


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno, *(d.lineno for d in decorators)])


def _defined_names(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement binds; for an ``if`` / ``for`` / ``while`` / ``try`` / ``with`` block, those
    its branches bind (FLA: ``if IS_INTEL: _O_CONFIGS += [triton.Config(...)]``; the Triton tutorials build their
    benchmarks' configs in a ``for`` loop), so such a block that uses Triton is kernel-side unless host code takes
    one of them, as a single statement is."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return {n for t in targets for n in _names_in(t)}
    if isinstance(stmt, (ast.If, ast.For, ast.While, ast.Try, ast.With)):
        names = _names_in(stmt.target) if isinstance(stmt, ast.For) else set()
        for s in _branches(stmt):
            if isinstance(s, (ast.Import, ast.ImportFrom)):
                names |= {a.asname or a.name.split(".")[0] for a in s.names if a.name != "*"}
            elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) \
                    and isinstance(s.value.func, ast.Attribute) and isinstance(s.value.func.value, ast.Name):
                names.add(s.value.func.value.id)  # ``configs.append(...)``: the list it grows
            elif isinstance(s, (ast.Pass, ast.Expr)) and (isinstance(s, ast.Pass) or isinstance(s.value, ast.Constant)):
                continue
            elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.FunctionDef, ast.AsyncFunctionDef,
                                ast.ClassDef, ast.If, ast.For, ast.While, ast.Try, ast.With)) and _defined_names(s):
                names |= _defined_names(s)
            else:
                return set()  # module code run for its effect (a call, a raise): the block stays where it runs
        return names
    return set()


def _kernel_side_bindings(stmt: ast.stmt) -> set[str]:
    """The names a blanked top-level statement binds by definition or assignment (its branches', for a block):
    what the shipped host code binds to stand-ins there. Imports and a ``__main__`` block bind none."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return set().union(*(_target_names(t) for t in targets))
    if isinstance(stmt, (ast.If, ast.For, ast.While, ast.Try, ast.With)) and not _is_main_guard(stmt):
        return set().union(*(_kernel_side_bindings(s) for s in _branches(stmt)))
    return set()


def _branches(stmt: ast.If | ast.For | ast.While | ast.Try | ast.With) -> list[ast.stmt]:
    """The statements of every branch of a block (its body, ``else``, ``finally`` and handlers), one level down."""
    return [*stmt.body, *getattr(stmt, "orelse", []), *getattr(stmt, "finalbody", []),
            *(s for h in getattr(stmt, "handlers", []) for s in h.body)]


def _target_leaves(target: ast.expr) -> list[ast.expr]:
    """The single targets an assignment target unpacks into: ``a, (b, *c)`` gives ``a``, ``b``, ``c``."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [leaf for e in target.elts for leaf in _target_leaves(e)]
    if isinstance(target, ast.Starred):
        return _target_leaves(target.value)
    return [target]


def _target_names(target: ast.expr) -> set[str]:
    """The names an assignment target rebinds: ``a``, ``a, (b, *c)``; not ``cfg["x"]`` or ``obj.attr``, which change
    an object another statement bound."""
    return {leaf.id for leaf in _target_leaves(target) if isinstance(leaf, ast.Name)}


def _heuristics_values(dec: ast.expr) -> ast.expr:
    """The values argument of a ``@triton.heuristics(...)`` decorator."""
    arg = None
    if isinstance(dec, ast.Call) and len(dec.args) + len(dec.keywords) == 1:
        arg = dec.args[0] if dec.args else next((k.value for k in dec.keywords if k.arg == "values"), None)
    if arg is None:
        raise SourceError(f"line {dec.lineno}: @triton.heuristics takes one argument (the values)")
    return arg


def _heuristics_lines(lines: list[str], original: list[str], kernel: str, dec: ast.Call, outermost: bool = False,
                      ) -> None:
    """Rewrite a ``@triton.heuristics(VALUES)`` decorator, in place, as ``__forge_heuristics__(kernel, VALUES)``
    on the same lines (blank lines inside the open parenthesis keep the count); ``outermost``: one applied by
    rebinding the kernel, after the decorators above its def, as ``__forge_heuristics__(kernel, VALUES, True)``."""
    arg = _heuristics_values(dec)
    first, last = dec.lineno - 1, (dec.end_lineno or dec.lineno) - 1
    a_first, a_last = arg.lineno - 1, (arg.end_lineno or arg.lineno) - 1
    text = [ln.rstrip("\n") for ln in original[a_first:a_last + 1]]
    text[-1] = text[-1][:arg.end_col_offset]
    text[0] = text[0][arg.col_offset:]
    new = [f"{HEURISTICS_HOOK}({kernel!r},"] + [""] * (a_first - first - 1 if a_first > first else 0)
    if a_first == first:
        new[0] += " " + text[0]
        new += text[1:]
    else:
        new += text
    new[-1] += ", True)" if outermost else ")"
    new += [""] * (last - first + 1 - len(new))
    lines[first:last + 1] = [ln + "\n" for ln in new]


def _decorate_rebound_kernels(tree: ast.Module) -> tuple[set[int], set[int], set[str]]:
    """Kernels wrapped by assignment instead of decoration, as Unsloth writes them (``def _rope_embedding(...)``,
    then ``_rope_embedding = triton.jit(_rope_embedding)`` and ``_rope_embedding = triton.heuristics({...})(
    _rope_embedding)``): each top-level ``NAME = W(NAME)`` / ``NAME = W(...)(NAME)`` after ``def NAME`` whose ``W`` is
    ``triton.jit``, ``triton.heuristics`` or ``triton.autotune`` becomes that def's decorator (the last one
    outermost, as Python applies them), in the tree this parse reads. Returns the ids of those assignments (the
    kernel side of the file, as decorators are; a heuristics' values still become host code on their lines) and of
    the decorators they became: such a heuristics, applied after every one before it, runs first (Cut
    Cross-Entropy rebinds one that sets ``BLOCK_D`` over one that reads it), so its host copy registers first.
    Third, the defs some other call wraps that way (``K = helper()(K)``: see ``KernelSource.rewrapped``)."""
    functions: dict[str, ast.FunctionDef] = {}
    rebinding: set[int] = set()
    rebound: set[int] = set()
    rewrapped: set[str] = set()

    def decorator_of(stmt: ast.stmt) -> tuple[str, ast.expr | None, bool] | None:
        """(name, the Triton decorator ``stmt`` applies to a def by rebinding it or None, whether it wraps the
        def in another call), None where ``stmt`` rebinds no def."""
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        call = stmt.value if isinstance(stmt, ast.Assign) else None
        if not isinstance(target, ast.Name) or target.id not in functions or not isinstance(call, ast.Call):
            return None
        wrapped = [a for a in call.args if isinstance(a, ast.Name) and a.id == target.id]
        dec: ast.expr | None = None
        if isinstance(call.func, ast.Call) and len(call.args) == 1 and wrapped and not call.keywords:
            dec = call.func  # triton.heuristics({...})(f), triton.autotune(configs=..., key=...)(f)
        elif call.args and call.args[0] is (wrapped[0] if wrapped else None) and len(call.args) == 1:
            dec = ast.copy_location(ast.Call(func=call.func, args=[], keywords=call.keywords), call) \
                if call.keywords else call.func  # triton.jit(f), triton.jit(f, do_not_specialize=[...])
        return target.id, dec if dec is not None and _decorator_kind(dec) is not None else None, bool(wrapped)

    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef):
            functions[stmt.name] = stmt
            continue
        # TransformerEngine: ``try: K = triton.autotune(...)(K)`` / ``except RuntimeError: pass``, per kernel
        inner = stmt.body if isinstance(stmt, ast.Try) and not stmt.orelse and not stmt.finalbody and all(
            all(isinstance(b, ast.Pass) for b in h.body) for h in stmt.handlers) else [stmt]
        found = [decorator_of(s) for s in inner]
        if not found or any(f is None or f[1] is None for f in found):
            for name, _, wrapped in (f for f in found if f is not None and len(inner) == 1):
                if wrapped:
                    rewrapped.add(name)
            # the name may now mean something else: whatever binds it at module level (an import, an assignment,
            # a name bound inside an if / try / with / for) forgets the def
            for name in _module_level_stores(stmt) | _bound_names(stmt):
                functions.pop(name, None)
            continue
        for name, dec, _ in found:  # type: ignore[misc]
            functions[name].decorator_list.insert(0, dec)
            rebound.add(id(dec))
        rebinding.add(id(stmt))
    return rebinding, rebound, rewrapped


def _module_level_stores(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement assigns at module level: inside if / try / with / for blocks too, not inside
    the functions, classes and lambdas it defines (their own scopes; a def or class binds its name)."""
    out: set[str] = set()
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return out


def parse_source(path: Path, ops: set[str] | None = None, *, helper: bool = False,
                 wrappers: frozenset[str] = frozenset(), needs_kernels: bool = True) -> SourceFile:
    """Parse a kernel file and check that its host code needs nothing from Triton but the host helpers.

    ``ops``: the host functions the package exports (they and what they reach must be free of Triton);
    without it every host definition that does not use Triton counts as reached. ``helper``: a project module
    the kernel files import (localmods.py), which may hold no kernel; ``ops`` are then the names host code takes
    from it (None: it is imported whole, so every definition), and one that needs Triton is an error, not blanked.
    ``wrappers``: the manifest's launch wrappers (decorators left out with the kernel they wrap).
    ``needs_kernels`` False: the file of a manifest's ``[ops.NAME]``, whose ops launch other files' kernels.
    """
    try:
        text = path.read_text(encoding="utf-8")
        tree = _parse(text, filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: cannot parse: {exc}") from None
    branch_kernels: dict[str, tuple[int, int, int]] = {}
    text, tree, decide = _triton_guard(text, tree, path)
    if not helper and any(_kernel_branch(s, wrappers, decide) for s in tree.body):
        text, branch_kernels = _flatten_kernel_branches(text, tree, wrappers, decide)
        tree = _parse(text, filename=str(path))
    triton_names = _triton_names(tree)
    frozen = _freeze_triton_probes(text, tree, triton_names)
    if frozen is not None:
        text, tree = frozen, _parse(frozen, filename=str(path))
    kernel_blocks = {id(s): names for s in tree.body if (names := _kernel_side_block(s, triton_names))}
    triton_names |= {n for names in kernel_blocks.values() for n in names}
    language_aliases = _language_aliases(tree)
    descriptor_aliases = {a.asname or a.name.split(".")[0] for stmt in tree.body
                          if isinstance(stmt, (ast.Import, ast.ImportFrom)) and _host_import(stmt) is None
                          and _DESCRIPTOR_MODULE in {getattr(stmt, "module", None), *(a.name for a in stmt.names)}
                          for a in stmt.names}
    element_types = _element_type_nodes(tree, language_aliases)
    rebinding, rebound, rewrapped = _decorate_rebound_kernels(tree)
    kernels: dict[str, KernelSource] = {}
    kernel_stmts: list[ast.FunctionDef] = []
    heuristics: list[tuple[str, ast.Call]] = []
    blanked: list[ast.stmt] = []
    host_imports: list[ast.stmt] = []
    mixed_imports: list[ast.Import] = []  # ``import torch, triton, math`` (gemlite): its Triton names left out
    rest: list[ast.stmt] = []
    constants: dict[str, Any] = {}  # top-level ``NAME = literal`` (or ``tl.constexpr(literal)``) bound so far
    for stmt in tree.body:
        if id(stmt) in rebinding:  # ``kernel = triton.jit(kernel)``: now the def's decorator, its line kernel side
            blanked.append(stmt)
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            found = _constexpr_value(stmt, triton_names)
            for t in targets:
                if isinstance(t, ast.Name):
                    try:
                        constants[t.id] = ast.literal_eval(found[1] if found else stmt.value)
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        constants.pop(t.id, None)
        decorators = None
        if isinstance(stmt, ast.FunctionDef):
            try:
                decorators = _kernel_decorators(stmt, wrappers)
            except SourceError as exc:
                raise SourceError(f"{path}:{exc}") from None
        if decorators is not None:
            params = _params(stmt, constants)  # type: ignore[arg-type]
            kernels[stmt.name] = KernelSource(  # type: ignore[union-attr]
                stmt.name, stmt.lineno, params, tuple(k for k, _ in decorators),  # type: ignore[union-attr]
                _do_not_specialize(stmt, decorators[-1][1], params),  # type: ignore[arg-type]
                rewrapped=stmt.name in rewrapped,  # type: ignore[union-attr]
                autotune_line=next((d.lineno for k, d in decorators if k == "autotune"), 0))
            kernel_stmts.append(stmt)  # type: ignore[arg-type]
            heuristics += [(stmt.name, d) for k, d in decorators if k == "heuristics"]  # type: ignore[union-attr]
        elif _host_import(stmt) is not None:
            host_imports.append(stmt)
        elif _is_triton_import(stmt) or _is_triton_import_block(stmt) or id(stmt) in kernel_blocks \
                or _is_main_guard(stmt):
            blanked.append(stmt)
        else:
            if _mixed_triton_import(stmt):
                mixed_imports.append(stmt)  # type: ignore[arg-type]
            rest.append(stmt)
    if not kernels and not helper and needs_kernels:
        # bitsandbytes defines its kernels under ``if not is_triton_available(): ... else:``, torchao in a function
        nested = [(n, stmt) for stmt in tree.body for n in ast.walk(stmt) if n is not stmt and _is_kernel(n, wrappers)]
        if nested:
            kernel, stmt = nested[0]
            where = f"function {stmt.name}" if isinstance(stmt, ast.FunctionDef) else \
                f"{type(stmt).__name__.lower()} block"
            raise SourceError(f"{path}:{kernel.lineno}: {kernel.name} is a @triton.jit function inside the {where} at "
                              f"line {stmt.lineno}: forge-aot reads kernels (and the host code around them) defined at "
                              "module level; move them out")
        raise SourceError(f"{path}: no @triton.jit function found")
    imported_helpers, namespaces, imported_language = _imported_jit_functions(path, tree, wrappers)
    jit_functions = {**imported_helpers, **{k.name: k for k in kernel_stmts}}
    flows: dict[str, tuple[set[int], set[int]]] = {}
    for k in kernel_stmts:
        params = kernels[k.name].params
        constexprs = {p.name for p in params if p.constexpr}
        # a kernel calling a function-valued constexpr: what it hands there is written where the function writes it
        called = {n.func.id for n in ast.walk(k) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id in constexprs}

        def fresh(called: set[str] = called) -> dict[str, list[tuple[int | str, set[int]]]] | None:
            return {n: [] for n in called} if called else None

        through = fresh()
        positions = _pointer_flow(k, jit_functions, language_aliases | imported_language, flows, namespaces,
                                  None, through)[0]
        writes = tuple(p.name for i, p in enumerate(params) if i in positions)
        # the flags whose branches change what is written (each alone, the others either way), four at the most
        flags = [f for f in _branch_flags(k, constexprs)
                 if any(_pointer_flow(k, jit_functions, language_aliases | imported_language, {}, namespaces,
                                      {f: v}, fresh())[0] != positions
                        for v in (False, True))][:4]
        when = []
        for values in itertools.product((False, True), repeat=len(flags)) if flags else ():
            env = dict(zip(flags, values))
            live = _pointer_flow(k, jit_functions, language_aliases | imported_language, {}, namespaces, env,
                                 fresh())[0]
            when.append((tuple(env.items()), tuple(p.name for i, p in enumerate(params) if i in live)))
        slots = tuple((f, tuple((slot, names) for slot, src in found if (names := tuple(
            p.name for i, p in enumerate(params) if i in src and not p.constexpr)))) for f, found in sorted(
            (through or {}).items()))  # (a constexpr, the function itself among them, is never written)
        kernels[k.name] = dataclasses.replace(kernels[k.name], writes=writes, writes_when=tuple(when) if any(
            w != writes for _, w in when) else (), writes_through=tuple((f, ss) for f, ss in slots if ss))
    # A second handle of a kernel made by an autotune decorator (SGLang): a kernel of its own name, the def's
    # decorators under that autotuner, its line kernel side; one a heuristics makes stays host code (refused below).
    second = _second_handles(tree, kernels)
    for sid, (handle, kernel, kind, line) in list(second.items()):
        if kind == "autotune" and "autotune" not in kernels[kernel].decorators and handle not in kernels:
            kernels[handle] = dataclasses.replace(kernels[kernel], name=handle, autotune_line=line,
                                                  decorators=("autotune", *kernels[kernel].decorators))
            stmt = next(s for s in rest if id(s) == sid)
            rest.remove(stmt)
            blanked.append(stmt)
            del second[sid]
    for name, dec in heuristics:
        if not isinstance(dec, ast.Call):
            raise SourceError(f"{path}:{dec.lineno}: @triton.heuristics of {name} needs its values")
    # Top-level definitions that use Triton (directly, or through another such definition) belong to the
    # kernel side when no host code reaches them: a config-list function used by a decorator, say.
    # (A definition that asks Triton's driver counts too: the runtime answers for it, but host code that nothing
    # shipped reaches, like a decorator's ``is_cuda()``, stays out of the wheel.)
    constexpr_globals = _constexpr_globals(rest, triton_names, element_types)
    guarded_skip, guarded = _guarded_triton_imports(rest)
    annotations = _triton_annotations(rest, triton_names, element_types)
    tuner_calls = _host_autotune_calls(rest)
    # What the shipped copy never evaluates: a host triton.autotune(...)'s arguments, annotations naming Triton.
    never_run = {id(n) for c in tuner_calls for a in (*c.args, *(k.value for k in c.keywords)) for n in ast.walk(a)} \
        | {id(n) for a in (*annotations, *_local_annotations(rest)) for n in ast.walk(a)}
    guarded_skip = guarded_skip | never_run
    with_decorators = triton_names | {a.asname or a.name for s in tree.body if isinstance(s, ast.ImportFrom)
                                      and s.module == "triton" and s.level == 0 for a in s.names
                                      if a.name in _DECORATOR_HELPERS}
    direct = {id(s) for s in rest if id(s) not in constexpr_globals
              and _uses_triton(s, with_decorators, element_types=element_types, skip=guarded_skip,
                               decorators_ok=False)}
    triton_side = set(direct)
    changed = True
    while changed:
        changed = False
        defined = {n for s in rest if id(s) in triton_side for n in _defined_names(s)}
        for stmt in rest:
            if id(stmt) not in triton_side and _names_in(stmt, never_run) & defined:
                triton_side.add(id(stmt))
                changed = True
    triton_side |= {id(s) for s in rest if id(s) not in constexpr_globals
                    and _uses_triton(s, with_decorators, driver_ok=False, element_types=element_types,
                                     skip=guarded_skip, decorators_ok=False)}
    by_name = {n: s for s in rest for n in _defined_names(s)}
    whole = helper and ops is None
    if whole:
        ops = set(by_name)  # a module imported whole: every definition is host code
    roots = [s for s in rest if id(s) not in triton_side or not _defined_names(s)
             or (ops is not None and _defined_names(s) & ops)]
    reached_ids: set[int] = set()
    todo: list[ast.AST] = [*roots, *(_heuristics_values(d) for _, d in heuristics)]
    while todo:
        node = todo.pop()
        for n in _names_in(node, never_run) | (_defined_names(node) if isinstance(node, ast.stmt) else set()):
            s = by_name.get(n)
            if s is not None and id(s) not in reached_ids:
                reached_ids.add(id(s))
                todo.append(s)
        if isinstance(node, ast.stmt):
            reached_ids.add(id(node))
    kernel_side: dict[str, int] = {}
    host: list[ast.stmt] = []
    for stmt in rest:
        if id(stmt) in triton_side and id(stmt) not in reached_ids:
            blanked.append(stmt)
        else:
            host.append(stmt)
        if id(stmt) in direct and _uses_triton(stmt, triton_names, element_types=element_types, skip=guarded_skip):
            for n in _defined_names(stmt):  # (one using only what _DECORATOR_HELPERS name may be reached)
                kernel_side[n] = stmt.lineno
    narrowed = _kernel_only_imports(host, [*kernel_stmts, *blanked], [_heuristics_values(d) for _, d in heuristics],
                                    ops or () if helper else (), whole)
    for stmt, kept in narrowed.items():
        if not kept:
            host.remove(stmt)
            blanked.append(stmt)
    for stmt in host:
        if id(stmt) in second:
            handle, kernel, kind, line = second[id(stmt)]
            raise SourceError(f"{path}:{stmt.lineno}: host code reaches {handle}, a second handle of kernel {kernel} "
                              f"made by the {kind} decorator of line {line}: forge-aot packages a second handle that "
                              f"one @triton.autotune makes (SGLang's fused_softcap_kernel_autotuned), not this one; "
                              f"put the decorator on a def of its own")
    # Report a host statement that reaches a Triton-side definition before the definition itself.
    host.sort(key=lambda s: id(s) in direct)
    allowed_triton = set(_HostTriton.HOST_HELPERS) - {"runtime"}
    host_defs: set[str] = set()
    kernel_refs: dict[str, frozenset[str]] = {}
    function_lines: dict[str, tuple[int, int]] = {}
    names_used: dict[str, frozenset[str]] = {}
    launches: list[LaunchSite] = []
    checked: list[tuple[ast.AST, str]] = [(constexpr_globals[id(s)][1] if id(s) in constexpr_globals else s, "")
                                          for s in host] + [(_heuristics_values(d), n) for n, d in heuristics]
    for node_root, _ in checked:
        driver = _driver_attributes(node_root)
        for node in ast.walk(node_root):
            if id(node) in guarded_skip:
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)) and _is_triton_import(node) \
                    and _host_import(node) is None and _language_import(node) is None:
                if any(_DESCRIPTOR_MODULE in (getattr(node, "module", "") or "") or a.name == "TensorDescriptor"
                       for a in node.names):
                    raise SourceError(f"{path}:{node.lineno}: host code may import the tensor descriptor as "
                                      f"'from {_DESCRIPTOR_MODULE} import TensorDescriptor' only")
                raise SourceError(f"{path}:{node.lineno}: host code imports Triton; packaged ops run without "
                                  "it (use triton.cdiv / triton.next_power_of_2 from the module scope)")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "triton" and node.attr not in allowed_triton and id(node) not in driver \
                    and id(node) not in element_types:
                raise SourceError(f"{path}:{node.lineno}: host code uses triton.{node.attr}; packaged ops may "
                                  f"use only {', '.join('triton.' + h for h in sorted(allowed_triton))} and "
                                  "triton.runtime.driver")
            if isinstance(node, ast.Name) and node.id in triton_names - {"triton"} and id(node) not in element_types:
                what = (f"'{node.id}' (of triton.language, host code may use only its element types, such as "
                        f"{node.id}.bfloat16)" if node.id in language_aliases
                        else f"'{node.id}' (of {_DESCRIPTOR_MODULE}: import its TensorDescriptor as 'from "
                        f"{_DESCRIPTOR_MODULE} import TensorDescriptor')" if node.id in descriptor_aliases
                        else f"'{node.id}', which is Triton")
                raise SourceError(f"{path}:{node.lineno}: host code uses {what}; packaged ops run without Triton")
            if isinstance(node, ast.Name) and node.id in kernel_side and node_root is not by_name.get(node.id):
                configs = by_name.get(node.id) is not None and any(
                    isinstance(c, ast.Call) and ast.unparse(c.func).rpartition(".")[2] == "Config"
                    for c in ast.walk(by_name[node.id]))
                hint = ("; host code that picks among triton.Config objects at run time (torchao's int_matmul "
                        "searches them with its own autotuner) cannot be packaged: put the configs in the kernel's "
                        "@triton.autotune or the manifest's tune.configs, which the build tunes into its tables"
                        if configs else "; module code that runs it when the file is imported (a script's benchmark, "
                        "as the Triton tutorials end with): put such code under 'if __name__ == \"__main__\":'"
                        if isinstance(node_root, (ast.Expr, ast.For, ast.While, ast.If, ast.With)) else "")
                raise SourceError(f"{path}:{node.lineno}: host code uses '{node.id}', defined with Triton on "
                                  f"line {kernel_side[node.id]}{hint}")
    host_class_names = {s.name for s in host if isinstance(s, ast.ClassDef)}
    for stmt in host:
        name = stmt.name if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
            else _applied_function(stmt, host_class_names, host_defs - host_class_names)
        if name is not None:
            host_defs.add(name)
            names_used[name] = frozenset(_names_in(stmt))
            kernel_refs[name] = names_used[name] & set(kernels)
            function_lines[name] = (_first_line(stmt), stmt.end_lineno or stmt.lineno)
            launches += _launch_sites(stmt, set(kernels))
    lines = _split_lines(text, keepends=True)
    for stmt in [*kernel_stmts, *blanked]:
        for i in range(_first_line(stmt) - 1, stmt.end_lineno or stmt.lineno):
            lines[i] = "\n"
    for stmt in mixed_imports:
        _without_triton_names(lines, stmt)
    # Where the file defines Triton code, its names stay bound (a package __init__ may re-export a @triton.jit helper,
    # as FLA's fla/ops/utils does softplus): to the kernel's handle where the package has one, else to a stand-in.
    reserved = {"triton", *language_aliases, *descriptor_aliases}
    stand_ins: dict[int, set[str]] = {}  # by line: two statements may share one (``exp = tl.exp; log = tl.log``)
    for stmt in [*kernel_stmts, *blanked]:
        if id(stmt) not in rebinding:
            stand_ins.setdefault(stmt.lineno, set()).update(_kernel_side_bindings(stmt) - reserved)
    for line, names in stand_ins.items():
        if names:
            lines[line - 1] = "; ".join(f"{n} = {KERNEL_SIDE_HOOK}({n!r}, __name__)" for n in sorted(names)) + "\n"
    original = _split_lines(text)
    for name, dec in heuristics if not helper else ():  # a helper's kernels are never the package's: left blank
        _heuristics_lines(lines, original, name, dec, outermost=id(dec) in rebound)
    host_tl = any(isinstance(n, ast.Name) and n.id == "tl" and id(n) in element_types
                  for stmt in host for n in ast.walk(stmt))
    for stmt, kept in narrowed.items():
        if kept:  # the names host code uses (and tl's element types, where a re-exported tl left with Triton)
            tl = "; tl = triton.language" if host_tl and any(a.name == "tl" for a in _reexported_aliases(stmt)) else ""
            _replace_statement(lines, stmt, _import_from(stmt, kept) + tl)  # type: ignore[arg-type]
    triton_op_names = {"triton_op"} | {a.asname for stmt in host if isinstance(stmt, ast.ImportFrom)
                                       and stmt.module in _TORCH_LIBRARY_MODULES
                                       for a in stmt.names if a.name == "triton_op" and a.asname}
    _torch_library_rewrites(host, lines)
    host_ids = {id(n) for stmt in host for n in ast.walk(stmt)}
    for stmt in guarded:  # as where Triton is not installed: the handler runs
        if id(stmt) in host_ids:
            _replace_statement(lines, stmt, 'raise ImportError("packaged host code runs without Triton")')
    for stmt in host:  # ``NAME: tl.constexpr = value`` → ``NAME = value``: no Triton where the host module runs
        if id(stmt) in constexpr_globals:
            name, value, wrapped = constexpr_globals[id(stmt)]
            # a tl.constexpr object: the same value with the ``.value`` host code reads (Liger's mode tables)
            text = f"triton._host_constexpr({ast.unparse(value)})" if wrapped else ast.unparse(value)
            _replace_statement(lines, stmt, f"{name} = {text}")
    # ``import triton.language as tl`` where host code reads ``tl.bfloat16``: the runtime's element types.
    host_aliases = {n.id for stmt in host for n in ast.walk(stmt) if isinstance(n, ast.Name) and id(n) in element_types}
    for stmt in blanked:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and (_is_triton_import(stmt) or _reexported_aliases(stmt)):
            from_triton = getattr(stmt, "module", None) == "triton"
            reexport = bool(_reexported_aliases(stmt))
            bound = [a.asname or a.name for a in stmt.names
                     if (a.name == "triton.language" and a.asname) or (from_triton and a.name == "language")
                     or (reexport and a.name == "tl")]
            if set(bound) & host_aliases:  # a top-level statement, blanked above
                lines[stmt.lineno - 1] = "; ".join(f"{n} = triton.language" for n in bound if n in host_aliases) + "\n"
    # Host-provided imports bind the runtime's (``driver = triton.runtime.driver``), at module level and inside host
    # code alike (FlagGems: ``try: from triton.tools.tensor_descriptor import TensorDescriptor`` / ``except``).
    nested = [n for stmt in host for n in ast.walk(stmt) if n is not stmt and isinstance(n, ast.ImportFrom)
              and _host_import(n) is not None]
    guarded_ids = {id(g) for g in guarded}  # (a guarded one raises ImportError, as where Triton is absent: above)
    for stmt in host:  # ``import triton.language as tl`` inside host code: the runtime's (``triton`` is bound)
        for n in ast.walk(stmt):
            if n is not stmt and id(n) not in guarded_ids and (bound := _language_import(n)) is not None:
                _replace_statement(lines, n, "; ".join(f"{b} = triton.language" for b in bound if b != "triton")
                                   or "pass")
    # (``from triton import Config`` for a decorator's config list binds nothing: host code does not read it)
    read = {n for stmt in host for n in _names_in(stmt, never_run)}
    for stmt in [*host_imports, *nested]:
        _replace_statement(lines, stmt, "; ".join(
            f"{n} = {what}" for n, what in (_host_import(stmt) or {}).items()
            if n in read or what.rpartition(".")[2] not in _DECORATOR_HELPERS))
    # (a blanked def's annotations and calls are gone already)
    _replace_spans(lines, [(a, repr) for a in annotations if id(a) in host_ids]
                   + [(c, lambda _: "triton.autotune()") for c in tuner_calls if id(c) in host_ids])
    return SourceFile(path=path, kernels=kernels, host_source="".join(lines),
                      host_functions=frozenset(host_defs), kernel_refs=kernel_refs, launches=tuple(launches),
                      host_classes=frozenset(host_class_names), branch_kernels=branch_kernels,
                      function_lines=function_lines, names_used=names_used,
                      mutating_ops={n: m for stmt in host if isinstance(stmt, ast.FunctionDef)
                                    for n, m in [(stmt.name, _triton_op_mutates(stmt, triton_op_names))]
                                    if m is not None},
                      reads_device=any(_host_driver_import(s) is not None for s in host_imports)
                      or any(asks_device(stmt) for stmt in host))


def _applied_function(stmt: ast.stmt, classes: set[str], functions: Collection[str] = ()) -> str | None:
    """``NAME`` of a top-level ``NAME = Cls.apply`` whose ``Cls`` the file's host code defines: a
    ``torch.autograd.Function``'s apply taken as the file's function (Triton's tutorial 05, ``layer_norm =
    LayerNorm.apply``), so it may be an op or an export; or of ``NAME = fn``, another name of a host function the
    file defined before (SGLang's ``per_token_group_quant_fp8 = _per_token_group_quant_8bit_raw``); else None."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return None
    value = stmt.value
    if isinstance(value, ast.Attribute) and value.attr == "apply" and isinstance(value.value, ast.Name) \
            and value.value.id in classes:
        return stmt.targets[0].id
    if isinstance(value, ast.Name) and value.id in functions:
        return stmt.targets[0].id
    return None


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds (imports included), or none where it also changes something else: an
    assignment to an attribute or an item (``os.environ[...] = ...``) and a ``__future__`` import count as
    module code."""
    if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
        return set()
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        leaves = [leaf for t in targets for leaf in _target_leaves(t)]
        return {leaf.id for leaf in leaves} if all(isinstance(leaf, ast.Name) for leaf in leaves) else set()
    return _defined_names(stmt)


def _is_main_block(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":``, which runs only when the file is a script, never in a measurement."""
    test = getattr(stmt, "test", None)
    return isinstance(stmt, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) \
        and test.left.id == "__name__" and len(test.comparators) == 1 \
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__"


def _split_lines(text: str, keepends: bool = False) -> list[str]:
    """Lines as Python's parser counts them: ``str.splitlines`` also splits at form feeds and other
    separators, which would shift every line number after one (the text has ``\\n`` line ends only)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line + "\n" for line in lines] if keepends else lines


def code_sha256(path: Path, roots: set[str]) -> str:
    """sha256 of the code a measurement of a kernel depends on: the top-level statements that define ``roots``
    (the kernel, its tuning op, inputs, reference...) and everything they name, transitively (Triton helpers,
    ``tl.constexpr`` globals, imports, host helpers), plus every top-level statement that binds no name (module
    code that may change anything: calls, ``os.environ[...] = ...``, ``__future__`` imports; docstrings and an
    ``if __name__ == "__main__":`` block aside). Their exact source text is hashed, so an edit anywhere
    else in the file (another kernel, a comment between definitions, a function moved) keeps tuning results,
    while any edit inside what the measurement ran, even a comment, counts as new code. Text, not
    ``ast.dump``: the tuning GPU and the build machine may run different Python versions."""
    text = path.read_text(encoding="utf-8")
    try:
        tree = _parse(text, filename=str(path))
    except SyntaxError as exc:
        raise SourceError(f"{path}: cannot parse: {exc}") from None
    bound = {id(s): _bound_names(s) for s in tree.body}
    by_name: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        for name in bound[id(stmt)]:
            by_name.setdefault(name, []).append(stmt)
    kept: set[int] = set()
    free = [s for s in tree.body if not bound[id(s)] and not _is_main_block(s)
            and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # docstrings run nothing
    todo = free + [s for n in sorted(roots) for s in by_name.get(n, [])]
    while todo:
        stmt = todo.pop()
        if id(stmt) in kept:
            continue
        kept.add(id(stmt))
        for name in _names_in(stmt):
            todo += [s for s in by_name.get(name, []) if id(s) not in kept]
    lines = _split_lines(text)
    digest = hashlib.sha256(b"forge-aot code v1\n")
    for stmt in tree.body:
        if id(stmt) in kept:
            digest.update("\n".join(lines[_first_line(stmt) - 1:stmt.end_lineno or stmt.lineno]).encode())
            digest.update(b"\n\x00\n")
    return digest.hexdigest()


def imported_launch_sites(path: Path, text: str,
                          imported: Callable[[str, str], Any]) -> list[tuple[Any, LaunchSite]]:
    """The launches of kernels that host code ``text`` (of ``path``) imports from other files (``from
    pkg.ops.cross_entropy import element_mul_kernel``, or the module: ``from pkg.ops import cross_entropy as ce``
    then ``ce.element_mul_kernel[grid](...)``; relative imports resolved against the file's package):
    ``imported(module, name)`` says which kernel a module's name is, or None. Each site comes with what
    ``imported`` said of it, and names the file."""
    from .localmods import file_module, import_from_target

    tree = _parse(text, filename=str(path))
    own = file_module(path)
    local: dict[str, Any] = {}
    bound_modules: dict[str, str] = {}  # a name host code reaches a module by (dotted where imported so) → module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound_modules.update({a.asname or a.name: a.name for a in node.names})
        module = import_from_target(node, own) if isinstance(node, ast.ImportFrom) else None
        if module is None:
            continue
        for alias in node.names:
            fn = imported(module, alias.name)
            if fn is not None:
                local[alias.asname or alias.name] = fn
            bound_modules[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):  # module.kernel
        base = ast.unparse(node.value) if isinstance(node, ast.Attribute) else None
        if base in bound_modules:
            fn = imported(bound_modules[base], node.attr)  # type: ignore[attr-defined]
            if fn is not None:
                local[f"{base}.{node.attr}"] = fn  # type: ignore[attr-defined]
    if not local:
        return []
    return [(local[site.kernel], dataclasses.replace(site, path=str(path)))
            for stmt in tree.body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for site in _launch_sites(stmt, set(local))]


def _kernel_choices(expr: ast.expr, kernels: set[str]) -> list[str] | None:
    """The kernels an expression picks among (``A``, ``A if gemma else B``, ``(A, B)[i]``; a ``None`` there picks
    none: ``kernel = A if tuned else None``), or None for any other."""
    if isinstance(expr, (ast.Name, ast.Attribute)) and ast.unparse(expr) in kernels:
        return [ast.unparse(expr)]
    if isinstance(expr, ast.Constant) and expr.value is None:
        return []
    if isinstance(expr, ast.IfExp):
        body, orelse = _kernel_choices(expr.body, kernels), _kernel_choices(expr.orelse, kernels)
        return None if body is None or orelse is None else [*body, *(k for k in orelse if k not in body)]
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, (ast.Tuple, ast.List)) and expr.value.elts:
        picks = [_kernel_choices(e, kernels) for e in expr.value.elts]
        return None if any(p is None for p in picks) else list(dict.fromkeys(k for p in picks for k in p or ()))
    return None


def _kernel_aliases(fn: ast.stmt, kernels: set[str]) -> dict[str, list[str]]:
    """Local names a function binds only to kernels (Unsloth's ``fx = _gemma_rms_layernorm_forward if gemma else
    _rms_layernorm_forward`` then ``fx[grid](...)``): name -> the kernels it may be."""
    found: dict[str, list[str]] = {}
    other: set[str] = set()
    for node in ast.walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.NamedExpr)) else []
        for t in targets:
            if not isinstance(t, ast.Name):  # ``fx, gx = A, B``, ``for fx in ...``: not read, so never an alias
                other.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
                continue
            if t.id in kernels:
                continue
            picks = _kernel_choices(node.value, kernels) if isinstance(node, (ast.Assign, ast.AnnAssign)) \
                and node.value is not None else None
            if picks is None:
                other.add(t.id)
            else:
                found[t.id] = [*found.get(t.id, []), *(k for k in picks if k not in found.get(t.id, []))]
    return {name: picks for name, picks in found.items() if name not in other}


def _launch_sites(fn: ast.stmt, kernels: set[str]) -> list[LaunchSite]:
    """``kernel[grid](...)`` and ``kernel.warmup(..., grid=...)`` calls (a warmup binds its arguments as the
    launch of the compiled kernel it returns); a local name bound only to kernels launches each of them
    (``_kernel_aliases``)."""
    out = []
    aliases = _kernel_aliases(fn, kernels)
    local_defs = {d.name: d for d in ast.walk(fn) if isinstance(d, ast.FunctionDef)}
    branches = (ast.If, ast.IfExp, ast.BoolOp, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match,
                *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))
    conditional = {id(inner) for node in ast.walk(fn) if isinstance(node, branches) for inner in ast.walk(node)
                   if inner is not node}
    qualnames: dict[int, str] = {}  # each node in a method or nested def -> its qualified name

    def name_defs(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{prefix}.{child.name}" if prefix else child.name
            if inner != getattr(fn, "name", None):
                qualnames[id(child)] = inner
            name_defs(child, inner)

    name_defs(fn, getattr(fn, "name", ""))

    def site(kernel: str, node: ast.Call, keywords: tuple[str, ...], f: ast.expr) -> LaunchSite:
        spread_kwargs = any(k.arg is None for k in node.keywords)
        return LaunchSite(kernel, getattr(fn, "name", "?"), node.lineno,
                          sum(1 for a in node.args if not isinstance(a, ast.Starred)), keywords,
                          any(isinstance(a, ast.Starred) for a in node.args) or spread_kwargs, spread_kwargs,
                          id(node) in conditional, qualnames.get(id(node), ""), grid_sets=grid_sets(f))

    def assigned(fdef: ast.FunctionDef, meta: str, seen: set[str]) -> set[str]:
        """The keys ``fdef`` assigns in its parameter ``meta``, and the local functions it hands ``meta`` to."""
        seen.add(fdef.name)
        keys = {t.slice.value for n in ast.walk(fdef) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == meta
                and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str)}
        for c in ast.walk(fdef):  # vLLM's grid calls num_program(META, args), which assigns
            callee = local_defs.get(c.func.id) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) else None
            if callee is not None and callee.name not in seen:
                for i, a in enumerate(c.args):
                    if isinstance(a, ast.Name) and a.id == meta and i < len(callee.args.args):
                        keys |= assigned(callee, callee.args.args[i].arg, seen)
        return keys

    def grid_sets(f: ast.expr) -> tuple[str, ...]:
        """What the grid function of ``kernel[grid]`` (a def of this host function) assigns in its argument."""
        grid = local_defs.get(f.slice.id) if isinstance(f, ast.Subscript) and isinstance(f.slice, ast.Name) else None
        return tuple(sorted(assigned(grid, grid.args.args[0].arg, set()))) if grid and grid.args.args else ()

    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            out += [site(kernel, node, tuple(k.arg for k in node.keywords if k.arg is not None), f)
                    for kernel in aliases[f.value.id]]
            continue
        kernel = None
        if isinstance(f, ast.Subscript) and isinstance(f.value, (ast.Name, ast.Attribute)) \
                and ast.unparse(f.value) in kernels:
            kernel = ast.unparse(f.value)  # a name, or module.kernel where the kernel is another file's
        elif isinstance(f, ast.Subscript) and isinstance(f.value, ast.Call) and f.value.args \
                and ast.unparse(f.value.func).rpartition(".")[2] in ("wrap_triton", "capture_triton") \
                and isinstance(f.value.args[0], ast.Name) and f.value.args[0].id in kernels:
            kernel = f.value.args[0].id  # torch.library.wrap_triton(kernel)[grid](...)
        warmup = isinstance(f, ast.Attribute) and f.attr == "warmup" and isinstance(f.value, ast.Name) \
            and f.value.id in kernels
        if warmup:
            kernel = f.value.id  # type: ignore[union-attr]
        if kernel is None:
            continue
        out.append(site(kernel, node, tuple(k.arg for k in node.keywords if k.arg is not None
                                            and not (warmup and k.arg == "grid")), f))
    return out


__all__ = ["LAUNCH_OPTIONS", "KernelParam", "KernelSource", "LaunchSite", "SourceFile", "kernel_only_imports",
           "parse_source"]
