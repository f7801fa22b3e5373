"""Small arithmetic expressions used by manifests: constraints, grids, block sizes.

They are data (strings that travel in packs), so they are parsed into a whitelisted
subset of Python and compiled once; evaluation sees only the names it is given and a
few pure functions. No attribute access, no subscripts, no calls but the listed ones.

Evaluation is bounded, so an expression cannot hang or exhaust memory: the text is at
most :data:`MAX_TEXT_CHARS` characters and :data:`MAX_NODES` syntax nodes (the step
budget: there are no loops, so each node runs at most once), and ``**``, ``<<``, ``*``
and ``%`` go through checked functions that refuse exponents above
:data:`MAX_EXPONENT`, integers beyond ±2**:data:`MAX_INT_BITS` and non-numbers (``'a' * n``,
``'%s' % x``). Constant parts are evaluated once at parse time, so ``9**9**9**9`` is
refused when a manifest or a pack is read, not on the first launch.
"""

from __future__ import annotations

import ast
import functools
import math
import numbers
from collections.abc import Mapping

from adaptive.errors import ExpressionError

MAX_TEXT_CHARS = 1000   # longest expression text accepted
MAX_NODES = 256         # step budget: syntax nodes of one expression (the longest shipped: 38)
MAX_INT_BITS = 128      # |integer| results of *, **, << stay below 2**MAX_INT_BITS
MAX_EXPONENT = 128      # |b| in a ** b


_LIMIT = 1 << MAX_INT_BITS
_NUMBER_TYPES = frozenset({int, float, bool})


def _plain(x, op: str):
    """``x`` as a Python int or float (NumPy scalars convert); anything else is refused."""
    if type(x) in _NUMBER_TYPES:
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        return float(x)
    raise ExpressionError(f"{op} needs numbers, got {type(x).__name__} {x!r:.40}")


def _refuse(op: str, a, b):
    """The slow path of a checked operator: other number types, or a refusal."""
    a, b = _plain(a, op), _plain(b, op)
    if op == "*" or op == "%":
        r = a * b if op == "*" else a % b
        if -_LIMIT < r < _LIMIT:
            return r
    else:
        return (_pow if op == "**" else _lshift)(a, b)
    raise ExpressionError(f"{a!r:.40} {op} {b!r:.40} is beyond ±2**{MAX_INT_BITS}")


def _pow(a, b):
    if type(a) not in _NUMBER_TYPES or type(b) not in _NUMBER_TYPES:
        return _refuse("**", a, b)
    if not -MAX_EXPONENT <= b <= MAX_EXPONENT:
        raise ExpressionError(f"exponent {b!r:.40} is beyond the limit of {MAX_EXPONENT}")
    if type(a) is int and type(b) is int and b > 0 \
            and (abs(a).bit_length() - 1) * b > MAX_INT_BITS:
        raise ExpressionError(f"{a!r:.40} ** {b} exceeds {MAX_INT_BITS} bits")
    try:
        r = a ** b
    except (OverflowError, ZeroDivisionError) as exc:
        raise ExpressionError(f"{a!r:.40} ** {b!r:.40}: {exc}") from None
    if type(r) is complex or not -_LIMIT < r < _LIMIT:
        raise ExpressionError(f"{a!r:.40} ** {b!r:.40} is beyond ±2**{MAX_INT_BITS} or "
                              "not a real number")
    return r


def _lshift(a, b):
    if type(a) not in _NUMBER_TYPES or type(b) not in _NUMBER_TYPES:
        return _refuse("<<", a, b)
    if type(a) is not float and type(b) is not float and 0 <= b \
            and int(a).bit_length() + b > MAX_INT_BITS:
        raise ExpressionError(f"{a!r:.40} << {b} exceeds {MAX_INT_BITS} bits")
    return a << b


def _mul(a, b):
    if type(a) in _NUMBER_TYPES and type(b) in _NUMBER_TYPES:
        r = a * b
        if -_LIMIT < r < _LIMIT:
            return r
    return _refuse("*", a, b)


def _mod(a, b):
    if type(a) in _NUMBER_TYPES and type(b) in _NUMBER_TYPES:
        return a % b
    return _refuse("%", a, b)


def ceil_div(a, b):
    return -(-a // b)


def is_pow2(n):
    return n > 0 and (n & (n - 1)) == 0


def _log2(x):
    try:
        return math.log2(x)
    except (ValueError, OverflowError) as exc:
        raise ExpressionError(f"log2({x!r:.40}): {exc}") from None


FUNCTIONS = {
    "ceil_div": ceil_div, "min": min, "max": max, "abs": abs, "log2": _log2,
    "is_pow2": is_pow2, "round_up": lambda a, b: _mul(ceil_div(a, b), b),
}
_CHECKED = {ast.Pow: "_pow", ast.LShift: "_lshift", ast.Mult: "_mul", ast.Mod: "_mod"}
_HELPERS = {"_pow": _pow, "_lshift": _lshift, "_mul": _mul, "_mod": _mod}

_GLOBALS = {"__builtins__": {}, **FUNCTIONS, **_HELPERS}   # read-only for eval: shared

_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
    ast.Name, ast.Load, ast.Constant, ast.Tuple, ast.List,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd,
    ast.Not, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
    ast.In, ast.NotIn, ast.BitAnd, ast.BitOr, ast.LShift, ast.RShift,
)
# what evaluation may raise on values it was given (a string compared with a number...)
_EVAL_ERRORS = (ArithmeticError, TypeError, ValueError)


class _Checked(ast.NodeTransformer):
    """``a ** b`` → ``_pow(a, b)`` (and ``<<``, ``*``, ``%``): the bounded forms."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        name = _CHECKED.get(type(node.op))
        if name is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), [node.left, node.right],
                                          []), node)


def _free_names(node) -> bool:
    return any(isinstance(n, ast.Name) and n.id not in _GLOBALS for n in ast.walk(node))


class Expr:
    """A compiled expression; ``Expr('BM * BN <= 4096')(BM=64, BN=64)`` is True."""

    __slots__ = ("text", "names", "_code")

    def __init__(self, text: str | int | float):
        self.text = str(text)
        if len(self.text) > MAX_TEXT_CHARS:
            raise ExpressionError(f"expression {self.text[:60]!r}… is {len(self.text)} "
                                  f"characters long; at most {MAX_TEXT_CHARS} are allowed")
        try:
            tree = ast.parse(self.text, mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"cannot parse expression {self.text!r}: {exc.msg}") from None
        except (RecursionError, MemoryError, ValueError):
            raise ExpressionError(f"cannot parse expression {self.text[:60]!r}: nested too "
                                  "deeply") from None
        nodes = list(ast.walk(tree))
        if len(nodes) > MAX_NODES:
            raise ExpressionError(f"expression {self.text[:60]!r} has {len(nodes)} syntax "
                                  f"nodes; at most {MAX_NODES} are allowed")
        names = set()
        for node in nodes:
            if not isinstance(node, _ALLOWED):
                raise ExpressionError(
                    f"expression {self.text!r} uses {type(node).__name__}, which is not allowed "
                    "(arithmetic, comparisons, and/or/not, x if c else y, and "
                    f"{', '.join(sorted(FUNCTIONS))} only)")
            if isinstance(node, ast.Call):
                if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS \
                        or node.keywords:
                    raise ExpressionError(
                        f"expression {self.text!r} calls something other than "
                        f"{', '.join(sorted(FUNCTIONS))} (positional arguments only)")
            elif isinstance(node, ast.Name) and node.id not in FUNCTIONS:
                if node.id.startswith("_"):
                    raise ExpressionError(f"expression {self.text!r}: name {node.id!r} may "
                                          "not start with '_'")
                names.add(node.id)
            elif isinstance(node, ast.Constant):
                if not isinstance(node.value, (int, float, str)) or (
                        isinstance(node.value, int) and node.value.bit_length() > MAX_INT_BITS):
                    raise ExpressionError(f"expression {self.text[:60]!r}: constant "
                                          f"{node.value!r:.40} is not a number or string "
                                          f"within {MAX_INT_BITS} bits")
        self.names = frozenset(names)
        tree = ast.fix_missing_locations(_Checked().visit(tree))
        self._check_constants(tree.body)
        self._code = compile(tree, f"<expr {self.text}>", "eval")

    def _check_constants(self, node) -> None:
        """Evaluate the largest parts without names now: a bomb in them is refused here."""
        if not isinstance(node, ast.expr):
            return
        if not _free_names(node):
            if isinstance(node, (ast.Constant, ast.Name)):
                return
            try:
                eval(compile(ast.Expression(node), "<const>", "eval"), _GLOBALS, {})  # noqa: S307
            except ExpressionError as exc:
                raise ExpressionError(f"expression {self.text[:80]!r}: {exc}") from None
            except _EVAL_ERRORS as exc:
                raise ExpressionError(f"expression {self.text[:80]!r} cannot be evaluated: "
                                      f"{type(exc).__name__}: {exc}") from None
            return
        for child in ast.iter_child_nodes(node):
            self._check_constants(child)

    def __call__(self, env: Mapping | None = None, **names):
        # a miss evaluates thousands of these: no copy of env unless names are added
        scope = env if env is not None and not names else dict(env or {}, **names)
        if not self.names <= scope.keys():
            missing = self.names - scope.keys()
            raise ExpressionError(
                f"expression {self.text!r} needs {', '.join(sorted(missing))}; "
                f"given: {', '.join(sorted(scope)) or 'nothing'}")
        try:
            return eval(self._code, _GLOBALS, scope)  # noqa: S307 (whitelisted, bounded)
        except ExpressionError as exc:
            raise ExpressionError(f"expression {self.text!r}: {exc}") from None
        except _EVAL_ERRORS as exc:
            raise ExpressionError(f"expression {self.text!r} failed: {type(exc).__name__}: "
                                  f"{exc}") from None

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
