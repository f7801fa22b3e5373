"""Small arithmetic expressions used by manifests: constraints, grids, block sizes.

They are data (strings that travel in packs), so they are parsed into a whitelisted
subset of Python and compiled once; evaluation sees only the names it is given and a
few pure functions. No attribute access, no subscripts, no calls but the listed ones.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Mapping

from adaptive.errors import ExpressionError


def ceil_div(a, b):
    return -(-a // b)


def is_pow2(n):
    return n > 0 and (n & (n - 1)) == 0


FUNCTIONS = {
    "ceil_div": ceil_div, "min": min, "max": max, "abs": abs, "log2": math.log2,
    "is_pow2": is_pow2, "round_up": lambda a, b: ceil_div(a, b) * b,
}

_GLOBALS = {"__builtins__": {}, **FUNCTIONS}   # read-only for eval: shared by every call

_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
    ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd,
    ast.Not, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
    ast.In, ast.NotIn, ast.BitAnd, ast.BitOr, ast.LShift, ast.RShift,
)


class Expr:
    """A compiled expression; ``Expr('BM * BN <= 4096')(BM=64, BN=64)`` is True."""

    __slots__ = ("text", "names", "_code")

    def __init__(self, text: str | int | float):
        self.text = str(text)
        try:
            tree = ast.parse(self.text, mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"cannot parse expression {self.text!r}: {exc.msg}") from None
        names = set()
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED):
                raise ExpressionError(
                    f"expression {self.text!r} uses {type(node).__name__}, which is not allowed "
                    "(arithmetic, comparisons, and/or/not, x if c else y, and "
                    f"{', '.join(sorted(FUNCTIONS))} only)")
            if isinstance(node, ast.Call):
                if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                    raise ExpressionError(
                        f"expression {self.text!r} calls something other than "
                        f"{', '.join(sorted(FUNCTIONS))}")
            elif isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                names.add(node.id)
        self.names = frozenset(names)
        self._code = compile(tree, f"<expr {self.text}>", "eval")

    def __call__(self, env: Mapping | None = None, **names):
        # a miss evaluates thousands of these: no copy of env unless names are added
        scope = env if env is not None and not names else dict(env or {}, **names)
        if not self.names <= scope.keys():
            missing = self.names - scope.keys()
            raise ExpressionError(
                f"expression {self.text!r} needs {', '.join(sorted(missing))}; "
                f"given: {', '.join(sorted(scope)) or 'nothing'}")
        return eval(self._code, _GLOBALS, scope)  # noqa: S307 (whitelisted names only)

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Expr) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


@functools.lru_cache(maxsize=4096)
def compile_expr(text: str) -> Expr:
    """Parse once per distinct text."""
    return Expr(text)
