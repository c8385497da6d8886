"""Greedy and beam search for encoder–decoders, against known answers and brute force."""

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from attnlab.decode.seq2seq import beam_search, greedy_translate, sequence_log_prob
from attnlab.models.rnn import RNNConfig, build_rnn
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

PAD, BOS, EOS = 0, 1, 2


@dataclass
class PrefixState:
    prefixes: list[tuple[int, ...]]

    def select(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        self.prefixes = [self.prefixes[i] for i in index.tolist()]


class TableModel(nn.Module):
    """A 'decoder' whose next-token distribution is a fixed table keyed by the prefix so far."""

    pad_id = PAD

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int) -> None:
        super().__init__()
        self.table, self.vocab = table, vocab
        self.config = type("C", (), {"max_len": 64})()

    def start(self, src: torch.Tensor, max_len: int) -> PrefixState:
        return PrefixState([() for _ in range(src.size(0))])

    def step(self, tokens: torch.Tensor, state: PrefixState) -> torch.Tensor:
        logits = torch.full((len(state.prefixes), self.vocab), -1e9)
        for row, (prefix, token) in enumerate(zip(state.prefixes, tokens.tolist(), strict=True)):
            prefix = prefix + ((token,) if token != BOS else ())
            state.prefixes[row] = prefix
            for t, p in self.table.get(prefix, {EOS: 1.0}).items():
                logits[row, t] = math.log(p)
        return logits


# Greedy takes 3 (0.6) and then 5 (0.3), then <eos>: 0.18; the best sequence is 4 -> <eos> (0.4 * 1.0).
TABLE = {
    (): {3: 0.6, 4: 0.4},
    (3,): {5: 0.3, 6: 0.25, 7: 0.25, EOS: 0.2},
    (4,): {EOS: 1.0},
    (3, 5): {EOS: 1.0},
    (3, 6): {EOS: 1.0},
    (3, 7): {EOS: 1.0},
}


def test_beam_finds_the_best_sequence_that_greedy_misses():
    model = TableModel(TABLE, vocab=8)
    src = torch.tensor([[3, 3, 3]])
    assert greedy_translate(model, src, bos_id=BOS, eos_id=EOS) == [[3, 5]]  # 0.6 * 0.3 = 0.18
    assert beam_search(model, src, beam_size=2, bos_id=BOS, eos_id=EOS, length_penalty=0.0) == [[4]]  # 0.4


def test_batched_beam_handles_each_sentence_independently():
    model = TableModel(TABLE, vocab=8)
    src = torch.tensor([[3, 3, 3], [3, 3, 0], [3, 0, 0]])
    assert beam_search(model, src, beam_size=2, bos_id=BOS, eos_id=EOS, length_penalty=0.0) == [[4], [4], [4]]


def random_transformer(seed: int, vocab: int = 9) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    config = Seq2SeqConfig(
        vocab_size=vocab, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=16, dropout=0.0
    )
    model = Seq2SeqTransformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.7)
    return model


def random_rnn(seed: int, kind: str, vocab: int = 9) -> nn.Module:
    torch.manual_seed(seed)
    model = build_rnn(RNNConfig(kind=kind, vocab_size=vocab, emb_dim=8, hidden_size=12, dropout=0.0)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.8)
    return model


MODELS = [
    ("transformer", lambda s: random_transformer(s)),
    ("gru", lambda s: random_rnn(s, "gru")),
    ("gru-attention", lambda s: random_rnn(s, "gru-attention")),
]


@pytest.mark.parametrize("name, make", MODELS)
def test_beam_of_one_is_exactly_greedy(name, make):
    for seed in range(3):
        model = make(seed)
        src = torch.randint(3, 9, (5, 6), generator=torch.Generator().manual_seed(seed))
        src[1, 4:] = PAD
        src[3, 2:] = PAD
        greedy = greedy_translate(model, src, bos_id=BOS, eos_id=EOS)
        assert beam_search(model, src, beam_size=1, bos_id=BOS, eos_id=EOS) == greedy
        # and greedy is the argmax path: compare with a plain loop over the teacher-forced model
        for i in range(5):
            row = src[i : i + 1, : int((src[i] != PAD).sum())]
            prefix = [BOS]
            while len(prefix) <= len(greedy[i]):
                logits = model(row, torch.tensor([prefix]))[0, -1]
                logits[[PAD, BOS]] = float("-inf")  # decoders never emit these
                prefix.append(int(logits.argmax()))
                if prefix[-1] == EOS:
                    break
            expected = [t for t in prefix[1:] if t != EOS]
            assert greedy[i] == expected[: len(greedy[i])]


@pytest.mark.parametrize("name, make", MODELS)
def test_wide_beam_matches_exhaustive_search(name, make):
    """With a beam as wide as every prefix, beam search is exhaustive: compare with brute force."""
    model = make(7)
    vocab, max_tokens = 9, 3
    src = torch.tensor([[3, 4, 5]])
    best = beam_search(
        model,
        src,
        beam_size=vocab**max_tokens,
        bos_id=BOS,
        eos_id=EOS,
        length_penalty=0.0,
        max_len_ratio=0.0,
        max_len_extra=max_tokens + 1,
    )
    words = [t for t in range(vocab) if t not in (PAD, BOS, EOS)]
    candidates = [list(c) for n in range(max_tokens + 1) for c in itertools.product(words, repeat=n)]
    scored = {tuple(c): sequence_log_prob(model, src, c, BOS, EOS) for c in candidates}
    top = max(scored, key=scored.get)
    assert best[0] == list(top) or scored[tuple(best[0])] == pytest.approx(scored[top], abs=1e-5)


def test_beam_is_at_least_as_likely_as_greedy():
    model = random_transformer(3)
    src = torch.randint(3, 9, (6, 5), generator=torch.Generator().manual_seed(0))
    greedy = greedy_translate(model, src, bos_id=BOS, eos_id=EOS)
    beam = beam_search(model, src, beam_size=4, bos_id=BOS, eos_id=EOS, length_penalty=0.0)
    for i in range(6):
        s = src[i : i + 1]
        assert sequence_log_prob(model, s, beam[i], BOS, EOS) >= sequence_log_prob(model, s, greedy[i], BOS, EOS) - 1e-5


def test_length_limit_is_respected():
    model = random_transformer(4)
    src = torch.randint(3, 9, (4, 5))
    out = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_ratio=1.0, max_len_extra=2)
    assert all(len(o) <= 5 + 2 - 1 for o in out)  # the limit counts <eos>


def test_beam_leaves_the_model_mode_alone():
    model = random_transformer(5).train()
    beam_search(model, torch.randint(3, 9, (1, 4)), beam_size=2, bos_id=BOS, eos_id=EOS)
    assert model.training


def test_bad_beam_size():
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(random_transformer(0), torch.randint(3, 9, (1, 4)), beam_size=0, bos_id=BOS, eos_id=EOS)


@pytest.mark.parametrize("name, make", MODELS)
def test_sentences_leave_the_batch_and_batched_beam_equals_one_at_a_time(name, make):
    """Sources of different lengths get different length limits, so sentences finish at different
    steps and leave the batch; the others' translations are those each would get alone."""
    model = make(0)
    src = torch.randint(3, 9, (5, 7), generator=torch.Generator().manual_seed(4))
    src[1, 2:] = PAD
    src[3, 4:] = PAD
    rows = []
    start = model.start

    def start_and_count_rows(*args, **kwargs):
        state = start(*args, **kwargs)
        select = state.select

        def counted(index, **kw):
            rows.append(index.numel())
            select(index, **kw)

        state.select = counted
        return state

    model.start = start_and_count_rows
    batched = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_extra=2)
    del model.start
    assert rows[0] == 5 * 3 and min(rows) < rows[0]  # some sentence left before the last step
    for i in range(5):
        alone = src[i : i + 1, : int((src[i] != PAD).sum())]
        assert batched[i] == beam_search(model, alone, beam_size=3, bos_id=BOS, eos_id=EOS, max_len_extra=2)[0]
