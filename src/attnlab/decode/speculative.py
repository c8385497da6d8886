"""Speculative decoding, exact: a cheap drafter proposes k tokens, the target model scores them all
in one forward, and a rejection rule keeps what the target alone would have produced.

- Greedy (any picker that is a function of the logits): the drafts are kept while the target's own
  pick agrees with them, then the target's pick at the first disagreement (or after the last draft)
  is added. The output is the target's, token for token.
- Sampling (a `Sampler`): with p the target's distribution at a position and q the drafter's, both
  after the same temperature, top-k and top-p as plain sampling applies, a drafted x is kept with
  probability min(1, p(x) / q(x)); the first one rejected is replaced by a draw from
  norm(max(0, p − q)); when all are kept, a bonus token is drawn from the target's next p. Each
  token so emitted has law p whatever q is (Leviathan, Kalman & Matias 2023, "Fast Inference from
  Transformers via Speculative Decoding", Algorithm 1 and Theorem 3.5; Chen et al. 2023,
  "Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2). A
  deterministic draft (prompt lookup) is q = one-hot(x): kept with probability p(x).

Two drafters share one interface (`Drafter.draft(context, k, pick) -> Draft`): `ModelDrafter`, a
smaller model with the same tokenizer and its own KV cache, and `PromptLookup`, which copies what
followed the latest earlier occurrence of the context's last n tokens (prompt lookup decoding,
Saxena 2023; llama.cpp's and vLLM's n-gram drafts): no second model.

The target's KV cache holds every token but the newest ("pending"); one verification reads
[pending, d1 … dk] and gives k + 1 rows of logits, row j predicting the token after d_j. The keys of
rejected drafts are then cut off (`ModelCache.truncate`). With `fused=True` the verification is one
call of the fused C++ step (`FusedStep.extend`, where it covers the model), whose products read
each weight once for the k + 1 tokens: a step then costs little more than one plain fused step.
Past block_size the window slides as in `generate_tokens` (the last block_size tokens recomputed
for each token): each of the k + 1 positions then has a window of its own, and the k + 1 windows
are read as one batch. Batch 1; full KV caches only (a window model's ring cannot be rolled back).
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from attnlab.accel import for_decoding
from attnlab.accel.plan import DecodePlan, plan_decoding
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.sampling import Picker, Sampler, _eval_mode, top_k_filter, top_p_filter
from attnlab.errors import UserError
from attnlab.models.protocols import CausalDecoder
from attnlab.nn.attention import KVCache, ModelCache, RollingKVCache

if TYPE_CHECKING:
    from attnlab.accel.fused import FusedStep

MAX_DRAFT_TOKENS = 16
"""The most tokens a drafter proposes per step (`--draft-k`): llama.cpp's default --draft-max."""


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and, for a sampled draft, the distribution each was drawn from `(n, V)`;
    None for a deterministic draft (a copy from the context, or a greedy drafter's pick)."""

    tokens: list[int]
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    """Proposes up to k tokens to follow `context` (the prompt and the tokens kept so far)."""

    def draft(self, context: list[int], k: int, pick: Picker) -> Draft: ...


@dataclass
class SpeculationStats:
    """What speculation did over one or more generations: target forwards that checked a draft,
    tokens drafted, drafted tokens kept, and tokens emitted by those forwards."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per target forward: 1 without speculation, at most k + 1."""
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float:
        """The fraction of drafted tokens the target kept."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def add(self, drafted: int, emitted: int) -> None:
        """Count one target forward that checked `drafted` tokens and emitted `emitted`."""
        self.steps, self.drafted = self.steps + 1, self.drafted + drafted
        self.accepted, self.emitted = self.accepted + emitted - 1, self.emitted + emitted

    def summary(self) -> str:
        return (
            f"speculative decoding: {self.emitted} tokens in {self.steps} target steps "
            f"({self.tokens_per_step:.2f} per step); {self.accepted} of {self.drafted} drafted tokens "
            f"accepted ({100 * self.acceptance:.0f}%)"
        )


@dataclass
class Speculation:
    """A drafter and how many tokens it proposes per step; `stats` accumulates over generations."""

    drafter: Drafter
    k: int = 4
    stats: SpeculationStats = field(default_factory=SpeculationStats)

    def __post_init__(self) -> None:
        check_draft_k(self.k)


def check_draft_k(k: int) -> None:
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise UserError(f"draft k must be an integer from 1 to {MAX_DRAFT_TOKENS}, got {k}")


def probabilities(sampler: Sampler, logits: torch.Tensor) -> torch.Tensor:
    """The distribution `(B, V)` that `sampler` draws from for logits `(B, V)`: the temperature,
    then its top-k and top-p filters, as `Sampler.__call__` applies them."""
    logits = logits.float() / sampler.temperature
    if sampler.top_k is not None:
        logits = top_k_filter(logits, sampler.top_k)
    if sampler.top_p is not None:
        logits = top_p_filter(logits, sampler.top_p)
    return torch.softmax(logits, dim=-1)


def accept_drafts(
    p: torch.Tensor, q: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None = None
) -> list[int]:
    """The tokens the rejection rule emits: the drafts kept, then one drawn token (the replacement
    of the first rejected draft, or the bonus after the last). p `(n + 1, V)`: the target's
    distributions, row j for the token after the j-th draft; q `(n, V)`: the drafter's, from which
    drafts[j] was drawn (one-hot for a deterministic draft)."""
    kept: list[int] = []
    for j, x in enumerate(drafts):
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[j, x] < p[j, x]:  # u < p(x) / q(x), without dividing by a q(x) of 0
            kept.append(x)
            continue
        residual = (p[j] - q[j]).clamp_min(0)
        # p <= q everywhere only when p = q, which keeps x for sure: the guard is for rounding.
        weights = residual if residual.sum() > 0 else p[j]
        return [*kept, int(torch.multinomial(weights, 1, generator=generator))]
    return [*kept, int(torch.multinomial(p[len(drafts)], 1, generator=generator))]


def _accept(logits: torch.Tensor, draft: Draft, pick: Picker) -> list[int]:
    """The tokens emitted after a verification whose logits `(n + 1, V)` scored draft's n tokens."""
    if isinstance(pick, Sampler):
        p = probabilities(pick, logits)
        q = draft.probs
        if q is None:  # a deterministic draft: q is one-hot on it
            q = torch.zeros_like(p[:-1])
            q[torch.arange(len(draft.tokens)), draft.tokens] = 1.0
        return accept_drafts(p, q.to(p.device), draft.tokens, pick.generator)
    choices = pick(logits).tolist()  # what the target itself picks after each prefix
    kept = 0
    while kept < len(draft.tokens) and draft.tokens[kept] == choices[kept]:
        kept += 1
    return [*draft.tokens[:kept], choices[kept]]


def _require_full_caches(cache: list, who: str) -> None:
    if not all(isinstance(c, KVCache) and not isinstance(c, RollingKVCache) for c in cache):
        raise UserError(
            f"speculative decoding rolls back a full KV cache after rejected drafts; {who} keeps "
            "another kind (window attention's ring, a convolution's or an evolved cell's)"
        )


def _forward(model: CausalDecoder, tokens: list[int], device: torch.device, **kw) -> torch.Tensor:
    """The model's logits `(T, V)` for tokens (a list), in eval and inference mode."""
    with _eval_mode(model):
        return model(torch.tensor([tokens], dtype=torch.long, device=device), **kw)[0]


class ModelDrafter:
    """A smaller model with the same tokenizer drafts, decoding k tokens with its own KV cache. The
    cache is kept between steps: a new draft reuses the keys of the context it already holds and
    cuts off the rest. Past its block_size it restarts from the context's last tokens. `fused`:
    its steps run as the fused C++ step (`attnlab.accel.fused`, where it covers the model), the
    context it reads anew in one call (`FusedStep.extend`)."""

    def __init__(self, model: CausalDecoder, *, fused: bool = False) -> None:
        for_decoding(model)
        self.model = model
        self.block = model.config.block_size
        self.device = next(model.parameters()).device
        self.cache: ModelCache = model.new_cache(1, self.block)
        _require_full_caches(self.cache, "the draft model")
        self.fused_step = None
        if fused:
            from attnlab.accel.fused import gpt_step  # a build only where asked for

            self.fused_step = gpt_step(model, self.cache)
        self.start = 0  # the context position of the cache's first slot
        self.cached: list[int] = []  # the tokens whose keys the cache holds

    def _resume(self, context: list[int], k: int) -> list[int]:
        """Cut the cache back to the longest prefix it shares with the context (sliding the window
        on if the context and k drafts would not fit); the context tokens still to be read."""
        start = self.start
        if len(context) + k - 1 <= self.block:  # it all fits (a new, shorter context too)
            start = 0
        elif start >= len(context) or len(context) - start + k - 1 > self.block:
            start = len(context) - max(1, (self.block - k) // 2)  # half a window kept: few restarts
        if start != self.start:
            self.start, self.cached = start, []
        window = context[self.start :]
        shared = 0
        limit = min(len(self.cached), len(window) - 1)  # the last context token is read again for its logits
        while shared < limit and self.cached[shared] == window[shared]:
            shared += 1
        self.cache.truncate(shared)
        self.cached = window[:shared]
        return window[shared:]

    def _next(self, token: int) -> torch.Tensor:
        """The logits `(1, V)` after one more token, its key and value written to the cache."""
        if self.fused_step is None:
            return _forward(self.model, [token], self.device, cache=self.cache, last_only=True)
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        return self.fused_step(ids, self.cache, self.cache.length)[0]

    def draft(self, context: list[int], k: int, pick: Picker) -> Draft:
        k = min(k, self.block - 1)
        fresh = self._resume(context, k)  # the tokens kept since the last draft, a prompt, or a new window
        if self.fused_step is not None:
            logits = self.fused_step.extend(torch.tensor(fresh), self.cache.length, last_only=True)  # (1, V)
        else:
            logits = _forward(self.model, fresh, self.device, cache=self.cache, last_only=True)
        tokens, probs = [], []
        for i in range(k):
            if isinstance(pick, Sampler):
                q = probabilities(pick, logits)  # (1, V)
                probs.append(q[0])
                tokens.append(int(torch.multinomial(q[0], 1, generator=pick.generator)))
            else:
                tokens.append(int(pick(logits)[0]))
            if i < k - 1:
                logits = self._next(tokens[-1])
        self.cached = [*self.cached, *fresh, *tokens[:-1]]
        return Draft(tokens, torch.stack(probs) if probs else None)


@dataclass(frozen=True)
class PromptLookup:
    """Drafts by copying: for n from `max_ngram` down to `min_ngram`, the latest earlier place
    where the context's last n tokens occur, and the k tokens that followed it there. Nothing is
    drafted where no n-gram recurs. Example: context [5, 6, 7, 8, 5, 6], max_ngram 2, k 2 -> [7, 8]."""

    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise UserError(
                f"prompt lookup needs 1 <= min n-gram <= max n-gram, got {self.min_ngram} and {self.max_ngram}"
            )

    def draft(self, context: list[int], k: int, pick: Picker) -> Draft:
        ids = torch.tensor(context, dtype=torch.long)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            windows = ids[:-1].unfold(0, n, 1)  # (L - n, n): every n-gram followed by a token
            hits = (windows == ids[-n:]).all(dim=1).nonzero()
            if len(hits):
                start = int(hits[-1]) + n
                return Draft(context[start : start + k])
        return Draft([])


def check_draft_model(
    target: nn.Module, draft: nn.Module, target_tokenizer: Tokenizer | None, draft_tokenizer: Tokenizer | None
) -> str | None:
    """Refuse (`UserError`) a draft model that cannot draft for the target: another vocabulary or
    tokenizer. Returns a warning when it is not smaller than the target (it would cost as much per
    token as the target saves), else None."""
    sizes = target.config.vocab_size, draft.config.vocab_size
    if sizes[0] != sizes[1]:
        raise UserError(
            f"the draft model's vocabulary has {sizes[1]} tokens and the target's {sizes[0]}: "
            "a drafter needs the target's vocabulary (a model trained with the same tokenizer)"
        )
    if (target_tokenizer is None) != (draft_tokenizer is None) or (
        target_tokenizer is not None and _tokenizer_identity(target_tokenizer) != _tokenizer_identity(draft_tokenizer)
    ):
        raise UserError(
            "the draft model has another tokenizer than the target: a drafter needs the same one "
            "(a model trained on the same tokenizer), or use --prompt-lookup"
        )
    counts = [sum(p.numel() for p in m.parameters()) for m in (target, draft)]
    if counts[1] >= counts[0]:
        return (
            f"the draft model ({counts[1]:,} parameters) is not smaller than the target ({counts[0]:,}): "
            "speculation then costs more than it saves"
        )
    return None


def _tokenizer_identity(tokenizer: Tokenizer) -> tuple:
    """What two tokenizers must share to give the same ids: their kind, end token and each id's
    piece (a Hugging Face tokenizer's vocabulary; otherwise each id decoded alone)."""
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None and hasattr(inner, "get_vocab"):
        pieces: object = inner.get_vocab()
    else:
        pieces = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    return type(tokenizer).__name__, tokenizer.eos_id, pieces


@dataclass
class _Target:
    """The model that checks the drafts, with its KV cache (batch 1) and, where it runs on the
    fused C++ step, that step (bound to the cache)."""

    model: CausalDecoder
    cache: ModelCache
    device: torch.device
    fused_step: "FusedStep | None" = None

    @property
    def filled(self) -> int:
        return self.cache.length

    def read(self, tokens: list[int], last_only: bool = False) -> torch.Tensor:
        """Logits `(T, V)` after each of tokens (`(1, V)` after the last with `last_only`), their
        keys and values appended to the cache: one forward, or one fused call."""
        if self.fused_step is None:
            return _forward(self.model, tokens, self.device, cache=self.cache, last_only=last_only)
        return self.fused_step.extend(torch.tensor(tokens), self.filled, last_only=last_only)

    def truncate(self, length: int) -> None:
        """Forget the cache's slots from `length` on (the rejected drafts' keys)."""
        if self.fused_step is not None:
            self.fused_step.truncate(length)
        else:
            self.cache.truncate(length)


def _target(model: CausalDecoder, device: torch.device, plan: DecodePlan) -> _Target:
    """The target with a fresh cache of block_size slots, on the fused step where the plan asks
    for it and it covers the model (`attnlab.accel.fused.gpt_step` warns where it does not)."""
    cache = model.new_cache(1, model.config.block_size)
    _require_full_caches(cache, "the model")
    step = None
    if plan.fused:
        from attnlab.accel.fused import gpt_step  # a build only where asked for

        step = gpt_step(model, cache, plan.weights)
    return _Target(model, cache, device, step)


def speculative_generate(
    model: CausalDecoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    pick: Picker,
    speculation: Speculation,
    *,
    eos_id: int | None = None,
    fused: bool = False,
    weights: str = "fp32",
    plan: DecodePlan | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the next token ids `(1,)` after the prompt idx `(1, T)` (long), as `generate_tokens`
    does with the same picker, drafting with `speculation.drafter` (`speculation.stats` counts what
    it kept). Greedy output is the target's token for token; sampled output has the target's law.
    `fused`: the target reads its prompt and checks the drafts on the fused C++ step
    (`attnlab.accel.fused`; a model it does not cover runs on PyTorch's, with a warning), its
    products' weights stored as `weights` says (`WEIGHT_FORMATS`, as for `generate_tokens`). `plan`:
    those two decided already (`attnlab.accel.plan.plan_decoding`), in their place."""
    if idx.dim() != 2 or idx.size(0) != 1 or idx.size(1) == 0:
        raise ValueError(f"speculative decoding takes one prompt (1, T) with T >= 1, got shape {tuple(idx.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    for_decoding(model)
    if plan is None:
        plan = plan_decoding(model, fused=fused, weights=weights)
    if plan.compile:
        raise ValueError("speculation checks drafts with PyTorch's step or the fused one: leave compile alone")
    target = _target(model, idx.device, plan)
    tokens = idx[0].tolist()
    window = tokens[-model.config.block_size :]  # what generate_tokens prefills
    if len(window) > 1:  # all but the pending token, whose logits the first verification computes
        target.read(window[:-1], last_only=True)
    emitted = 0
    while emitted < max_new_tokens:
        new = _step(target, tokens, pick, speculation)
        for token in new[: max_new_tokens - emitted]:
            yield torch.tensor([token], device=idx.device)
            emitted += 1
            if token == eos_id:
                return
        tokens.extend(new)


def _step(target: _Target, tokens: list[int], pick: Picker, speculation: Speculation) -> list[int]:
    """One speculative step: draft, score the drafts in one target forward, keep what the rule
    keeps. Within the block, [pending, drafts] go through the cache, which is then cut back to the
    tokens kept (the new pending token excluded); past it, each position's own window."""
    block = target.model.config.block_size
    filled = target.filled
    sliding = filled >= block
    room = speculation.k if sliding else min(speculation.k, block - filled - 1)  # the drafts' keys must fit
    draft = speculation.drafter.draft(tokens, room, pick) if room > 0 else Draft([])
    draft = Draft(draft.tokens[:room], None if draft.probs is None else draft.probs[:room])
    if sliding:
        logits = _score_windows(target, tokens, draft.tokens)
    else:
        logits = target.read([tokens[-1], *draft.tokens])  # (n + 1, V)
    new = _accept(logits, draft, pick)
    if not sliding:
        target.truncate(filled + len(new))
    speculation.stats.add(len(draft.tokens), len(new))
    return new


def _score_windows(target: _Target, tokens: list[int], drafts: list[int]) -> torch.Tensor:
    """Logits `(n + 1, V)` past block_size: row j from the block_size tokens before the j-th
    draft's successor (what `generate_tokens` recomputes for each token as its window slides), the
    n + 1 windows read as one batch. A fused step with bf16 or int8 weights reads each window
    itself, as `generate_tokens` does there (into the cache's row, which nothing reads any more)."""
    model = target.model
    block, end = model.config.block_size, len(tokens)
    grown = [*tokens, *drafts]
    windows = [grown[end + j - block : end + j] for j in range(len(drafts) + 1)]
    step = target.fused_step
    if step is not None and step.format != "fp32":
        return torch.cat([step.prefill([window], 0) for window in windows])
    with _eval_mode(model):
        return model(torch.tensor(windows, dtype=torch.long, device=target.device), last_only=True)[:, -1]
