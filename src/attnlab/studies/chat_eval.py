"""A chat model scored on the instruction mix's test conversations (`attnlab.data.chat_mix`), through
its chat template, as a user talks to it: each test prompt rendered by the model's own template,
a greedy reply generated until the end of the turn, the reply scored (`attnlab.eval.chat_scores`).

The arithmetic problems are asked twice: with the calculator (`arithmetic`: the tool form's system
message, and the decoders' tool loop, `attnlab.decode.tool_use`, running each call the reply makes
and letting the model go on from the tool's answer) and without it (`arithmetic-direct`: the model's
own arithmetic; a call it still writes is left as text, unanswered).

References: nanochat's chat evaluation (tasks scored by talking to the model, the calculator run
between its turns).
"""

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.decode import greedy_picker
from attnlab.decode.tool_use import TOOLS, reply_with_tools
from attnlab.errors import UserError
from attnlab.eval.chat_scores import SCORERS, TaskScore, prompt, reference, score
from attnlab.progress import ProgressLines

TOOL_REPLY_TOKENS = 96  # a call, and the sentence that states its number, are short
MAX_CALLS = 2  # the mix's answers make one call


@dataclass(frozen=True)
class ChatModel:
    """A model, its tokenizer and its chat template (`template.encode(tokenizer, messages)` -> ids,
    `template.end_of_turn`: the texts that end a reply), as `attnlab chat` loads them."""

    model: nn.Module
    tokenizer: Any
    template: Any

    @property
    def context(self) -> int | None:
        return getattr(self.model.config, "block_size", None)


def reply(chat: ChatModel, messages: Sequence[dict[str, Any]], max_new_tokens: int, *, calculator: bool = False) -> str:
    """The final greedy reply to `messages`, at most `max_new_tokens` tokens in all and what the
    context leaves ("" where the prompt alone fills it: scored as wrong). With `calculator`, each
    call the model makes is run and the reply goes on from the tool's answer
    (`attnlab.decode.tool_use.reply_with_tools`); the text after the last call is returned."""
    conversation = [dict(m) for m in messages]
    tools = {"calculator": TOOLS["calculator"]} if calculator else {}
    steps = reply_with_tools(
        chat.model,
        chat.tokenizer,
        chat.template,
        conversation,
        max_new_tokens,
        greedy_picker(),
        tools=tools,
        max_calls=MAX_CALLS,
        context=chat.context,
    )
    for _ in steps:
        pass
    return conversation[-1]["content"] if len(conversation) > len(messages) else ""


def read_test(mix_dir: Path, task: str, limit: int | None) -> list[dict[str, Any]]:
    """The first `limit` (all: None) test conversations of a task, test/TASK.jsonl."""
    path = mix_dir / "test" / f"{task}.jsonl"
    if not path.is_file():
        raise UserError(
            f"{path} does not exist; write the mix with `attnlab data chat-mix --data-dir DIR --out {mix_dir}`"
        )
    lines = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines() if text.strip()]
    return lines[:limit] if limit is not None else lines


def _budget(chat: ChatModel, line: dict[str, Any]) -> int:
    """Room for twice the reference's tokens, and a little: a longer reply is wrong anyway."""
    return 2 * len(chat.tokenizer.encode(reference(line))) + 16


def task_replies(chat: ChatModel, lines: Sequence[dict[str, Any]], task: str) -> list[str]:
    """The greedy reply to each test conversation's prompt; the calculator runs in the arithmetic task."""
    progress = ProgressLines(task, len(lines), "replies")
    out = []
    for line in lines:
        if task == "arithmetic":
            out.append(reply(chat, prompt(line), TOOL_REPLY_TOKENS, calculator=True))
        else:
            out.append(reply(chat, prompt(line), _budget(chat, line)))
        progress.update(1)
    return out


def score_mix(
    chat: ChatModel,
    mix_dir: str | Path,
    *,
    limit: int | None = None,
    tasks: Sequence[str] = tuple(SCORERS),
) -> tuple[list[TaskScore], dict[str, list[str]]]:
    """Each task's score on the mix's test conversations (the first `limit` of each), and the replies."""
    mix_dir = Path(mix_dir).expanduser()
    scores, replies = [], {}
    for task in tasks:
        lines = read_test(mix_dir, task, limit)
        start = time.perf_counter()
        replies[task] = task_replies(chat, lines, task)
        scores.append(score(task, replies[task], lines))
        sys.stderr.write(f"{task}: {len(lines)} test conversations in {time.perf_counter() - start:.0f}s\n")
    return scores, replies
