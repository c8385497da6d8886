"""The instruction mix's scores, computed from a chat model's replies (`attnlab.data.chat_mix`):
what each reply is worth against the test conversation's own last reply, the reference.

- translation: corpus BLEU of the replies against the English references (`attnlab.eval.bleu`,
  sacrebleu's signature beside it);
- sentiment: accuracy; a reply is right when, lowercased and stripped of surrounding spaces and
  final "." or "!", it is the label;
- tagging: UPOS accuracy over every word of every sentence; a reply that does not parse
  (`parse_tags`), or whose words are not the sentence's, scores all of that sentence's words wrong;
- arithmetic, arithmetic-direct: accuracy; the last number the final reply states is the answer.

These are pure functions of text: the replies come from `attnlab.studies.chat_eval`, or from
anywhere else (another model, a hand-written file).
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attnlab.data.chat_mix import parse_tags
from attnlab.eval.bleu import bleu

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class TaskScore:
    """One task's score: `score` in percent (BLEU is on its own 0-100 scale), over `n` examples
    (tagging: words); None where it could not be computed, `note` saying why; else `note` says how."""

    task: str
    metric: str
    score: float | None
    n: int
    note: str = ""


def prompt(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a test conversation asks with: those before its first assistant message."""
    messages = line["messages"]
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:first]


def reference(line: dict[str, Any]) -> str:
    """The test conversation's last reply: what the model should end up saying."""
    return line["messages"][-1]["content"]


def translation(replies: Sequence[str], references: Sequence[str]) -> TaskScore:
    result = bleu([r.strip() for r in replies], references)
    return TaskScore("translation", "BLEU", result.score, len(replies), result.signature)


def _label(text: str) -> str:
    return text.strip().rstrip(".!").strip().lower()


def sentiment(replies: Sequence[str], references: Sequence[str]) -> TaskScore:
    right = sum(_label(r) == ref for r, ref in zip(replies, references, strict=True))
    return TaskScore("sentiment", "accuracy", 100.0 * right / len(replies), len(replies))


def tagged_right(reply: str, gold: str) -> tuple[int, int, bool]:
    """(words tagged right, words, whether the reply parsed with the sentence's words) for one sentence.
    Example: ("I/PRON run/NOUN", "I/PRON run/VERB") -> (1, 2, True); ("I run", ...) -> (0, 2, False)."""
    want = parse_tags(gold)
    if want is None:
        raise ValueError(f"the reference {gold!r} is not a tagging reply")
    got = parse_tags(reply)
    if got is None or [w for w, _ in got] != [w for w, _ in want]:
        return 0, len(want), False
    return sum(g == w for (_, g), (_, w) in zip(got, want, strict=True)), len(want), True


def tagging(replies: Sequence[str], references: Sequence[str]) -> TaskScore:
    """UPOS accuracy; the note tells the replies that do not parse from those that parse but tag
    other words than the sentence's (a model that learnt the format but does not copy the words)."""
    right = words = unparsed = other = 0
    for reply, gold in zip(replies, references, strict=True):
        r, n, parsed = tagged_right(reply, gold)
        right, words = right + r, words + n
        unparsed += parse_tags(reply) is None
        other += not parsed and parse_tags(reply) is not None
    note = (
        f"{len(replies)} sentences; {unparsed} replies unparseable, {other} tagging other words than "
        "the sentence's (all their words wrong)"
    )
    return TaskScore("tagging", "UPOS accuracy", 100.0 * right / words, words, note)


def stated_number(text: str) -> float | None:
    """The last number a reply states, or None: "The answer is 4164." -> 4164.0."""
    found = NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def _arithmetic(task: str, metric: str, replies: Sequence[str], references: Sequence[str]) -> TaskScore:
    right = 0
    for reply, ref in zip(replies, references, strict=True):
        got, want = stated_number(reply), stated_number(ref)
        if want is None:
            raise ValueError(f"the reference {ref!r} states no number")
        right += got == want
    return TaskScore(task, metric, 100.0 * right / len(replies), len(replies))


def arithmetic(replies: Sequence[str], references: Sequence[str]) -> TaskScore:
    return _arithmetic("arithmetic", "accuracy, calculator", replies, references)


def arithmetic_direct(replies: Sequence[str], references: Sequence[str]) -> TaskScore:
    return _arithmetic("arithmetic-direct", "accuracy, no tool", replies, references)


SCORERS: dict[str, Callable[[Sequence[str], Sequence[str]], TaskScore]] = {
    "translation": translation,
    "sentiment": sentiment,
    "tagging": tagging,
    "arithmetic": arithmetic,
    "arithmetic-direct": arithmetic_direct,
}
"""The scored tasks, by the name of their test file (test/NAME.jsonl); continuation is not scored
(its test passages are for reading samples)."""


def score(task: str, replies: Sequence[str], lines: Sequence[dict[str, Any]]) -> TaskScore:
    """Task `task`'s score of `replies`, one per test conversation of `lines`, in order."""
    if len(replies) != len(lines):
        raise ValueError(f"{len(replies)} replies for {len(lines)} test conversations")
    if not lines:
        raise ValueError(f"no test conversations to score for {task}")
    return SCORERS[task](replies, [reference(line) for line in lines])


def table(scores: Sequence[TaskScore]) -> str:
    """The scores as a text table, one line a task."""
    rows = [("task", "metric", "score", "n", "note")]
    for s in scores:
        rows.append((s.task, s.metric, "-" if s.score is None else f"{s.score:.2f}", str(s.n), s.note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[4]]).rstrip() for r in rows)
