"""The calculator tool (`attnlab.decode.calculator`): arithmetic as Python computes it (random
expressions of the allowed operators, checked against Python's own evaluation of the same text),
and every crafted attack or runaway (huge powers, division by zero, names, attributes, lambdas,
dunder tricks, long or deeply nested input) answered with a clear error, quickly, never an
exception and never code execution."""

import math
import random
import time

import pytest

from attnlab.decode.calculator import (
    MAX_CHARS,
    MAX_DEPTH,
    MAX_DIGITS,
    CalculatorError,
    calculate,
    evaluate,
    format_number,
)

OPERATORS = ["+", "-", "*", "/", "//", "%", "**"]


def random_expression(rng: random.Random, depth: int) -> str:
    """A random expression of the calculator's operators, unary minus and parentheses."""
    if depth == 0 or rng.random() < 0.3:
        number = rng.choice([str(rng.randint(0, 50)), f"{rng.uniform(0, 20):.2f}"])
        return f"-{number}" if rng.random() < 0.2 else number
    op = rng.choice(OPERATORS)
    left, right = random_expression(rng, depth - 1), random_expression(rng, depth - 1)
    if op == "**":  # small exponents keep Python's own answer in range
        right = str(rng.randint(0, 3))
    text = f"{left} {op} {right}"
    return f"({text})" if rng.random() < 0.5 else text


def python_value(text: str):
    """Python's own value of an expression this test wrote (the independent reference)."""
    try:
        return eval(text, {"__builtins__": {}}, {})  # noqa: S307 - the test's own arithmetic, no input
    except (ZeroDivisionError, OverflowError):
        return None


def test_precedence_and_values_match_pythons_on_random_expressions():
    rng = random.Random(0)
    checked = 0
    for _ in range(2000):
        text = random_expression(rng, 3)
        want = python_value(text)
        if want is None or isinstance(want, complex) or (isinstance(want, float) and not math.isfinite(want)):
            with pytest.raises(CalculatorError):
                evaluate(text)
            continue
        if isinstance(want, int) and abs(want) >= 10**MAX_DIGITS:
            continue
        got = evaluate(text)
        assert type(got) is type(want) and got == want, text
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize(
    "text, want",
    [
        ("347*12", "4164"),
        ("347 * 12", "4164"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-3**2", "-9"),  # ** binds tighter than unary minus, as in Python
        ("2**3**2", "512"),  # ** is right-associative
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("-7 % 3", "2"),
        ("10 / 4", "2.5"),
        ("10 / 2", "5"),
        ("1 / 3", "0.333333333333"),
        ("0.1 + 0.2", "0.3"),
        ("2 ** -2", "0.25"),
        ("-(-(5))", "5"),
        ("+4", "4"),
        ("1.5e3 * 2", "3000"),
        ("0 * -1.0", "0"),
        ("sqrt(16)", "4"),
        ("abs(-3.5)", "3.5"),
        ("round(2.567, 2)", "2.57"),
        ("round(1234, -2)", "1200"),
        ("12345678901234567890 * 98765432109876543210", str(12345678901234567890 * 98765432109876543210)),
    ],
)
def test_answers(text, want):
    assert calculate(text) == want


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("9**9**9", "digits"),
        ("10**100000", "digits"),
        ("2**10**10", "digits"),
        ("(-10)**5000", "digits"),
        ("10**999 * 10**999", "more than 1000 digits"),
        ("10**1000", "more than 1000 digits"),
        ("1/0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("1e308 * 10", "too large"),
        ("2.0 ** 10000", "too large"),
        ("10**999 / 0.5", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("sqrt(-1)", "negative"),
        ("round(5, -10**100)", "round's digits"),
        ("round(5, 2.5)", "round's digits"),
        ("__import__('os').system('echo hacked')", "attributes (.system)"),
        ("__import__('os')", "unknown function '__import__'"),
        ("().__class__", "attributes (.__class__)"),
        ("(1).__class__.__bases__", "attributes"),
        ("x + 1", "unknown name 'x'"),
        ("pi", "unknown name 'pi'"),
        ("math.sqrt(4)", "attributes (.sqrt)"),
        ("print(1)", "unknown function 'print'"),
        ("eval('1+1')", "unknown function 'eval'"),
        ("sqrt(x=4)", "sqrt takes 1"),
        ("sqrt(*[4])", "sqrt takes 1"),
        ("abs(1, 2)", "abs takes 1"),
        ("lambda: 1", "Lambda is not arithmetic"),
        ("(lambda: 1)()", "Lambda is not arithmetic"),
        ("[1, 2][0]", "Subscript is not arithmetic"),
        ("'a' * 3", "str 'a' is not a number"),
        ("b'1'", "bytes"),
        ("True + 1", "bool True"),
        ("1j * 1j", "complex"),
        ("1 if 1 else 2", "IfExp"),
        ("1 < 2", "Compare"),
        ("2 ^ 10", "write **"),
        ("1 << 10", "BinOp is not arithmetic"),
        ("[x for x in ()]", "ListComp"),
        ("f'{1}'", "JoinedStr"),
        ("(a := 1)", "NamedExpr"),
        ("1 +", "cannot read"),
        ("import os", "cannot read"),
        ("1; 2", "cannot read"),
        ("", "empty"),
        ("   ", "empty"),
        ("1\x002", "cannot read"),
    ],
)
def test_crafted_calls_are_clear_errors(text, fragment):
    start = time.monotonic()
    answer = calculate(text)
    assert answer.startswith("error: ") and fragment in answer, answer
    assert time.monotonic() - start < 1.0  # refused, not computed
    with pytest.raises(CalculatorError):
        evaluate(text)


def test_long_and_deeply_nested_input_is_refused():
    assert "at most 200" in calculate("1+" * 100 + "1")
    assert len("1+" * 99 + "1") <= MAX_CHARS and calculate("1+" * 99 + "1") == "100"
    nested = "-" * (MAX_DEPTH + 1) + "1"
    assert f"nested more than {MAX_DEPTH}" in calculate(nested)
    assert calculate("-" * (MAX_DEPTH - 1) + "1") == str((-1) ** (MAX_DEPTH - 1))
    parens = "(1+" * 40 + "1" + ")" * 40
    assert len(parens) <= MAX_CHARS and calculate(parens) == "41"
    assert calculate("((((((((((1))))))))))") == "1"  # parentheses alone nest nothing


def test_the_answers_of_non_strings_and_big_integers():
    with pytest.raises(CalculatorError, match="must be a string"):
        evaluate(4)  # type: ignore[arg-type]
    big = 10 ** (MAX_DIGITS - 1)
    assert calculate(f"10**{MAX_DIGITS - 1}") == str(big)
    assert format_number(-0.0) == "0" and format_number(2.0**0.5) == "1.41421356237"
    assert format_number(1e20) == "1e+20" and format_number(7) == "7"


def test_no_code_runs(tmp_path, monkeypatch):
    """A call that would write a file, were it run, writes nothing."""
    monkeypatch.chdir(tmp_path)
    for text in ("open('owned', 'w').write('x')", "__import__('pathlib').Path('owned').touch()"):
        assert calculate(text).startswith("error: ")
    assert not (tmp_path / "owned").exists()


def test_the_clock_is_checked_at_every_node(monkeypatch):
    from attnlab.decode import calculator

    monkeypatch.setattr(calculator, "MAX_SECONDS", -1.0)  # a deadline already past
    assert calculate("1 + 1").startswith("error: the expression took longer than")


def test_time_the_calculator_waits_for_the_cpu_is_not_its_time():
    """The bound is on the walk's own CPU time: a busy machine (here another thread that holds the
    interpreter for longer than MAX_SECONDS at a time, in one C call) delays a small sum but does
    not make it an error, as a wall clock would on a loaded machine."""
    import sys
    import threading

    from attnlab.decode import calculator

    expression = "+".join(["1"] * 60)  # a walk long enough to be interrupted
    stop, answers = threading.Event(), []

    def hold_the_interpreter() -> None:
        while not stop.is_set():
            sum(range(10_000_000))  # one C call: the interpreter is not handed back until it ends

    interval = sys.getswitchinterval()
    # The calculator's thread gives the interpreter up within a tenth of a millisecond of being
    # asked, so each walk waits out several of the other thread's calls. (Far shorter, and the
    # waiting itself costs the thread CPU time: it wakes to ask for the interpreter that often.)
    sys.setswitchinterval(1e-4)
    other = threading.Thread(target=hold_the_interpreter)
    other.start()
    try:
        start = time.monotonic()
        while time.monotonic() - start < 30 * calculator.MAX_SECONDS:
            answers.append(calculate(expression))
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(interval)
    assert len(answers) >= 2 and set(answers) == {"60"}
