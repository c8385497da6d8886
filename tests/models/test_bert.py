"""BERT on a tiny CPU config: bidirectional attention, padding invariance, heads, tying, config
validation, loading a pre-trained encoder under a new head."""

import dataclasses
import math

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.models.bert import Bert, BertConfig

V = 40
PAD = 0


def tiny_config(**overrides) -> BertConfig:
    fields = dict(vocab_size=V, max_len=24, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, pad_id=PAD)
    return BertConfig(**(fields | overrides))


def tiny_bert(seed: int = 0, **overrides) -> Bert:
    torch.manual_seed(seed)
    return Bert(tiny_config(**overrides)).eval()


def random_ids(b: int, t: int, seed: int = 1) -> torch.Tensor:
    """Ids in [1, V): never padding."""
    return torch.randint(1, V, (b, t), generator=torch.Generator().manual_seed(seed))


def test_later_token_changes_earlier_position():
    # Bidirectional: position 1 sees position 6. A causal GPT of the same size does not.
    ids = random_ids(1, 8)
    changed = ids.clone()
    changed[0, 6] = ids[0, 6] % (V - 1) + 1  # another non-pad id
    model = tiny_bert(head="none")
    with torch.no_grad():
        a, b = model.encode(ids), model.encode(changed)
    assert not torch.allclose(a[:, :6], b[:, :6], atol=1e-4)

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=V, block_size=24, n_layers=2, n_heads=2, d_model=16)).eval()
    with torch.no_grad():
        a, b = gpt(ids), gpt(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:], atol=1e-4)


@pytest.mark.parametrize("head", ["none", "mlm", "token"])
def test_padding_leaves_real_positions_unchanged(head):
    model = tiny_bert(head=head, n_labels=3 if head == "token" else 0)
    long, short = random_ids(1, 9, seed=2), random_ids(1, 5, seed=3)
    segments = torch.tensor([[0] * 4 + [1] * 5])
    with torch.no_grad():
        alone_long = model(long, segments)
        alone_short = model(short)
        # Trailing padding on its own, and a batch where the shorter sequence is padded.
        padded = model(torch.cat([short, torch.full((1, 6), PAD)], dim=1))
        batch = torch.cat([long, torch.cat([short, torch.full((1, 4), PAD)], dim=1)])
        both = model(batch, torch.cat([segments, torch.zeros(1, 9, dtype=torch.long)]))
    torch.testing.assert_close(padded[:, :5], alone_short, atol=1e-5, rtol=0)
    torch.testing.assert_close(both[:1], alone_long, atol=1e-5, rtol=0)
    torch.testing.assert_close(both[1:, :5], alone_short, atol=1e-5, rtol=0)
    assert torch.isfinite(both).all()


def test_padding_leaves_pooled_and_sequence_logits_unchanged():
    model = tiny_bert(head="sequence", n_labels=2)
    ids = random_ids(1, 6)
    padded = torch.cat([ids, torch.full((1, 5), PAD)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model.pooled(padded), model.pooled(ids), atol=1e-5, rtol=0)
        torch.testing.assert_close(model(padded), model(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_pooler_reads_first_position_or_mean_of_real_positions(pooling):
    model = tiny_bert(head="none", pooling=pooling)
    ids = torch.cat([random_ids(2, 6), torch.full((2, 3), PAD)], dim=1)
    ids[1, 4:6] = PAD  # the second row has 4 real tokens
    with torch.no_grad():
        hidden = model.encode(ids)
        if pooling == "cls":
            h = hidden[:, 0]
        else:  # the average written out, row by row, over the positions that are not padding
            h = torch.stack([hidden[0, :6].mean(0), hidden[1, :4].mean(0)])
        expected = torch.tanh(h @ model.pooler.weight.T + model.pooler.bias)
        torch.testing.assert_close(model.pooled(ids), expected, atol=1e-6, rtol=0)
        # padding never changes the pooled state
        torch.testing.assert_close(model.pooled(ids[1:, :4]), expected[1:], atol=1e-5, rtol=0)


def test_unknown_pooling_is_rejected():
    with pytest.raises(ValueError, match="pooling must be"):
        BertConfig(pooling="max")


def test_padding_is_never_attended_to():
    model = tiny_bert(head="none")
    ids = torch.cat([random_ids(2, 5), torch.full((2, 3), PAD)], dim=1)
    weights = model.attention_weights(ids)
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (2, 2, 8, 8)
        assert torch.all(w[..., 5:] == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 8))


def test_with_drop_full_mask_an_unpadded_batch_attends_without_a_mask_and_computes_the_same(monkeypatch):
    """No padding, nothing to hide: where the model was told it may (`drop_full_mask`, set by
    `attnlab.accel.prepare_for_training` on the CPU) the blocks get no mask (a cheaper attention
    path), and the states are those of the same blocks given the all-True mask; a padded batch
    keeps its mask. The reference keeps every mask."""
    from attnlab.nn.attention import MultiHeadAttention

    model = tiny_bert(head="none")
    assert not model.drop_full_mask
    model.drop_full_mask = True
    ids = random_ids(2, 9)
    masks = []
    forward = MultiHeadAttention.forward

    def spy(self, x, *args, **kwargs):
        masks.append(kwargs.get("mask"))
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(MultiHeadAttention, "forward", spy)
    with torch.no_grad():
        unmasked = model.encode(ids)
        padded = ids.clone()
        padded[1, 7:] = PAD
        model.encode(padded)
    assert masks[:2] == [None, None] and all(m is not None for m in masks[2:])
    monkeypatch.setattr(MultiHeadAttention, "forward", forward)
    all_true = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    with torch.no_grad():
        x = model.embeddings(ids)
        for block in model.blocks:
            x, _ = block(x, mask=all_true)
    torch.testing.assert_close(unmasked, x, rtol=0, atol=1e-6)


def test_head_shapes():
    ids = random_ids(3, 7)
    with torch.no_grad():
        assert tiny_bert(head="mlm")(ids).shape == (3, 7, V)
        assert tiny_bert(head="sequence", n_labels=5)(ids).shape == (3, 5)
        assert tiny_bert(head="token", n_labels=4)(ids).shape == (3, 7, 4)
        model = tiny_bert(head="none")
        hidden = model(ids)
        assert hidden.shape == (3, 7, 16)
        torch.testing.assert_close(hidden, model.encode(ids))
        assert model.pooled(ids).shape == (3, 16)
        assert model.pooled(ids).abs().max() < 1.0  # tanh
    assert model.head is None and not any(name.startswith("head.") for name in model.state_dict())


@pytest.mark.parametrize("head, n_labels, width", [("mlm", 0, V), ("token", 3, 3)])
def test_chosen_positions_give_those_rows_of_the_full_output(head, n_labels, width):
    model = tiny_bert(head=head, n_labels=n_labels)
    ids = random_ids(3, 7)
    chosen = torch.rand(3, 7, generator=torch.Generator().manual_seed(2)) < 0.4
    with torch.no_grad():
        some = model(ids, chosen=chosen)
        assert some.shape == (int(chosen.sum()), width)
        torch.testing.assert_close(some, model(ids)[chosen])


def test_chosen_positions_need_a_per_position_head():
    ids = random_ids(2, 5)
    with pytest.raises(ValueError, match="per-position head"):
        tiny_bert(head="sequence", n_labels=2)(ids, chosen=torch.ones(2, 5, dtype=torch.bool))


def test_segments_matter():
    model = tiny_bert(head="none")
    ids = random_ids(1, 6)
    with torch.no_grad():
        a = model.encode(ids)
        b = model.encode(ids, torch.tensor([[0, 0, 0, 1, 1, 1]]))
    torch.testing.assert_close(a, model.encode(ids, torch.zeros_like(ids)))
    assert not torch.allclose(a, b)


def test_mlm_decoder_is_tied_to_token_embedding():
    model = tiny_bert(head="mlm")
    assert model.head.decoder.weight is model.embeddings.token.weight
    assert model.head.decoder.bias.shape == (V,)
    n_unique = len({id(p) for p in model.parameters()})
    assert n_unique == len(list(model.parameters()))  # parameters() lists the shared matrix once


def test_initialisation():
    model = tiny_bert(head="mlm")
    emb = model.embeddings.token.weight
    assert abs(emb.std().item() - 0.02) < 0.005
    assert torch.all(model.blocks[0].attn.in_proj.bias == 0)
    assert torch.all(model.blocks[0].norm1.weight == 1) and torch.all(model.embeddings.norm.bias == 0)
    assert torch.all(model.head.decoder.bias == 0)


def test_pre_norm_closes_the_stack_with_a_layer_norm():
    post, pre = tiny_bert(head="none"), tiny_bert(head="none", norm="pre")
    assert post.final_norm is None and all(not b.pre_norm for b in post.blocks)
    assert all(b.pre_norm for b in pre.blocks)
    ids = random_ids(2, 9)
    with torch.no_grad():
        hidden = pre.encode(ids)
        x = pre.embeddings(ids)
        for block in pre.blocks:
            x = block(x)[0]  # no padding in ids: no mask needed
        # Written out: LayerNorm with weight 1 and bias 0 over the channels.
        expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-12)
    torch.testing.assert_close(hidden, expected, atol=1e-5, rtol=1e-4)


def test_pre_norm_stays_bidirectional_and_padding_invariant():
    model = tiny_bert(head="none", norm="pre")
    ids = random_ids(1, 8)
    changed = ids.clone()
    changed[0, 6] = ids[0, 6] % (V - 1) + 1
    padded = torch.cat([ids, torch.full((1, 5), PAD)], dim=1)
    with torch.no_grad():
        a, b, c = model.encode(ids), model.encode(changed), model.encode(padded)
    assert not torch.allclose(a[:, :6], b[:, :6], atol=1e-4)
    torch.testing.assert_close(c[:, :8], a, atol=1e-5, rtol=1e-4)


def test_sinusoidal_position_init_is_the_table_at_the_bert_spread():
    model = tiny_bert(position_init="sinusoidal")
    weight = model.embeddings.position.weight
    assert weight.requires_grad  # a starting point: the positions are still learned
    t, d = weight.shape
    # §3.5 written out: PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same angle).
    table = torch.tensor(
        [
            [(math.sin if c % 2 == 0 else math.cos)(pos / 10000 ** ((c - c % 2) / d)) for c in range(d)]
            for pos in range(t)
        ]
    )
    scale = 0.02 / table.std()
    torch.testing.assert_close(weight.detach(), table * scale, atol=1e-6, rtol=1e-5)
    # The point of it: how alike two positions start depends on their offset only.
    gram = weight.detach() @ weight.detach().T
    torch.testing.assert_close(
        torch.diagonal(gram, offset=3)[:-1], torch.diagonal(gram, offset=3)[1:].clone(), atol=1e-6, rtol=1e-3
    )
    # The default stays BERT's random start.
    assert not torch.allclose(tiny_bert().embeddings.position.weight, weight)


def test_longer_than_max_len():
    with pytest.raises(ValueError, match="max_len"):
        tiny_bert()(random_ids(1, 25))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kind": "gpt"}, "kind"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"n_layers": 0}, "n_layers"),
        ({"d_model": 18, "n_heads": 4}, "divisible"),
        ({"dropout": 1.0}, "dropout"),
        ({"activation": "mish"}, "activation"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"pad_id": V}, "pad_id"),
        ({"head": "lm"}, "head"),
        ({"head": "sequence"}, "n_labels"),
        ({"head": "token", "n_labels": 0}, "n_labels"),
        ({"head": "mlm", "n_labels": 2}, "n_labels"),
        ({"head": "none", "n_labels": 2}, "n_labels"),
        ({"norm": "sandwich"}, "norm"),
        ({"position_init": "zeros"}, "position_init"),
    ],
)
def test_config_validation(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def test_config_is_frozen():
    config = tiny_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 32  # type: ignore[misc]


def test_load_encoder_under_a_new_head():
    pretrained = tiny_bert(seed=0, head="mlm")
    model = tiny_bert(seed=1, head="sequence", n_labels=3)
    fresh_head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("head.")}
    missing = model.load_encoder(pretrained.state_dict())
    assert missing == []
    source = pretrained.state_dict()
    for name, tensor in model.state_dict().items():
        if name.startswith("head."):
            torch.testing.assert_close(tensor, fresh_head[name], atol=0, rtol=0)
        else:
            torch.testing.assert_close(tensor, source[name], atol=0, rtol=0)
    ids = random_ids(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(model.encode(ids), pretrained.encode(ids))


def test_load_encoder_reports_missing_and_keeps_tying():
    source = tiny_bert(seed=0, head="none").state_dict()
    del source["pooler.weight"], source["pooler.bias"]
    model = tiny_bert(seed=1, head="mlm")
    pooler = model.pooler.weight.clone()
    assert model.load_encoder(source) == ["pooler.weight", "pooler.bias"]
    torch.testing.assert_close(model.pooler.weight, pooler, atol=0, rtol=0)
    torch.testing.assert_close(model.embeddings.token.weight, source["embeddings.token.weight"], atol=0, rtol=0)
    assert model.head.decoder.weight is model.embeddings.token.weight


def test_load_encoder_refuses_other_shapes_and_depths():
    model = tiny_bert(head="sequence", n_labels=2)
    with pytest.raises(ValueError, match=r"embeddings\.token\.weight"):
        model.load_encoder(tiny_bert(vocab_size=V + 1).state_dict())
    with pytest.raises(ValueError, match=r"blocks\.2\."):
        model.load_encoder(tiny_bert(n_layers=3).state_dict())
