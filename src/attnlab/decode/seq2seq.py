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
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.accel import for_decoding


def length_limits(src: torch.Tensor, pad_id: int, max_len_ratio: float, max_len_extra: int, cap: int) -> torch.Tensor:
    """Per-sentence target length limits `(B,)` from the source lengths of src `(B, S)`."""
    src_len = (src != pad_id).sum(dim=1).float()
    return torch.clamp(torch.ceil(src_len * max_len_ratio).long() + max_len_extra, max=cap)


@torch.inference_mode()
def greedy_translate(
    model: nn.Module,
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
    model: nn.Module,
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
    model: nn.Module,
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
    fast = None
    if fused:
        from attnlab.accel.fused import decoder_state

        fast = decoder_state(model, src, max_steps + 1)
    if fast is not None:
        state, step = fast, fast.step
    else:
        state = model.start(src, max_steps + 1)
        step = functools.partial(model.step, state=state)
    state.select(torch.arange(b, device=device).repeat_interleave(k))  # (B*K) rows: beams of each sentence

    # Rows of the tensors below belong to the sentences still searching, `alive` (original indices):
    # a finished sentence leaves the batch, so later steps run on the others alone.
    alive = list(range(b))
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: let only the first one expand
    tokens = torch.full((b * k,), bos_id, dtype=torch.long, device=device)
    history = torch.zeros((b, k, 0), dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]

    for t in range(max_steps):
        logits = step(tokens).float()  # (B*K, V)
        logits[:, [model.pad_id, bos_id]] = float("-inf")  # never outputs, whatever the model says
        logp = F.log_softmax(logits, dim=-1)
        v = logp.size(-1)
        logp = logp.view(len(alive), k, v)
        # At its length limit a sentence must end: only <eos> remains possible.
        at_limit = [i for i, limit in enumerate(limits) if limit <= t + 1]
        if at_limit:
            rows = torch.tensor(at_limit, device=device)
            eos_only = torch.full((v,), float("-inf"), device=device)
            eos_only[eos_id] = 0.0
            logp[rows] = logp[rows] + eos_only

        candidates = (scores[:, :, None] + logp).view(len(alive), k * v)
        cand_scores, cand_index = candidates.topk(min(2 * k, k * v), dim=1)  # (B, 2K), best first
        cand_beam, cand_token = cand_index // v, cand_index % v
        is_eos = cand_token == eos_id

        # Finish the <eos> candidates ranked within the first K.
        rank = torch.arange(cand_scores.size(1), device=device)[None, :]
        to_finish = is_eos & (rank < k) & (cand_scores > float("-inf"))
        for i, j in to_finish.nonzero().tolist():
            ids = history[i, cand_beam[i, j]].tolist()
            finished[alive[i]].append((cand_scores[i, j].item() / (len(ids) + 1) ** length_penalty, ids))
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
            cand_scores, cand_beam, cand_token, is_eos = (x[keep] for x in (cand_scores, cand_beam, cand_token, is_eos))
            history = history[keep]
            alive, limits = [alive[i] for i in searching], [limits[i] for i in searching]

        # The K best candidates that do not end: sort <eos> ones after all others, keep order.
        order = (rank + is_eos.long() * cand_scores.size(1)).argsort(dim=1)[:, :k]
        next_scores = cand_scores.gather(1, order)
        next_beam = cand_beam.gather(1, order)
        next_token = cand_token.gather(1, order)
        next_scores = next_scores.masked_fill(is_eos.gather(1, order), float("-inf"))

        history = torch.cat(
            [history.gather(1, next_beam[:, :, None].expand(-1, -1, history.size(2))), next_token[:, :, None]], dim=2
        )
        scores = next_scores
        tokens = next_token.reshape(-1)
        # Rows of the state before this step: each kept sentence's first beam row, plus the beam.
        first_row = keep[:, None] * k
        # Beams only ever continue beams of their own sentence: while no sentence leaves, the
        # source side need not move.
        state.select((first_row + next_beam).reshape(-1), same_source=same_source)

    results = []
    live = {sentence: i for i, sentence in enumerate(alive)}
    for sentence in range(b):
        if finished[sentence]:
            results.append(max(finished[sentence], key=lambda f: f[0])[1])
        else:  # only reachable if the limit loop ended early; keep the best live hypothesis
            i = live[sentence]
            results.append(history[i, int(scores[i].argmax())].tolist())
    return results


def sequence_log_prob(model: nn.Module, src: torch.Tensor, tgt: Sequence[int], bos_id: int, eos_id: int) -> float:
    """log P(tgt <eos> | src) under the distribution the decoders search (<pad> and <bos> masked
    out, as in `beam_search`), for one sentence src `(1, S)`; tests compare hypotheses with it."""
    tgt_in = torch.tensor([[bos_id, *tgt]], device=src.device)
    tgt_out = torch.tensor([[*tgt, eos_id]], device=src.device)
    with torch.inference_mode():
        logits = model(src, tgt_in).float()
        logits[..., [model.pad_id, bos_id]] = float("-inf")
        logp = F.log_softmax(logits, dim=-1)
    return float(logp.gather(-1, tgt_out[..., None]).sum())
