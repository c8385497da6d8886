"""Attention patterns (window, BigBird, Linformer) inside the families: cached decoding equals the
blocked full-sequence computation, patterns that cover everything equal full attention, and the
combinations that cannot work are refused by the config with a reason."""

import pytest
import torch

from attnlab.accel import uncovered_parts
from attnlab.models import GPT, Bert, BertConfig, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer

V = 40
CAUSAL_PATTERNS = {
    "window": {"attention": "window", "attention_window": 5},
    "bigbird": {"attention": "bigbird", "attention_block": 4, "global_blocks": 1, "random_blocks": 1},
}


def gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, block_size=32, n_layers=2, n_heads=2, d_model=16)
    return GPT(GPTConfig(**(fields | overrides))).eval()


@pytest.mark.parametrize("pattern", list(CAUSAL_PATTERNS))
@pytest.mark.parametrize("positions", ["learned", "rope", "alibi", "relative"])
def test_gpt_cached_decoding_equals_the_blocked_forward(pattern, positions):
    # Two different code paths: the blocked computation over the whole sequence, and one query at
    # a time against the cache with the pattern's key mask.
    model = gpt(positions=positions, **CAUSAL_PATTERNS[pattern])
    seq = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache(2)
        steps = [model(seq[:, :7], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(7, 30)]
        narrow_differs = not torch.allclose(full, gpt(positions=positions)(seq), atol=1e-3)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    assert narrow_differs  # the pattern did hide keys: the model is not full attention in disguise


@pytest.mark.parametrize(
    "covering",
    [
        {"attention": "window", "attention_window": 32},
        {"attention": "bigbird", "attention_block": 4, "global_blocks": 1, "random_blocks": 8},
    ],
)
@pytest.mark.parametrize("positions", ["learned", "alibi", "relative"])
def test_gpt_pattern_that_covers_every_key_equals_full_attention(covering, positions):
    full, patterned = gpt(positions=positions), gpt(positions=positions, **covering)
    patterned.load_state_dict(full.state_dict())
    seq = torch.randint(0, V, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(patterned(seq), full(seq), rtol=0, atol=1e-5)


def bert(**overrides) -> Bert:
    torch.manual_seed(0)
    fields = dict(vocab_size=V, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, head="none")
    return Bert(BertConfig(**(fields | overrides))).eval()


def test_bert_linformer_with_identity_projections_equals_full_attention():
    full, linformer = bert(), bert(attention="linformer", linformer_k=16)
    state = full.state_dict()
    for name in linformer.state_dict():
        if name.endswith((".E", ".F")):
            state[name] = torch.eye(16)
    linformer.load_state_dict(state)
    ids = torch.randint(1, V, (3, 16))
    with torch.no_grad():
        torch.testing.assert_close(linformer(ids), full(ids), rtol=0, atol=1e-5)
        assert not torch.allclose(bert(attention="linformer", linformer_k=4)(ids), full(ids), atol=1e-3)


@pytest.mark.parametrize("pattern", ["window", "bigbird"])
def test_bert_bidirectional_pattern_ignores_padding(pattern):
    model = bert(attention=pattern, attention_window=3, attention_block=4, random_blocks=1)
    ids = torch.randint(1, V, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :9], model(ids), rtol=0, atol=1e-5)


def test_seq2seq_window_decoder_cache_equals_teacher_forcing():
    torch.manual_seed(0)
    config = Seq2SeqConfig(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        attention="window",
        attention_window=3,
        positions="rope",
    )
    model = Seq2SeqTransformer(config).eval()
    src, tgt = torch.randint(3, V, (2, 9)), torch.randint(3, V, (2, 10))
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start(src, 16)
        steps = torch.stack([model.step(tgt[:, t], state) for t in range(10)], 1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: gpt(attention="linformer"), "causal model"),
        (lambda: bert(attention="linformer", positions="alibi"), "no positions"),
        (lambda: gpt(attention="window", attention_window=0), "attention_window must be >= 1"),
        (lambda: gpt(attention="bigbird", attention_block=-4), "attention_block must be >= 1"),
        (lambda: gpt(attention="sparse"), "attention must be one of"),
        (lambda: gpt(attention="windows"), "did you mean 'window'"),
        (lambda: gpt(positions="rotary"), "'rope'"),
        (lambda: gpt(positions="rope", d_model=18, n_heads=2), "even"),
    ],
)
def test_configs_that_cannot_work_are_refused_with_the_reason(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()


def test_linformer_bert_stops_at_max_len_and_kernels_step_aside():
    model = bert(attention="linformer", linformer_k=8)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(1, V, (1, 17)))
    assert "attention=linformer" in uncovered_parts(model)
