"""Greedy and beam-search decoding for encoder–decoder models (`attnlab.models.protocols`).

Both are batched over sentences; the encoder runs once per sentence and the decoder steps on its
cache. Each sentence gets its own length limit, `ceil(max_len_ratio · source length) + max_len_extra`
target tokens, after which it must end. With beam size 1, beam search returns exactly the greedy
output (tested).

Beam search follows fairseq: at each step every live hypothesis is extended by every token; of the
2K best candidates, those ending in <eos> among the first K are finished, the best K others live
on. A sentence is done when it has K finished hypotheses (or reaches its limit); the answer is the
finished hypothesis with the best score / length^length_penalty (Wu et al. 2016 use a similar
length normalisation). Neither <pad> nor <bos> is ever produced.
"""

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attnlab.accel import for_decoding
from attnlab.models.protocols import Seq2SeqModel


def length_limits(src: torch.Tensor, pad_id: int, max_len_ratio: float, max_len_extra: int, cap: int) -> torch.Tensor:
    """Per-sentence target length limits `(B,)` from the source lengths of src `(B, S)`."""
    src_len = (src != pad_id).sum(dim=1).float()
    return torch.clamp(torch.ceil(src_len * max_len_ratio).long() + max_len_extra, max=cap)


@torch.inference_mode()
def greedy_translate(
    model: Seq2SeqModel,
    src: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    fused: bool = False,
) -> list[list[int]]:
    """The most likely token at each step until <eos>; returns each sentence's ids without bos/eos.
    `fused`: as in `beam_search`."""
    return beam_search(
        model,
        src,
        beam_size=1,
        bos_id=bos_id,
        eos_id=eos_id,
        max_len_ratio=max_len_ratio,
        max_len_extra=max_len_extra,
        fused=fused,
    )


@torch.inference_mode()
def beam_search(
    model: Seq2SeqModel,
    src: torch.Tensor,
    *,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float = 1.0,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    fused: bool = False,
) -> list[list[int]]:
    """Best-scoring translation of each source sentence in src `(B, S)`, as ids without bos/eos.

    `fused` runs each decoder step as one C++ call (`attnlab.accel.fused`: encoder–decoder
    Transformers in fp32 on the CPU; built on first use), with the same results; other models
    decode eagerly, with a warning, their projections through the decoding routes
    (`attnlab.accel.for_decoding`, applied to the model in place)."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    for_decoding(model)
    was_training = model.training
    model.eval()
    try:
        return _beam_search(model, src, beam_size, bos_id, eos_id, length_penalty, max_len_ratio, max_len_extra, fused)
    finally:
        model.train(was_training)


def _beam_search(
    model: Seq2SeqModel,
    src: torch.Tensor,
    k: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float,
    max_len_ratio: float,
    max_len_extra: int,
    fused: bool,
) -> list[list[int]]:
    b, device = src.size(0), src.device
    cap = getattr(model.config, "max_len", 256) - 1  # positions available after <bos>
    limits = length_limits(src, model.pad_id, max_len_ratio, max_len_extra, cap).tolist()
    max_steps = max(limits)
    state, step = _start_decoder(model, src, max_steps + 1, fused)
    state.select(torch.arange(b, device=device).repeat_interleave(k))  # (B*K) rows: beams of each sentence

    # Rows of the tensors below belong to the sentences still searching, `alive` (original indices):
    # a finished sentence leaves the batch, so later steps run on the others alone.
    alive = list(range(b))
    scores, tokens, history = _first_beams(b, k, bos_id, device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]

    for t in range(max_steps):
        at_limit = [i for i, limit in enumerate(limits) if limit <= t + 1]
        logp = _next_log_probs(step(tokens), k, [model.pad_id, bos_id], eos_id, at_limit)
        cand = _Candidates.best(scores, logp, k, eos_id)
        for i, ids, score in cand.endings(history, k):
            finished[alive[i]].append((score / (len(ids) + 1) ** length_penalty, ids))
        # Done: K finished hypotheses, or the length limit (nothing but <eos> could follow).
        searching = [
            i
            for i, (sentence, limit) in enumerate(zip(alive, limits, strict=True))
            if len(finished[sentence]) < k and limit > t + 1
        ]
        if not searching:
            break
        same_source = len(searching) == len(alive)
        keep = torch.tensor(searching, device=device)
        if not same_source:
            cand, history = cand.rows(keep), history[keep]
            alive, limits = [alive[i] for i in searching], [limits[i] for i in searching]

        scores, next_beam, next_token = cand.survivors(k)
        history = torch.cat(
            [history.gather(1, next_beam[:, :, None].expand(-1, -1, history.size(2))), next_token[:, :, None]], dim=2
        )
        tokens = next_token.reshape(-1)
        # Rows of the state before this step: each kept sentence's first beam row, plus the beam.
        # Beams only ever continue beams of their own sentence: while no sentence leaves, the
        # source side need not move.
        state.select((keep[:, None] * k + next_beam).reshape(-1), same_source=same_source)

    return _best_hypotheses(finished, alive, history, scores)


def _start_decoder(model: Seq2SeqModel, src: torch.Tensor, max_len: int, fused: bool) -> tuple[object, Callable]:
    """The decoder's state for src `(B, S)` and its one-step function `tokens (N,) -> logits (N, V)`:
    the fused C++ decoder where asked and available, else the model's own `start` and `step`."""
    if fused:
        from attnlab.accel.fused import decoder_state

        fast = decoder_state(model, src, max_len)
        if fast is not None:
            return fast, fast.step
    state = model.start(src, max_len)
    return state, functools.partial(model.step, state=state)


def _first_beams(b: int, k: int, bos_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """K beams per sentence before the first step: scores `(B, K)`, next tokens `(B*K,)` (all
    <bos>) and the ids so far `(B, K, 0)`."""
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: let only the first one expand
    tokens = torch.full((b * k,), bos_id, dtype=torch.long, device=device)
    history = torch.zeros((b, k, 0), dtype=torch.long, device=device)
    return scores, tokens, history


def _next_log_probs(logits: torch.Tensor, k: int, banned: list[int], eos_id: int, at_limit: list[int]) -> torch.Tensor:
    """Log-probabilities `(B, K, V)` of the next token from the step's logits `(B*K, V)`; the
    `banned` ids are never output, whatever the model says, and a sentence of `at_limit` (rows of
    the batch) is at its length limit, so it must end: only <eos> remains possible."""
    logits = logits.float()
    logits[:, banned] = float("-inf")
    logp = F.log_softmax(logits, dim=-1)
    v = logp.size(-1)
    logp = logp.view(-1, k, v)
    if at_limit:
        rows = torch.tensor(at_limit, device=logp.device)
        eos_only = torch.full((v,), float("-inf"), device=logp.device)
        eos_only[eos_id] = 0.0
        logp[rows] = logp[rows] + eos_only
    return logp


class _Candidates(NamedTuple):
    """The 2K best extensions of each sentence's beams, best first, each `(B, 2K)`: its score, the
    beam it extends, its token, and whether that token is <eos>."""

    scores: torch.Tensor
    beam: torch.Tensor
    token: torch.Tensor
    is_eos: torch.Tensor

    @classmethod
    def best(cls, scores: torch.Tensor, logp: torch.Tensor, k: int, eos_id: int) -> "_Candidates":
        """From beam scores `(B, K)` and next-token log-probabilities `(B, K, V)`."""
        b, v = logp.size(0), logp.size(-1)
        candidates = (scores[:, :, None] + logp).view(b, k * v)
        cand_scores, cand_index = candidates.topk(min(2 * k, k * v), dim=1)
        cand_token = cand_index % v
        return cls(cand_scores, cand_index // v, cand_token, cand_token == eos_id)

    def endings(self, history: torch.Tensor, k: int) -> list[tuple[int, list[int], float]]:
        """The <eos> candidates ranked within the first K, as (batch row, ids without <eos>, score);
        `history` `(B, K, T)` holds each beam's ids so far."""
        rank = torch.arange(self.scores.size(1), device=self.scores.device)[None, :]
        to_finish = self.is_eos & (rank < k) & (self.scores > float("-inf"))
        return [
            (i, history[i, self.beam[i, j]].tolist(), self.scores[i, j].item()) for i, j in to_finish.nonzero().tolist()
        ]

    def rows(self, keep: torch.Tensor) -> "_Candidates":
        """The candidates of the batch rows `keep` only."""
        return _Candidates(*(x[keep] for x in self))

    def survivors(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The K best candidates that do not end, as (scores, beam, token), each `(B, K)`; <eos>
        ones sort after all others (order kept), scored -inf where fewer than K others exist."""
        rank = torch.arange(self.scores.size(1), device=self.scores.device)[None, :]
        order = (rank + self.is_eos.long() * self.scores.size(1)).argsort(dim=1)[:, :k]
        next_scores = self.scores.gather(1, order).masked_fill(self.is_eos.gather(1, order), float("-inf"))
        return next_scores, self.beam.gather(1, order), self.token.gather(1, order)


def _best_hypotheses(
    finished: list[list[tuple[float, list[int]]]], alive: list[int], history: torch.Tensor, scores: torch.Tensor
) -> list[list[int]]:
    """Each sentence's best finished hypothesis; a sentence with none (only reachable if the limit
    loop ended early) keeps its best live one, row `alive.index(sentence)` of history and scores."""
    results = []
    live = {sentence: i for i, sentence in enumerate(alive)}
    for sentence, done in enumerate(finished):
        if done:
            results.append(max(done, key=lambda f: f[0])[1])
        else:
            i = live[sentence]
            results.append(history[i, int(scores[i].argmax())].tolist())
    return results


def sequence_log_prob(model: Seq2SeqModel, src: torch.Tensor, tgt: Sequence[int], bos_id: int, eos_id: int) -> float:
    """log P(tgt <eos> | src) under the distribution the decoders search (<pad> and <bos> masked
    out, as in `beam_search`), for one sentence src `(1, S)`; tests compare hypotheses with it."""
    tgt_in = torch.tensor([[bos_id, *tgt]], device=src.device)
    tgt_out = torch.tensor([[*tgt, eos_id]], device=src.device)
    with torch.inference_mode():
        logits = model(src, tgt_in).float()
        logits[..., [model.pad_id, bos_id]] = float("-inf")
        logp = F.log_softmax(logits, dim=-1)
    return float(logp.gather(-1, tgt_out[..., None]).sum())
