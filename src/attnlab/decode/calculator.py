"""The calculator a chat model calls while it generates (nanochat's tool): arithmetic, evaluated
safely and within bounds, whatever the model writes.

The expression is parsed by Python's `ast` (eval mode) and walked by hand: only numbers (int and
float literals), + - * / // % ** (binary), unary + and -, parentheses, and the functions
`FUNCTIONS` (sqrt, abs, round). Names, attributes, subscripts, strings, lambdas and every other
call are refused before anything is evaluated; nothing reaches Python's `eval`. Bounded: the
text's length (`MAX_CHARS`), the tree's depth (`MAX_DEPTH`), an integer's digits (`MAX_DIGITS`,
checked after each operation and, for a power, estimated from the logarithms before it is
computed, so 9**9**9 is refused at once rather than computed), and the time
(`MAX_SECONDS` of the walking thread's CPU time, checked at every node: the caps keep each single
operation short, the clock the whole walk; CPU time, not the wall clock, so that a busy machine,
which may leave the thread waiting longer than that between two nodes, does not turn a small
sum into an error). Every refusal and arithmetic failure is a `CalculatorError`, whose message is the
tool's answer (`calculate`: "error: division by zero").

References: nanochat's calculator tool (its Engine forces the tool's output into the sequence);
Python's `ast` documentation (the node classes walked here).
"""

import ast
import math
import operator
import time
from collections.abc import Callable

MAX_CHARS = 200
MAX_DEPTH = 100  # a flat sum of MAX_CHARS characters is this deep; deeper is a chain of unary signs
MAX_DIGITS = 1000
LIMIT = 10**MAX_DIGITS  # the smallest integer with more digits than that
MAX_SECONDS = 0.1
MAX_ROUND_DIGITS = 20  # round(x, n): |n| at most this (a huge n makes int rounding build 10**n)
SIGNIFICANT = 12  # a float's answer: this many significant digits, trailing zeros dropped

Number = int | float

BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "sqrt": (math.sqrt, (1,)),
    "abs": (abs, (1,)),
    "round": (round, (1, 2)),
}
"""The functions an expression may call: name -> (function, the numbers of arguments it takes)."""
ALLOWED = "numbers, + - * / // % **, parentheses and " + ", ".join(FUNCTIONS)


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message says why."""


def calculate(expression: str) -> str:
    """The tool's answer to `expression`: its value (`format_number`), or "error: why"."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError as e:
        return f"error: {e}"


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; a `CalculatorError` for anything else or past a bound."""
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is {len(expression)} characters long; at most {MAX_CHARS}")
    if not expression.strip():
        raise CalculatorError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"cannot read {expression.strip()!r} as arithmetic ({ALLOWED})") from None
    return _Walk(time.thread_time() + MAX_SECONDS).value(tree.body, 1)


class _Walk:
    """One evaluation: the nodes walked against the clock."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def value(self, node: ast.AST, depth: int) -> Number:
        if depth > MAX_DEPTH:
            raise CalculatorError(f"the expression is nested more than {MAX_DEPTH} deep")
        if time.thread_time() > self.deadline:
            raise CalculatorError(f"the expression took longer than {MAX_SECONDS} s")
        try:
            return _checked(self._node(node, depth))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None

    def _node(self, node: ast.AST, depth: int) -> Number:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # bool is no number here
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            return UNARY[type(node.op)](self.value(node.operand, depth + 1))
        if isinstance(node, ast.BinOp) and (type(node.op) in BINARY or isinstance(node.op, ast.Pow)):
            left, right = self.value(node.left, depth + 1), self.value(node.right, depth + 1)
            if isinstance(node.op, ast.Pow):
                return power(left, right)
            return BINARY[type(node.op)](left, right)
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        raise CalculatorError(_refusal(node))

    def _call(self, node: ast.Call, depth: int) -> Number:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name is None:
            raise CalculatorError(_refusal(node.func))
        if name not in FUNCTIONS:
            raise CalculatorError(f"unknown function {name!r}; the calculator takes {ALLOWED}")
        function, counts = FUNCTIONS[name]
        if node.keywords or len(node.args) not in counts or any(isinstance(a, ast.Starred) for a in node.args):
            raise CalculatorError(f"{name} takes {' or '.join(map(str, counts))} number(s), nothing else")
        args = [self.value(a, depth + 1) for a in node.args]
        if name == "sqrt" and args[0] < 0:
            raise CalculatorError("sqrt of a negative number")
        if name == "round" and len(args) == 2:
            if type(args[1]) is not int or abs(args[1]) > MAX_ROUND_DIGITS:
                raise CalculatorError(f"round's digits must be a whole number within ±{MAX_ROUND_DIGITS}")
        return function(*args)


def power(base: Number, exponent: Number) -> Number:
    """base ** exponent, refused before it is computed when the integer result would have more than
    `MAX_DIGITS` digits (its digits: exponent × log10 |base|); a float overflow is an error too."""
    if type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1:
        digits = exponent * math.log10(abs(base))
        if digits > MAX_DIGITS:
            raise CalculatorError(f"the result would have about {digits:.3g} digits; at most {MAX_DIGITS}")
    result = base**exponent
    if isinstance(result, complex):  # a negative base to a fractional power
        raise CalculatorError("the result is not a real number")
    return result


def _checked(x: Number) -> Number:
    """x, refused where it is no finite real number or an integer past `MAX_DIGITS` digits."""
    if type(x) is int:
        if abs(x) >= LIMIT:
            raise CalculatorError(f"the result has more than {MAX_DIGITS} digits")
        return x
    if type(x) is not float:
        raise CalculatorError("the result is not a real number")
    if not math.isfinite(x):
        raise CalculatorError("the result is too large" if math.isinf(x) else "the result is not a number")
    return x


def _refusal(node: ast.AST) -> str:
    """Why a node is refused, in the words of what it is."""
    if isinstance(node, ast.Name):
        return f"unknown name {node.id!r}; the calculator takes {ALLOWED}"
    if isinstance(node, ast.Attribute):
        return f"attributes (.{node.attr}) are not arithmetic; the calculator takes {ALLOWED}"
    if isinstance(node, ast.Constant):
        return f"{type(node.value).__name__} {node.value!r} is not a number the calculator takes"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        return "^ is not a power here: write ** (2**10)"
    return f"{type(node).__name__} is not arithmetic; the calculator takes {ALLOWED}"


def format_number(x: Number) -> str:
    """An answer as a person writes it: an int as it is, a float to `SIGNIFICANT` digits without
    trailing zeros (10/4 -> 2.5, 10/2 -> 5, 1/3 -> 0.333333333333)."""
    if type(x) is int:
        return str(x)
    return format(x + 0.0, f".{SIGNIFICANT}g")  # + 0.0: -0.0 becomes 0.0
