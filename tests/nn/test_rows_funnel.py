"""The Funnel Transformer row (Dai et al. 2020): pooling, pool-query-only attention, up-sampling,
BERT's funnel against the formula written out, and the refusals."""

import pytest
import torch

from attnlab.config import ConfigError, build
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.gpt import GPTConfig
from attnlab.nn.funnel import pool_mask, pool_pairs, upsample


def tiny(**kw) -> BertConfig:
    base = dict(vocab_size=40, d_model=16, n_heads=2, n_layers=4, d_ff=32, max_len=16, dropout=0.0)
    return BertConfig(**{**base, **kw})


def test_pool_pairs_is_the_mean_over_pairs_with_an_odd_tail():
    x = torch.arange(5 * 3, dtype=torch.float).view(1, 5, 3)
    real = torch.ones(1, 5, dtype=torch.bool)
    pooled, pooled_real = pool_pairs(x, real)
    expected = torch.stack([(x[0, 0] + x[0, 1]) / 2, (x[0, 2] + x[0, 3]) / 2, x[0, 4]])
    torch.testing.assert_close(pooled[0], expected)
    assert pooled_real.tolist() == [[True, True, True]]


def test_a_pair_with_one_pad_token_is_its_real_token_and_stays_real():
    x = torch.randn(2, 4, 3)
    real = torch.tensor([[True, True, True, False], [True, False, False, False]])
    pooled, pooled_real = pool_pairs(x, real)
    torch.testing.assert_close(pooled[0, 1], x[0, 2])  # (real, pad): the real token alone
    torch.testing.assert_close(pooled[1, 0], x[1, 0])
    torch.testing.assert_close(pooled[1, 1], torch.zeros(3))  # (pad, pad): padding, a zero vector
    assert pooled_real.tolist() == [[True, True], [True, False]]
    assert pool_mask(real, 1).tolist() == pooled_real.tolist()
    assert pool_mask(real, 2).tolist() == [[True], [True]]


def test_upsample_repeats_each_position_and_cuts_to_length():
    x = torch.tensor([[[1.0], [2.0]]])
    assert upsample(x, 2, 7).flatten().tolist() == [1, 1, 1, 1, 2, 2, 2]


def attend(q, k, v, mask):
    """softmax(q kᵀ / √D) v per head, written out: q `(B, H, Tq, D)`, k and v `(B, H, Tk, D)`."""
    scores = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    return scores.softmax(-1) @ v


def pooled_block_by_hand(block, x, real, n_heads):
    """A post-norm block of the next stage, pool-query-only (Dai et al. 2020, Eq. 2): the queries
    and the residual are the pair means; keys and values are the unpooled sequence."""
    b, t, c = x.shape
    pairs = x.view(b, t // 2, 2, c)
    weight = real.view(b, t // 2, 2, 1).float()
    pooled = (pairs * weight).sum(2) / weight.sum(2).clamp(min=1)
    w, bias = block.attn.in_proj.weight, block.attn.in_proj.bias
    q, k, v = (pooled @ w[:c].T + bias[:c]), (x @ w[c : 2 * c].T + bias[c : 2 * c]), (x @ w[2 * c :].T + bias[2 * c :])

    def heads(z):
        return z.view(b, -1, n_heads, c // n_heads).transpose(1, 2)

    a = attend(heads(q), heads(k), heads(v), real).transpose(1, 2).reshape(b, -1, c)
    h = block.norm1(pooled + block.attn.out_proj(a))
    return block.norm2(h + block.ffn(h))


def test_bert_funnel_stage_equals_the_formula_written_out():
    torch.manual_seed(0)
    model = Bert(tiny(head="none", funnel_stages=(1, 1, 2), funnel_decoder_layers=0)).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 0, 0, 0]])  # row 1: the pair (7, pad)
    real = ids != 0
    mask = real[:, None, None, :]
    x = model.embeddings(ids)
    x, _ = model.blocks[0](x, mask=mask)
    first = x
    x2 = pooled_block_by_hand(model.blocks[1], x, real, 2)  # stage 2: 3 positions
    real2 = torch.tensor([[True, True, True], [True, True, False]])
    x2 = torch.cat([x2, torch.zeros_like(x2[:, :1])], 1)  # an odd length: one pad position
    real2 = torch.cat([real2, torch.zeros_like(real2[:, :1])], 1)
    x3 = pooled_block_by_hand(model.blocks[2], x2, real2, 2)  # stage 3: 2 positions
    x3, _ = model.blocks[3](x3, mask=torch.tensor([[True, True], [True, False]])[:, None, None, :])
    with torch.no_grad():
        out = model.encode(ids)
    assert out.shape == (2, 6, 16)
    # No decoder blocks: the output is the up-sampled short sequence plus the first stage's output.
    expected = x3.repeat_interleave(4, dim=1)[:, :6] + first
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    ("head", "n_labels", "shape"), [("mlm", 0, (2, 7, 40)), ("token", 3, (2, 7, 3)), ("sequence", 3, (2, 3))]
)
def test_bert_funnel_heads_have_full_length_outputs_where_they_need_them(head, n_labels, shape):
    model = Bert(tiny(head=head, n_labels=n_labels, funnel_stages=(2, 1, 1), pooling="mean")).eval()
    ids = torch.randint(1, 40, (2, 7))
    ids[1, 4:] = 0
    assert model(ids).shape == shape
    weights = model.attention_weights(ids)
    assert [tuple(w.shape[-2:]) for w in weights[:4]] == [(7, 7), (7, 7), (4, 7), (2, 4)]  # queries pooled, keys not
    assert len(weights) == (4 if head == "sequence" else 6)  # the decoder's two full-length blocks
    assert (model.funnel_decoder is None) == (head == "sequence")


def test_bert_funnel_padding_does_not_change_the_real_rows():
    """A padded row's outputs equal the same sentence alone: the pooled masks hide every pad."""
    torch.manual_seed(1)
    model = Bert(tiny(head="sequence", n_labels=2, funnel_stages=(2, 2), pooling="mean")).eval()
    alone = torch.tensor([[3, 4, 5, 6, 7]])
    padded = torch.tensor([[3, 4, 5, 6, 7, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(model(padded), model(alone))
    token = Bert(tiny(head="token", n_labels=2, funnel_stages=(2, 2))).eval()
    with torch.no_grad():
        torch.testing.assert_close(token(padded)[:, :5], token(alone))


def test_bert_funnel_pre_norm_trains_one_step():
    model = Bert(tiny(head="mlm", norm="pre", funnel_stages=(2, 2)))
    ids = torch.randint(1, 40, (2, 8))
    loss = model(ids).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.blocks[2].parameters())


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(funnel_stages=(4,)), "two or more stages"),
        (dict(funnel_stages=(2, 1)), "summing to n_layers"),
        (dict(funnel_stages=(2, 0, 2)), ">= 1 block"),
        (dict(funnel_stages=(2, 2), positions="rope"), "positions at the input"),
        (dict(funnel_stages=(2, 2), attention="window"), "attention 'full'"),
        (dict(funnel_stages=(2, 2), block_sharing="universal"), "universal"),
        (dict(funnel_stages=(2, 2), funnel_decoder_layers=-1), "funnel_decoder_layers"),
    ],
)
def test_bert_funnel_config_is_validated(kw, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kw)


def test_gpt_refuses_the_funnel_in_one_line_saying_why():
    with pytest.raises(ConfigError, match="causal model would see its future") as e:
        build(GPTConfig, {"n_layers": 4, "funnel_stages": [2, 2]}, "model")
    assert "\n" not in str(e.value)


def test_funnel_stages_read_from_toml_as_a_list():
    config = build(BertConfig, {"n_layers": 4, "funnel_stages": [2, 2]}, "model")
    assert config.funnel_stages == (2, 2)
    assert config.funnel_pool_layers() == frozenset({2})
