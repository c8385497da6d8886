"""OpenAI's presence and frequency penalties and logit bias (`Penalties`), and the model's own
token scores (`token_scores`), per row of a continuously batched decode: each checked against the
definition written out here, one logit at a time."""

import pytest
import torch

from attnlab.decode.batching import Batcher
from attnlab.decode.sampling import Penalties, penalize, token_scores
from attnlab.decode.scheduler import Sequence


def by_definition(logits: list[float], generated: list[int], p: Penalties) -> list[float]:
    """OpenAI's guide: mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence (+ bias[j])."""
    bias = dict(p.bias)
    out = []
    for j, mu in enumerate(logits):
        c = generated.count(j)
        out.append(mu - c * p.frequency - float(c > 0) * p.presence + bias.get(j, 0.0))
    return out


def test_penalize_is_the_definition_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(4, 11)
    penalties = [Penalties(0.5, 0.3), None, Penalties(-1.0, 1.5, ((2, 10.0), (7, -100.0))), Penalties()]
    generated = [[1, 1, 3], [1, 2], [2, 2, 2, 5, 0], [4]]
    out = penalize(logits, penalties, generated)
    for i, p in enumerate(penalties):
        want = logits[i].tolist() if p is None else by_definition(logits[i].tolist(), generated[i], p)
        assert out[i].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6), i  # float32
    assert penalize(logits, [None, Penalties()], [[1], [2]]) is logits  # nothing to do: no copy


def test_token_scores_are_the_log_softmax_with_its_top_tokens():
    torch.manual_seed(1)
    logits = torch.randn(3, 9)
    scores = token_scores(logits, [4, 0, 8], [2, None, 0])
    assert scores[1] is None
    for i, n in ((0, 2), (2, 0)):
        row = torch.log_softmax(logits[i].double(), -1)
        assert scores[i].logprob == pytest.approx(float(row[scores[i].token]), abs=1e-6)
        order = sorted(range(9), key=lambda j: -float(row[j]))[:n]
        assert [t for t, _ in scores[i].top] == order
        assert [v for _, v in scores[i].top] == pytest.approx([float(row[j]) for j in order], abs=1e-6)


def reference_greedy(model, prompt: list[int], new: int, p: Penalties | None) -> tuple[list[int], list[float]]:
    """Greedy decoding by the definition: a full forward over the last block_size tokens, the
    penalties applied to the logits, the argmax taken; each token's log-probability under the
    model's own (unpenalised) logits."""
    ids, tokens, logprobs = list(prompt), [], []
    for _ in range(new):
        with torch.no_grad():
            logits = model(torch.tensor([ids[-model.config.block_size :]]))[0, -1]
        adjusted = logits.tolist() if p is None else by_definition(logits.tolist(), tokens, p)
        token = max(range(len(adjusted)), key=adjusted.__getitem__)
        logprobs.append(float(torch.log_softmax(logits.double(), -1)[token]))
        tokens.append(token)
        ids.append(token)
    return tokens, logprobs


def test_each_row_of_a_batch_keeps_its_own_penalties(gpt):
    """Rows with different penalties (and one with none) decoded together, past block_size (the
    windows slide), joining at different steps: each gives the tokens of the definition alone."""
    settings = [
        ([1, 2, 3], Penalties(presence=0.8)),
        ([4, 5], Penalties(frequency=1.2)),
        ([6], None),
        ([7, 8, 9, 10], Penalties(0.4, 0.6, ((3, 5.0), (11, -100.0)))),
    ]
    new = 24  # past the block of 16
    batcher = Batcher(gpt, max_batch=4)
    seqs = [Sequence(list(prompt), new, penalties=p, logprobs=0) for prompt, p in settings]
    batcher.join_all(seqs[:2])
    batcher.step()
    batcher.join_all(seqs[2:])
    while len(batcher):
        batcher.step()
    for seq, (prompt, p) in zip(seqs, settings, strict=True):
        tokens, logprobs = reference_greedy(gpt, prompt, new, p)
        assert seq.tokens == tokens
        assert [s.logprob for s in seq.scores] == pytest.approx(logprobs, abs=1e-5)
    # The penalties and the bias did act: each changes the tokens.
    assert seqs[2].tokens != reference_greedy(gpt, [6], new, Penalties(presence=0.8))[0]
    unbiased, _ = reference_greedy(gpt, [7, 8, 9, 10], new, Penalties(0.4, 0.6))
    assert unbiased != seqs[3].tokens and 11 not in seqs[3].tokens and 3 in seqs[3].tokens
