"""The constraint language: a small, safe subset of Python evaluated over config, call-site and key values."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from .basics import cdiv, next_power_of_2

_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs, "cdiv": cdiv,
                                         "next_power_of_2": next_power_of_2}
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
