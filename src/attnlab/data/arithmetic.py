"""Arithmetic word problems with three-digit numbers, generated, and their conversations: the
answer worked out by the calculator tool, or stated directly.

A problem is one operation on two numbers (+, - and * on three-digit numbers; a little exact
division of a three-digit number by a small one), told as a short story. In the tool form the
assistant calls `calculator` with the expression, reads the tool's reply and states the number
(nanochat's pattern: the model learns to hand the arithmetic to a tool); in the direct form it
states the number at once (the model's own arithmetic, for comparison). The calls have OpenAI's
shape: `tool_calls=[{"id": "call_1", "type": "function", "function": {"name": "calculator",
"arguments": "{\\"expression\\": \\"347 * 12\\"}"}}]`, then a `tool` message with the result.

References: OpenAI's function-calling guide (the messages of a tool call); nanochat's calculator
tool (Karpathy 2025).
"""

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TOOL_NAME = "calculator"  # the tool `attnlab.decode.tool_use.CALCULATOR` runs, which defines it
TOOL_SYSTEM = "You can use the calculator tool."
"""The system message of a problem in the tool form: attnlab's template does not render the
request's `tools`, so this is what tells the model that the tool is there."""
OPERATIONS = ("+", "-", "*", "/")
WEIGHTS = (3, 3, 3, 1)  # "a little division"

_NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas")
_STORIES = {
    "+": (
        "{name} has {a} {things} and gets {b} more. How many {things} does {name} have now?",
        "A shop sold {a} {things} on Monday and {b} on Tuesday. How many {things} did it sell in all?",
        "There are {a} {things} in one room and {b} in another. How many {things} are there altogether?",
    ),
    "-": (
        "{name} had {a} {things} and gave away {b}. How many {things} are left?",
        "A box held {a} {things}; {b} were taken out. How many {things} are still in the box?",
        "A farm had {a} {things} and sold {b}. How many {things} does the farm have now?",
    ),
    "*": (
        "A crate holds {b} {things}. How many {things} are in {a} crates?",
        "{name} buys {a} bags with {b} {things} in each. How many {things} is that?",
        "Each of {a} shelves carries {b} {things}. How many {things} are on the shelves?",
    ),
    "/": (
        "{a} {things} are shared equally among {b} children. How many {things} does each child get?",
        "{name} packs {a} {things} into {b} equal boxes. How many {things} go in each box?",
    ),
}
_THINGS = ("apples", "marbles", "books", "stamps", "pencils", "coins", "cards", "shells")


@dataclass(frozen=True)
class Problem:
    """One operation `a op b` and its story; `answer` is exact (a division has no remainder)."""

    op: str
    a: int
    b: int
    question: str

    @property
    def expression(self) -> str:
        """What the assistant passes the calculator, e.g. "347 * 12"."""
        return f"{self.a} {self.op} {self.b}"

    @property
    def answer(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b, "/": self.a // self.b}[self.op]

    @property
    def key(self) -> tuple[str, int, int]:
        """The computation, the same for 12 + 347 and 347 + 12: what test and train must not share."""
        a, b = (min(self.a, self.b), max(self.a, self.b)) if self.op in "+*" else (self.a, self.b)
        return (self.op, a, b)


def _operands(op: str, rng: random.Random) -> tuple[int, int]:
    """Two three-digit numbers (a > b for a difference); for a division a three-digit multiple
    of a divisor from 2 to 19, so that the answer is a whole number."""
    if op == "/":
        b = rng.randint(2, 19)
        return b * rng.randint(-(-100 // b), 999 // b), b
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    if op == "-" and a < b:
        a, b = b, a
    return a, b


def random_problem(rng: random.Random) -> Problem:
    """One problem drawn from `rng`: its operation (+, -, * three times as often as /), numbers and story."""
    op = rng.choices(OPERATIONS, weights=WEIGHTS)[0]
    a, b = _operands(op, rng)
    story = rng.choice(_STORIES[op])
    return Problem(op, a, b, story.format(a=a, b=b, name=rng.choice(_NAMES), things=rng.choice(_THINGS)))


def problems(n: int, rng: random.Random, exclude: Iterable[tuple[str, int, int]] = ()) -> list[Problem]:
    """`n` problems, no two with the same computation (`Problem.key`), none of those in `exclude`."""
    seen = set(exclude)
    out: list[Problem] = []
    while len(out) < n:
        p = random_problem(rng)
        if p.key not in seen:
            seen.add(p.key)
            out.append(p)
    return out


def final_answer(value: int | str) -> str:
    """The assistant's last message, which states the number: 4164 -> "The answer is 4164."."""
    return f"The answer is {value}."


def with_tool(problem: Problem) -> dict[str, Any]:
    """The conversation (one JSONL line's object) in which the calculator works the answer out."""
    arguments = json.dumps({"expression": problem.expression})
    call = {"id": "call_1", "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}
    return {
        "messages": [
            {"role": "system", "content": TOOL_SYSTEM},
            {"role": "user", "content": problem.question},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": str(problem.answer)},
            {"role": "assistant", "content": final_answer(problem.answer)},
        ]
    }


def direct(problem: Problem) -> dict[str, Any]:
    """The conversation in which the assistant states the answer without the tool."""
    return {
        "messages": [
            {"role": "user", "content": problem.question},
            {"role": "assistant", "content": final_answer(problem.answer)},
        ]
    }
