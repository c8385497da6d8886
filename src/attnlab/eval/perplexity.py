"""Perplexity of a long text under a fixed-length language model: the strided sliding window
(`attnlab eval FOLDER|RUN --data FILE`).

A model that reads at most `context` tokens cannot condition on the whole text. Cutting it into
disjoint blocks leaves the first tokens of every block with almost no context; sliding the
window one token at a time gives every token a full context but costs a forward per token. The
compromise of `transformers`' guide "Perplexity of fixed-length models": windows of `context`
tokens that start every `stride` tokens, each scoring only the tokens that the window before it
did not reach, so every token after the first is scored exactly once, with at least
`context - stride` tokens before it (as many as there are, near the start). With stride =
context the windows are disjoint and, as in the guide, each one's first token goes unscored.

References: the guide's recipe (huggingface.co/docs/transformers/perplexity), whose loop
`windows` reproduces; its token count subtracts one per window even where the window's first
label is context and already ignored, so with overlapping windows its mean weights each window
by one token fewer than it scored. Here each token counts once (`tests/cli/test_eval_ppl.py`
writes the recipe out and shows both).
"""

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import UserError
from attnlab.eval.language_model import LanguageModel, encode
from attnlab.progress import ProgressLines


@dataclass(frozen=True)
class Window:
    """One forward of the sliding window: tokens [begin, end) in, tokens [first_scored, end) scored."""

    begin: int
    end: int
    first_scored: int

    @property
    def scored(self) -> int:
        return self.end - self.first_scored


def windows(n_tokens: int, context: int, stride: int) -> list[Window]:
    """The guide's windows over a text of `n_tokens`: one starts every `stride` tokens, reads up to
    `context`, and scores from where the previous one ended (the first never scores token 0, which
    nothing predicts). Example: windows(10, 4, 2) -> [0,4) scores 1-3, [2,6) 4-5, [4,8) 6-7, [6,10) 8-9."""
    if not 1 <= stride <= context:
        raise ValueError(f"stride must be in [1, context={context}], got {stride}")
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        out.append(Window(begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n_tokens:
            break
    return out


@dataclass(frozen=True)
class SlidingNLL:
    """The summed negative log-likelihood (nats) of the scored tokens and how many were scored."""

    nll: float
    tokens: int
    windows: int

    @property
    def mean_nll(self) -> float:
        return self.nll / self.tokens if self.tokens else math.nan

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll) if self.mean_nll < 700 else math.inf


def _batches(ws: list[Window], batch_size: int) -> Iterator[list[Window]]:
    """Consecutive windows of equal length, at most batch_size at a time (only the last window
    of a text can be shorter, so this pads nothing)."""
    batch: list[Window] = []
    for w in ws:
        if batch and (len(batch) == batch_size or w.end - w.begin != batch[0].end - batch[0].begin):
            yield batch
            batch = []
        batch.append(w)
    if batch:
        yield batch


@torch.no_grad()
def sliding_window_nll(
    model: nn.Module,
    ids: torch.Tensor,
    context: int,
    stride: int,
    *,
    batch_size: int = 8,
    on_batch: Callable[[int], object] | None = None,
) -> SlidingNLL:
    """Score the text `ids` `(N,)` (long) with `model` (`model(idx (B, T)) -> logits (B, T, V)`)
    through the strided sliding window of `windows`. The log-softmax is taken in float32 and
    summed in float64. `on_batch(n)` is called after each forward with the tokens it scored."""
    ids = ids.to(next(model.parameters()).device)
    total, count, ws = 0.0, 0, windows(len(ids), context, stride)
    for batch in _batches(ws, batch_size):
        x = torch.stack([ids[w.begin : w.end] for w in batch])  # (B, T)
        logits = model(x)  # (B, T, V)
        for row, w in zip(logits, batch, strict=True):
            # logits at position t predict token t + 1: the scored tokens' predictions start one earlier.
            start = w.first_scored - w.begin
            logp = F.log_softmax(row[start - 1 : -1].float(), dim=-1)  # (scored, V)
            target = ids[w.first_scored : w.end]
            total -= logp.gather(-1, target[:, None]).double().sum().item()
        scored = sum(w.scored for w in batch)
        count += scored
        if on_batch is not None:
            on_batch(scored)
    return SlidingNLL(total, count, len(ws))


@dataclass(frozen=True)
class TextPerplexity:
    """`text_perplexity`'s answer: what `attnlab eval --data` prints."""

    perplexity: float
    mean_nll: float
    """Nats per scored token."""
    tokens: int
    """Tokens scored: all but the text's first (with stride = context: all but each window's first)."""
    windows: int
    context: int
    stride: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.inf


def check_window(lm: LanguageModel, context: int, stride: int) -> None:
    """UserError unless `lm` can read `context` tokens and 1 <= stride <= context."""
    if context < 2:
        raise UserError(f"--context must be >= 2 (one token read, one scored), got {context}")
    if lm.max_context is not None and context > lm.max_context:
        why = "its config.json says so" if lm.source != "run" else f"{lm.model.config.positions} positions stop there"
        raise UserError(
            f"--context {context} is past this model's context: it reads at most {lm.max_context} tokens "
            f"({why}); pass --context {lm.max_context} or less"
        )
    if not 1 <= stride <= context:
        raise UserError(
            f"--stride must be between 1 and --context ({context}), got {stride}: a stride past the "
            "context would skip tokens; equal to it, the windows do not overlap"
        )


def text_perplexity(
    lm: LanguageModel,
    text: str,
    *,
    context: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    progress: Callable[[str], object] | None = None,
) -> TextPerplexity:
    """Perplexity of `text` under `lm` with the strided sliding window (`sliding_window_nll`).

    The text is encoded as the tokenizer encodes by default (with Llama's "<s>" first where the
    folder's tokenizer adds it), as the guide's `tokenizer(text)` does. context: the window
    (default the model's context); stride: how far it moves (default half the context, the
    guide's 512 of 1024). progress: where the progress lines go (default stderr)."""
    context = lm.context if context is None else context
    stride = max(1, context // 2) if stride is None else stride
    check_window(lm, context, stride)
    ids = encode(lm.tokenizer, text)
    if len(ids) < 2:
        raise UserError(f"the text has {len(ids)} token(s); perplexity needs at least 2 (one read, one scored)")
    lines = ProgressLines("perplexity", len(ids) - 1, "tokens scored", write=progress)
    start = time.perf_counter()
    result = sliding_window_nll(
        lm.model, torch.tensor(ids, dtype=torch.long), context, stride, batch_size=batch_size, on_batch=lines.update
    )
    seconds = time.perf_counter() - start
    return TextPerplexity(result.perplexity, result.mean_nll, result.tokens, result.windows, context, stride, seconds)
