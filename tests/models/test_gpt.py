"""GPT on a tiny CPU config: shapes, loss, causality, weight tying, config validation, KV cache."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.models import GPT, GPTConfig

V = 50


def tiny_config(**overrides) -> GPTConfig:
    fields = dict(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=16)
    return GPTConfig(**(fields | overrides))


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_config(**overrides)).eval()


def random_ids(b: int, t: int, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(0, V, (b, t))


VARIANTS = [
    {},
    {"norm": "post"},
    {"positions": "sinusoidal"},
    {"positions": "none"},
    {"activation": "relu", "bias": False},
    {"tie_weights": False, "n_heads": 4},
]
VARIANT_IDS = ["default", "post-norm", "sinusoidal", "no-positions", "relu-no-bias", "untied-4-heads"]


@pytest.mark.parametrize("overrides", VARIANTS, ids=VARIANT_IDS)
def test_output_shapes(overrides):
    model = tiny_gpt(**overrides)
    idx = random_ids(3, 7)
    logits = model(idx)
    assert logits.shape == (3, 7, V)
    logits2, loss = model(idx, random_ids(3, 7, seed=2))
    assert logits2.shape == (3, 7, V) and loss.shape == ()
    assert torch.isfinite(loss)


def test_loss_equals_cross_entropy():
    model = tiny_gpt()
    idx, targets = random_ids(2, 9), random_ids(2, 9, seed=2)
    targets[0, :3] = -1  # ignored positions
    logits, loss = model(idx, targets)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    keep = targets != -1
    expected = -log_probs[keep].gather(-1, targets[keep].unsqueeze(-1)).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1))


@pytest.mark.parametrize("overrides", [{}, {"norm": "post"}], ids=["pre-norm", "post-norm"])
def test_loss_at_init_is_about_log_vocab(overrides):
    # Small initial weights give near-uniform predictions: loss ≈ ln V (≈ 3.91 for V = 50).
    model = tiny_gpt(**overrides)
    _, loss = model(random_ids(4, 16), random_ids(4, 16, seed=2))
    assert loss.item() == pytest.approx(math.log(V), abs=0.05)


@pytest.mark.parametrize("overrides", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("t", [0, 3, 8])
def test_causality_future_tokens_do_not_change_past_logits(overrides, t):
    model = tiny_gpt(**overrides)
    idx = random_ids(2, 10)
    changed = idx.clone()
    changed[:, t + 1 :] = (idx[:, t + 1 :] + 1 + torch.arange(10 - t - 1)) % V
    assert (changed[:, t + 1 :] != idx[:, t + 1 :]).all()
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
    assert (after[:, t + 1 :] - before[:, t + 1 :]).abs().max() > 1e-4  # the future does change


def test_causality_of_gradients():
    # Loss at position t must have no gradient with respect to the embeddings of later tokens.
    model = tiny_gpt(dropout=0.0)
    idx = random_ids(1, 8)
    emb = model.token_embedding(idx).detach().requires_grad_(True)
    pos = model.positions(torch.arange(8))
    x = emb + pos
    for block in model.blocks:
        x, _ = block(x, causal=True)
    model.lm_head(model.final_norm(x))[0, 4].sum().backward()
    assert torch.all(emb.grad[0, 5:] == 0)
    assert torch.all(emb.grad[0, :5].abs().sum(-1) > 0)


def test_weight_tying():
    model = tiny_gpt()
    assert model.lm_head.weight is model.token_embedding.weight
    untied = tiny_gpt(tie_weights=False)
    assert untied.lm_head.weight is not untied.token_embedding.weight
    assert untied.lm_head.weight.data_ptr() != untied.token_embedding.weight.data_ptr()
    with torch.no_grad():
        untied.token_embedding.weight.zero_()
    assert untied.lm_head.weight.abs().sum() > 0
    assert untied.num_parameters() - model.num_parameters() == V * model.config.d_model


def test_tied_weight_gets_gradient_from_both_uses():
    model = tiny_gpt()
    idx = random_ids(2, 6)
    _, loss = model(idx, random_ids(2, 6, seed=2))
    loss.backward()
    # Rows of tokens that never appear in idx get gradient only through the head.
    unused = sorted(set(range(V)) - set(idx.flatten().tolist()))
    assert model.token_embedding.weight.grad[unused].abs().sum() > 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 10, "n_heads": 3}, "d_model"),
        ({"d_model": 10, "n_heads": 3}, "n_heads"),
        ({"d_model": 0}, "d_model"),
        ({"n_heads": 0}, "n_heads"),
        ({"n_layers": 0}, "n_layers"),
        ({"block_size": 0}, "block_size"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"ffn_mult": 0}, "ffn_mult"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"dropout": float("nan")}, "dropout"),
        ({"positions": "rotary"}, "positions"),
        ({"activation": "mish"}, "activation"),
        ({"norm": "middle"}, "norm"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
    ],
)
def test_config_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        tiny_config(**overrides)


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ({"positions": "rotary"}, ["learned", "none", "sinusoidal"]),
        ({"activation": "mish"}, ["gelu", "gelu_tanh", "relu", "swish", "swiglu"]),
        ({"norm": "middle"}, ["pre", "post", "sandwich"]),
    ],
)
def test_config_validation_lists_allowed_values(overrides, allowed):
    with pytest.raises(ValueError) as info:
        tiny_config(**overrides)
    for value in allowed:
        assert repr(value) in str(info.value)


def test_config_is_frozen_and_has_derived_values():
    config = tiny_config(d_model=16, n_heads=4, ffn_mult=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 32
    assert config.head_dim == 4 and config.d_ff == 48


def test_config_rejects_unknown_keys():
    with pytest.raises(TypeError):
        GPTConfig(vocab_size=V, n_embedding=16)


def test_model_needs_vocab_size():
    with pytest.raises(ValueError, match="vocab_size"):
        GPT(GPTConfig(d_model=16, n_heads=2, n_layers=1, block_size=8))


@pytest.mark.parametrize("overrides", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("chunks", [[5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 16, [4, 3, 1, 8]])
def test_kv_cached_forward_equals_full_forward(overrides, chunks):
    model = tiny_gpt(**overrides)
    idx = random_ids(2, 16)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(batch_size=2)
        outs, start = [], 0
        for n in chunks:
            outs.append(model(idx[:, start : start + n], cache=cache))
            start += n
            assert cache.length == start  # the model's one count
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=0, atol=1e-5)


def test_kv_cached_decode_with_last_only():
    model = tiny_gpt()
    idx = random_ids(2, 10)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, max_len=10)
        last = [model(idx[:, :4], cache=cache, last_only=True)]
        last += [model(idx[:, t : t + 1], cache=cache, last_only=True) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(last, dim=1), full[:, 3:], rtol=0, atol=1e-5)


def test_new_cache_shapes():
    model = tiny_gpt(n_heads=4)
    caches = model.new_cache(3)
    assert len(caches) == model.config.n_layers
    assert all(c.k.shape == (3, 4, 16, 4) for c in caches) and caches.length == 0
    assert model.new_cache(3, max_len=5)[0].max_len == 5
    assert model.new_cache(3, max_len=100)[0].max_len == 16  # never past block_size


@pytest.mark.parametrize("overrides", [{}, {"norm": "post"}], ids=["pre-norm", "post-norm"])
def test_last_only_matches_last_row(overrides):
    model = tiny_gpt(**overrides)
    idx = random_ids(3, 9)
    last = model(idx, last_only=True)
    assert last.shape == (3, 1, V)
    torch.testing.assert_close(last, model(idx)[:, -1:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"norm": "post"}, {"positions": "none"}], ids=["pre", "post", "nopos"])
def test_attention_weights(overrides):
    model = tiny_gpt(**overrides)
    idx = random_ids(2, 7)
    weights = model.attention_weights(idx)
    assert len(weights) == model.config.n_layers
    for w in weights:
        assert w.shape == (2, model.config.n_heads, 7, 7)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, model.config.n_heads, 7))
        assert torch.all(w.triu(diagonal=1) == 0.0)
        assert torch.all(w[..., torch.ones(7, 7).tril().bool()] > 0.0)
    assert torch.all(weights[0][..., 0, 0] == 1.0)  # the first token can only see itself


def test_post_norm_gpt_has_no_final_norm_and_trains():
    model = tiny_gpt(norm="post")
    assert isinstance(model.final_norm, torch.nn.Identity)
    assert all(not block.pre_norm for block in model.blocks)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    idx = random_ids(4, 8)
    targets = torch.roll(idx, -1, dims=1)
    _, first = model(idx, targets)
    for _ in range(20):
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < first.item() - 0.5


def test_dropout_is_active_only_in_training():
    model = tiny_gpt(dropout=0.3)
    idx = random_ids(2, 8)
    assert torch.equal(model(idx), model(idx))
    model.train()
    torch.manual_seed(3)
    assert not torch.allclose(model(idx), model(idx))


@pytest.mark.parametrize(("positions", "bag_of_tokens"), [("none", True), ("learned", False), ("sinusoidal", False)])
def test_without_positions_one_layer_sees_a_bag_of_tokens(positions, bag_of_tokens):
    # One causal layer without positions: the last position attends to the set of earlier tokens, so
    # shuffling them leaves its logits unchanged. Positions are what let the model see the order.
    model = tiny_gpt(n_layers=1, positions=positions)
    with torch.no_grad():  # weights large enough for attention far from uniform (a uniform average is a bag too)
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    idx = torch.tensor([[3, 14, 15, 9, 26, 5, 35]])
    shuffled = idx[:, [4, 0, 5, 2, 1, 3, 6]]
    with torch.no_grad():
        last, last_shuffled = model(idx, last_only=True), model(shuffled, last_only=True)
    if bag_of_tokens:
        torch.testing.assert_close(last_shuffled, last, rtol=0, atol=1e-5)
    else:
        assert (last_shuffled - last).abs().max() > 1e-3


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_gpt_runs_in_bfloat16(positions):
    model = tiny_gpt(positions=positions).to(torch.bfloat16)
    idx = random_ids(2, 6)
    with torch.no_grad():
        logits = model(idx)
        weights = model.attention_weights(idx)
    assert logits.dtype == torch.bfloat16 and logits.shape == (2, 6, V)
    assert weights[0].dtype == torch.bfloat16


def test_sequence_longer_than_block_size_raises():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="block_size"):
        model(random_ids(1, 17))
    model(random_ids(1, 16))  # exactly block_size is fine


def test_cached_sequence_longer_than_block_size_raises():
    model = tiny_gpt()
    cache = model.new_cache(1)
    with torch.no_grad():
        model(random_ids(1, 16), cache=cache)
        with pytest.raises(ValueError, match="block_size"):
            model(random_ids(1, 1), cache=cache)
