"""Server-side tools (`attnlab serve --tools calculator`): tools the operator lets the server
answer itself, while it generates a chat reply, as `attnlab chat --tools` does in the terminal
(`attnlab.decode.tool_use`).

A chat request that brings no `tools` of its own (a client's tools are the client's to run: the
reply's calls go back to it, `attnlab.serve.tools`) and asks for no `response_format`, to a model
whose template teaches a call format, gets the server's tools in its prompt (the template renders
their definitions). Where a choice's reply ends its turn on complete calls, the server answers
them, appends the assistant's call and the tools' answers to the conversation, and continues the
same choice from the conversation rendered again (a new stream of the model's worker: the
continuation is one more completion in the continuous batch, its prompt mostly found in the prefix
cache). At most `attnlab.decode.tool_use.MAX_CALLS` calls a reply; a call past them, or one cut
by max_tokens, stays the reply's text.

What the client sees is OpenAI's chat completion, unchanged in shape: the message's content is the
text the model wrote outside its calls (any words before a call, then the final answer); the calls
and the tools' answers are left out of the response (an OpenAI client has no field for a call
the server ran) and logged at INFO (`attnlab.serve.server_tools`). Streamed, a possible call's
text is held back until it is one. `usage.completion_tokens` counts every token the model
generated, its calls' included; the tools' answers and each continuation's prompt are not counted.
With `logprobs`, the scores of the content's tokens come back; a call's tokens' are left out with it.
"""

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping

from attnlab.decode.tool_calls import ToolFormat, call_prefix, format_of, split
from attnlab.decode.tool_use import MAX_CALLS, Tool, answer_calls, definitions, for_template, tools_named
from attnlab.serve import completions
from attnlab.serve.worker import Piece, QueueFull

log = logging.getLogger(__name__)


def answered(served, body, names: tuple[str, ...]) -> dict[str, Tool]:
    """The tools the server answers in this chat request (empty: none): the operator's `names`,
    unless the request brings tools or a response_format of its own or the model's template
    teaches no call format."""
    if not names or body.tools or (body.response_format is not None and body.response_format.type != "text"):
        return {}
    if served.chat is None or format_of(served.chat.source) is None:
        return {}
    return tools_named(names)


class ToolLoop:
    """One choice's reply with the server's tools answered: what the chat handlers read of a worker
    `Stream` (its pieces, `cancel`, `finish_reason`, `error`, the token counts), over the streams
    of its parts. messages: the conversation as the template takes it (`tools.template_message`)."""

    def __init__(self, served, first, messages: list[dict], tools: Mapping[str, Tool]) -> None:
        self.served, self.current, self.tools = served, first, tools
        self.fmt: ToolFormat = format_of(served.chat.source)
        self.messages = list(messages)
        self.prompt_tokens, self.prompt_scores = first.prompt_tokens, first.prompt_scores
        self.first, self.spent = first, 0  # tokens of the parts before the current one
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.cancelled = False

    @property
    def completion_tokens(self) -> int:
        return self.spent + self.current.completion_tokens

    @property
    def cached_tokens(self) -> int:
        return self.first.cached_tokens

    def cancel(self) -> None:
        self.cancelled = True
        self.current.cancel()

    async def __aiter__(self) -> AsyncIterator[Piece]:
        calls = 0
        while True:
            part = _Part(self.fmt)
            async for piece in self.current:
                if (out := part.feed(piece)) is not None:
                    yield out
            stream = self.current
            ended = stream.finish_reason == "stop" and not (stream.error or self.cancelled)
            added, results = answer_calls(part.text, self.fmt, self.tools, calls + 1) if ended else ([], [])
            if not results or calls + len(results) > MAX_CALLS:
                if (out := part.rest()) is not None:
                    yield out
                self.finish_reason, self.error = stream.finish_reason, stream.error
                return
            for r in results:
                log.info("%s: [%s] %s", self.served.name, r.name, r.summary())
            calls += len(results)
            self.messages.extend(for_template(added))
            if not self._go_on():
                return

    def _go_on(self) -> bool:
        """Start the next part: the conversation so far, the assistant's turn opened; False (the
        reply ends, "length") when its tokens or the model's context are spent, or an error when
        the model's queue is full."""
        stream = self.current
        self.spent += stream.completion_tokens
        budget = stream.sampling.max_tokens - stream.completion_tokens
        ids = self.served.chat.encode(
            self.served.run.tokenizer, self.messages, add_generation_prompt=True, tools=definitions(self.tools)
        )
        # Within the model's context, as `completions.room` keeps a completion (a continuation does
        # not go past it even where the server lets completions).
        budget = min(budget, completions.model_context(self.served) - len(ids) + 1)
        if budget <= 0 or len(ids) > self.served.context:
            self.finish_reason = "length"
            return False
        settings = dataclasses.replace(stream.sampling, max_tokens=budget)
        try:
            self.current = self.served.worker.submit(ids, settings)
        except QueueFull as e:
            self.finish_reason, self.error = "length", f"a tool call was answered, but the model's queue is full: {e}"
            return False
        return True


class _Part:
    """The text of one part of a reply, sent as far as it cannot be a call; the held pieces'
    scores go out with the next text sent."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt, self.text, self.sent = fmt, "", 0
        self.tokens, self.scores = 0, []

    def feed(self, piece: Piece) -> Piece | None:
        self.text += piece.text
        self.tokens += piece.tokens
        self.scores.extend(piece.scores)
        found = split(self.text, self.fmt, final=False)
        end = found.start if found.start is not None else len(self.text) - call_prefix(self.text, self.fmt)
        return self._out(end) if end > self.sent else None

    def rest(self) -> Piece | None:
        """What is held back, once the part is plain text after all."""
        return self._out(len(self.text)) if len(self.text) > self.sent or self.scores else None

    def _out(self, end: int) -> Piece:
        piece = Piece(self.text[self.sent : end], self.tokens, tuple(self.scores))
        self.sent, self.tokens, self.scores = end, 0, []
        return piece
