"""RNN baselines on tiny CPU configs: shapes, config, teacher forcing vs stepping, padding, causality,
the additive attention formula, the single-vector bottleneck, beam reordering, and a copy task."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from attnlab.models.rnn import (
    AttentionGRUSeq2Seq,
    AttentionGRUState,
    GRUSeq2Seq,
    GRUState,
    RNNConfig,
    build_rnn,
)

V = 17
BOS, EOS = 1, 2
KINDS = ["gru", "gru-attention"]


def tiny_config(kind: str, **overrides) -> RNNConfig:
    fields = dict(kind=kind, vocab_size=V, emb_dim=8, hidden_size=12, dropout=0.0)
    return RNNConfig(**(fields | overrides))


def tiny_model(kind: str, seed: int = 0, **overrides) -> GRUSeq2Seq | AttentionGRUSeq2Seq:
    torch.manual_seed(seed)
    return build_rnn(tiny_config(kind, **overrides)).eval()


def padded_sources(lengths: list[int], width: int | None = None, pad_id: int = 0, seed: int = 1) -> torch.Tensor:
    """Right-padded random sources `(B, width)` whose real tokens are never pad_id."""
    torch.manual_seed(seed)
    width = max(lengths) if width is None else width
    src = torch.full((len(lengths), width), pad_id)
    for b, n in enumerate(lengths):
        ids = torch.randint(1, V, (n,))
        src[b, :n] = torch.where(ids == pad_id, (ids + 1) % V, ids)
    return src


def random_targets(b: int, t: int, seed: int = 2) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(1, V, (b, t))


def step_loop(model, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    """Logits `(B, T, V)` from `start` and one `step` per decoder input token."""
    state = model.start(src, max_len=tgt_in.size(1))
    return torch.stack([model.step(tgt_in[:, t], state) for t in range(tgt_in.size(1))], dim=1)


# --- shapes, config, construction -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_output_shapes(kind):
    model = tiny_model(kind)
    src, tgt_in = padded_sources([5, 2, 3]), random_targets(3, 4)
    assert model(src, tgt_in).shape == (3, 4, V)
    assert model.cross_attention(src, tgt_in).shape == (3, 4, 5)
    state = model.start(src, max_len=4)
    assert model.step(tgt_in[:, 0], state).shape == (3, V)
    assert model.pad_id == 0 and model.config.kind == kind


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"kind": "lstm"}, "kind"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"emb_dim": 0}, "emb_dim"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"n_layers": 0}, "n_layers"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"pad_id": -1}, "pad_id"),
        ({"pad_id": V}, "pad_id"),
    ],
)
def test_config_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**({"kind": "gru"} | overrides))


def test_config_defaults_frozen_and_strict():
    config = RNNConfig()
    assert config.kind == "gru-attention" and config.vocab_size is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        RNNConfig(hiden_size=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="vocab_size"):
        build_rnn(config)


@pytest.mark.parametrize("kind, cls", [("gru", GRUSeq2Seq), ("gru-attention", AttentionGRUSeq2Seq)])
def test_build_rnn_picks_the_class_by_kind(kind, cls):
    model = tiny_model(kind)
    assert type(model) is cls
    assert isinstance(model.start(padded_sources([2]), 3), GRUState if kind == "gru" else AttentionGRUState)


@pytest.mark.parametrize("kind", KINDS)
def test_tie_embeddings(kind):
    assert tiny_model(kind).src_embedding.weight is not tiny_model(kind).tgt_embedding.weight
    model = tiny_model(kind, tie_embeddings=True)
    assert model.src_embedding.weight is model.tgt_embedding.weight
    untied = sum(p.numel() for p in tiny_model(kind).parameters())
    assert untied - sum(p.numel() for p in model.parameters()) == V * 8


@pytest.mark.parametrize("kind", KINDS)
def test_bad_sources_raise(kind):
    model = tiny_model(kind)
    with pytest.raises(ValueError, match="right-padded"):
        model.start(torch.tensor([[0, 3, 4]]), 3)
    with pytest.raises(ValueError, match="at least one token"):
        model.start(torch.tensor([[3, 4], [0, 0]]), 3)


# --- teacher forcing, padding, causality --------------------------------------------------------------


@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_forward_equals_start_and_step(kind, n_layers):
    model = tiny_model(kind, n_layers=n_layers)
    src, tgt_in = padded_sources([5, 2, 3]), random_targets(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in), step_loop(model, src, tgt_in), rtol=0, atol=1e-5)


@pytest.mark.parametrize("pad_id", [0, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_extra_padding_changes_nothing(kind, pad_id):
    model = tiny_model(kind, pad_id=pad_id)
    src = padded_sources([5, 2, 3], pad_id=pad_id)
    wide = padded_sources([5, 2, 3], width=9, pad_id=pad_id)
    assert torch.equal(wide[:, :5], src)
    tgt_in = random_targets(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(wide, tgt_in), model(src, tgt_in), rtol=0, atol=1e-5)
        alpha, alpha_wide = model.cross_attention(src, tgt_in), model.cross_attention(wide, tgt_in)
    torch.testing.assert_close(alpha_wide[..., :5], alpha, rtol=0, atol=1e-6)
    assert torch.all(alpha_wide[..., 5:] == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_sentence_does_not_depend_on_its_batch(kind):
    model = tiny_model(kind)
    src, tgt_in = padded_sources([3, 6, 2]), random_targets(3, 5)
    with torch.no_grad():
        batched = model(src, tgt_in)
        for b, n in enumerate([3, 6, 2]):
            alone = model(src[b : b + 1, :n], tgt_in[b : b + 1])
            torch.testing.assert_close(batched[b : b + 1], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("t", [0, 2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_no_future_leakage(kind, t):
    model = tiny_model(kind)
    src, tgt_in = padded_sources([4, 3]), random_targets(2, 6)
    changed = tgt_in.clone()
    changed[:, t + 1 :] = random_targets(2, 6 - t - 1, seed=7)
    assert not torch.equal(changed, tgt_in)
    with torch.no_grad():
        before, after = model(src, tgt_in), model(src, changed)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
    if t + 1 < 6:
        assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])


# --- attention --------------------------------------------------------------------------------------


def test_attention_rows_sum_to_one_and_ignore_padding():
    model = tiny_model("gru-attention")
    src, tgt_in = padded_sources([5, 2, 3]), random_targets(3, 4)
    with torch.no_grad():
        alpha = model.cross_attention(src, tgt_in)  # (B, T, S)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(3, 4))
    assert torch.all(alpha[1, :, 2:] == 0) and torch.all(alpha[2, :, 3:] == 0)
    assert torch.all(alpha[src.unsqueeze(1).expand(-1, 4, -1) != 0] > 0)
    # Not uniform: the alignment depends on the decoder state.
    assert not torch.allclose(alpha[0, 0], alpha[0, 1])


@pytest.mark.parametrize("n_layers", [1, 2])
def test_additive_attention_matches_the_formula(n_layers):
    """Bahdanau et al. 2015 written out per sentence from the module's own parameters, on an unpacked
    single-sentence encoder run: h_j, s_0 = tanh(W_s [h→_n; h←_1] + b) per layer, with the top layer's
    s_0 as the query, e_j = v_aᵀ tanh(W_a s_0 + U_a h_j), α = softmax(e), c = Σ α_j h_j,
    s_1 = GRU([emb(y_0); c], s_0), logits = W_o [s_1; c; emb(y_0)] + b_o."""
    model = tiny_model("gru-attention", n_layers=n_layers)
    lengths, H = [4, 2, 3], 12
    src, tgt_in = padded_sources(lengths), random_targets(3, 2)
    W_s, b_s = model.bridge.weight, model.bridge.bias
    W_a, U_a, v_a = model.attention.W_a.weight, model.attention.U_a.weight, model.attention.v_a.weight[0]
    with torch.no_grad():
        alpha = model.cross_attention(src, tgt_in)[:, 0]  # (B, S): the first step
        logits = model(src, tgt_in)[:, 0]  # (B, V)
        for b, n in enumerate(lengths):
            x = model.src_embedding.weight[src[b, :n]]  # (n, E)
            out, h_n = model.encoder(x.unsqueeze(0))  # (1, n, 2H), (2L, 1, H)
            h = out[0]  # (n, 2H): the top layer's annotations
            # The top layer's two ends are the forward state at the last token, the backward at the first.
            torch.testing.assert_close(torch.cat([h_n[-2, 0], h_n[-1, 0]]), torch.cat([h[n - 1, :H], h[0, H:]]))
            s0 = torch.stack(
                [torch.tanh(W_s @ torch.cat([h_n[2 * i, 0], h_n[2 * i + 1, 0]]) + b_s) for i in range(n_layers)]
            )  # (L, H)
            e = torch.stack([v_a @ torch.tanh(W_a @ s0[-1] + U_a @ h[j]) for j in range(n)])  # (n,)
            expected = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
            torch.testing.assert_close(alpha[b, :n], expected, rtol=1e-5, atol=1e-6)
            assert torch.all(alpha[b, n:] == 0)

            c = (expected.unsqueeze(1) * h).sum(0)  # (2H,)
            y = model.tgt_embedding.weight[tgt_in[b, 0]]  # (E,)
            s1 = model.decoder(torch.cat([y, c]).view(1, 1, -1), s0.unsqueeze(1))[0].view(-1)  # (H,)
            expected_logits = model.readout(torch.cat([s1, c, y]))
            torch.testing.assert_close(logits[b], expected_logits, rtol=1e-5, atol=1e-5)


# --- the single-vector bottleneck of Cho et al. 2014 ----------------------------------------------------


def test_gru_baseline_reads_the_source_only_through_its_final_state():
    model = tiny_model("gru")
    lengths = [4, 2, 6]
    src, tgt_in = padded_sources(lengths), random_targets(3, 3)
    with torch.no_grad():
        state = model.start(src, max_len=3)
        # The state holds the context and the decoder state, nothing per source token.
        assert [f.name for f in dataclasses.fields(state)] == ["hidden", "context"]
        assert state.hidden.shape == (1, 3, 12) and state.context.shape == (3, 12)
        # The context is the last state of an unpacked encoder run over the real tokens alone,
        # and the decoder starts from it (Cho et al. 2014: h_0 from c).
        for b, n in enumerate(lengths):
            last = model.encoder(model.src_embedding.weight[src[b, :n]].unsqueeze(0))[1][-1, 0]  # (H,)
            torch.testing.assert_close(state.context[b], last, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state.hidden[0], state.context)

        # Swapping in another source's summary gives exactly that source's predictions.
        other = padded_sources([3, 5, 1], seed=9)
        expected = step_loop(model, other, tgt_in)
        swapped = model.start(src, max_len=3)
        donor = model.start(other, max_len=3)
        swapped.hidden, swapped.context = donor.hidden, donor.context
        got = torch.stack([model.step(tgt_in[:, t], swapped) for t in range(3)], dim=1)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)

        # First step written out: h_1 = GRU([emb(y_0); c], c), logits = W_o [h_1; emb(y_0); c] + b_o.
        y = model.tgt_embedding.weight[tgt_in[:, 0]]  # (B, E)
        c = state.context
        h1 = model.decoder(torch.cat([y, c], -1).unsqueeze(1), c.unsqueeze(0))[0][:, 0]  # (B, H)
        expected_logits = model.readout(torch.cat([h1, y, c], -1))
        torch.testing.assert_close(model(src, tgt_in)[:, 0], expected_logits, rtol=1e-5, atol=1e-5)

        # No attention: the alignment picture is uniform over the real source tokens.
        alpha = model.cross_attention(src, tgt_in)
    for b, n in enumerate(lengths):
        assert torch.all(alpha[b, :, :n] == 1 / n) and torch.all(alpha[b, :, n:] == 0)


# --- beam reordering ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_select_reorders_and_repeats_rows(kind):
    model = tiny_model(kind, n_layers=2)
    src, tgt_in = padded_sources([5, 2, 3]), random_targets(3, 3)
    index = torch.tensor([2, 0, 0])
    with torch.no_grad():
        full, picked = model.start(src, 3), model.start(src, 3)
        model.step(tgt_in[:, 0], full)
        model.step(tgt_in[:, 0], picked)
        picked.select(index)
        for t in (1, 2):
            expected = model.step(tgt_in[:, t], full)[index]
            torch.testing.assert_close(model.step(tgt_in[index, t], picked), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_step_does_not_touch_tensors_of_earlier_states(kind):
    model = tiny_model(kind)
    src = padded_sources([3, 2])
    with torch.no_grad():
        state = model.start(src, 2)
        hidden = state.hidden
        before = hidden.clone()
        model.step(torch.tensor([BOS, BOS]), state)
    assert state.hidden is not hidden and torch.equal(hidden, before)


# --- training ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_is_active_only_in_training(kind):
    model = tiny_model(kind, dropout=0.5)
    src, tgt_in = padded_sources([4, 2]), random_targets(2, 3)
    with torch.no_grad():
        assert torch.equal(model(src, tgt_in), model(src, tgt_in))
        model.train()
        assert not torch.equal(model(src, tgt_in), model(src, tgt_in))


@pytest.mark.parametrize("kind", KINDS)
def test_every_parameter_gets_a_gradient(kind):
    model = tiny_model(kind, n_layers=2).train()
    src, tgt_in = padded_sources([4, 2]), random_targets(2, 3)
    model(src, tgt_in).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def greedy(model, src: torch.Tensor, max_len: int) -> torch.Tensor:
    """The ten-line greedy decoder of the tests: `(B, S)` -> `(B, max_len)`, no early stop."""
    state = model.start(src, max_len)
    tokens = torch.full((src.size(0),), BOS)
    out = []
    for _ in range(max_len):
        tokens = model.step(tokens, state).argmax(-1)
        out.append(tokens)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("kind", KINDS)
def test_learns_to_reverse_eight_sentences(kind):
    """Overfitting sanity: 8 pairs (source lengths 2–4), target = reversed source + <eos>."""
    torch.manual_seed(0)
    lengths = [4, 4, 3, 4, 2, 4, 3, 4]
    src = torch.zeros(8, 4, dtype=torch.long)
    tgt = torch.zeros(8, 6, dtype=torch.long)  # <bos> reversed <eos> <pad>...
    for b, n in enumerate(lengths):
        tokens = torch.randint(3, V, (n,))
        src[b, :n] = tokens
        tgt[b, : n + 2] = torch.cat([torch.tensor([BOS]), tokens.flip(0), torch.tensor([EOS])])
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]

    model = tiny_model(kind, emb_dim=16, hidden_size=32).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        loss = F.cross_entropy(model(src, tgt_in).reshape(-1, V), tgt_out.reshape(-1), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    model.eval()
    with torch.no_grad():
        out = greedy(model, src, max_len=5)
    keep = tgt_out != 0
    assert torch.equal(out[keep], tgt_out[keep]), (loss.item(), out, tgt_out)


def test_deep_output_is_maxout_then_projection():
    from attnlab.models.rnn import DeepOutput

    torch.manual_seed(0)
    layer = DeepOutput(6, 3, 5)
    x = torch.randn(4, 6)
    z = x @ layer.hidden.weight.T + layer.hidden.bias  # (4, 6): units 2k and 2k+1 form pool k
    pooled = torch.stack([torch.maximum(z[:, 2 * k], z[:, 2 * k + 1]) for k in range(3)], dim=1)
    expected = pooled @ layer.output.weight.T + layer.output.bias
    torch.testing.assert_close(layer(x), expected)
