"""The Funnel Transformer in the encoder–decoder's encoder (Dai et al. 2020, as Narang et al. 2021
apply it): the pooled memory and mask, cross-attention on it against the formula written out,
incremental decoding against the full forward, training, and the refusals."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.decode.seq2seq import greedy_translate
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

V, PAD, BOS, EOS = 23, 0, 1, 2


def tiny(seed: int = 0, **overrides) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        n_encoder_layers=3,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        funnel_stages=(1, 1, 1),
    )
    model = Seq2SeqTransformer(Seq2SeqConfig(**(fields | overrides))).eval()
    with torch.no_grad():  # larger weights than the init, so that every input visibly matters
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.4)
    return model


def source() -> torch.Tensor:
    """Two sentences of 7 and 3 tokens: the second has 4 pads, so a pooled pair is (real, pad)."""
    return torch.tensor([[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, PAD, PAD, PAD, PAD]])


def test_the_memory_is_pooled_twice_and_its_mask_with_it():
    model = tiny().double()
    memory, mask = model.encode(source())
    assert memory.shape == (2, 2, 16)  # 7 -> 4 -> 2 positions
    # Row 1: (10, 11), (12, pad), (pad, pad), (pad, pad) -> (10 11, 12), (pad, pad)
    assert mask.tolist() == [[[[True, True]]], [[[True, False]]]]
    # The padded sentence's real pooled position equals the sentence encoded alone (3 -> 2 -> 1):
    # the pads are never a key, and a pair's mean is over its real tokens.
    alone, alone_mask = model.encode(source()[1:, :3])
    assert alone.shape == (1, 1, 16) and alone_mask.all()
    torch.testing.assert_close(memory[1, :1], alone[0], atol=1e-10, rtol=0)


def test_without_stages_the_memory_keeps_the_source_length():
    memory, mask = tiny(funnel_stages=None).encode(source())
    assert memory.shape == (2, 7, 16) and mask.shape == (2, 1, 1, 7)


def attend(q, k, v, mask):
    """softmax(q kᵀ / √D) v per head, written out: q `(B, H, T, D)`, k and v `(B, H, S, D)`,
    mask bool `(B, S)`; returns the output and the weights."""
    scores = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
    weights = scores.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
    return weights @ v, weights


def test_the_second_stage_pools_its_queries_only():
    """Pool-query-only (Dai et al. 2020, Eq. 2), written out for a post-norm block: the queries
    and the residual are the pair means over real tokens, the keys and values the unpooled sequence."""
    model = tiny(n_encoder_layers=2, funnel_stages=(1, 1)).double()
    src = source()[:, :6]  # row 1: (10, 11), (12, pad), (pad, pad)
    real = src != PAD
    x = model.encoder[0](model._embed(src, model.src_embedding), mask=real[:, None, None, :])[0]
    block, c, h = model.encoder[1], 16, 2
    weight = real.view(2, 3, 2, 1).double()
    pooled = (x.view(2, 3, 2, c) * weight).sum(2) / weight.sum(2).clamp(min=1)  # (B, 3, C)
    w, b = block.attn.in_proj.weight, block.attn.in_proj.bias
    q, k, v = pooled @ w[:c].T + b[:c], x @ w[c : 2 * c].T + b[c : 2 * c], x @ w[2 * c :].T + b[2 * c :]

    def heads(z):
        return z.view(2, -1, h, c // h).transpose(1, 2)  # (B, H, T, D)

    a = attend(heads(q), heads(k), heads(v), real)[0].transpose(1, 2).reshape(2, -1, c)
    y = block.norm1(pooled + block.attn.out_proj(a))
    y = block.norm2(y + block.ffn(y))
    memory, mask = model.encode(src)
    assert mask.flatten(1).tolist() == [[True] * 3, [True, True, False]]
    torch.testing.assert_close(memory[0], y[0], atol=1e-10, rtol=0)
    torch.testing.assert_close(memory[1, :2], y[1, :2], atol=1e-10, rtol=0)


def test_cross_attention_on_the_short_memory_equals_the_formula_with_the_pooled_mask():
    model = tiny(n_decoder_layers=1).double()
    src, tgt_in = source(), torch.tensor([[BOS, 5, 6], [BOS, 7, 8]])
    memory, _ = model.encode(src)
    pooled_real = torch.tensor([[True, True], [True, False]])  # as counted out above
    block, c, h = model.decoder[0], 16, 2
    x = model._embed(tgt_in, model.tgt_embedding)
    x = block.norm1(x + block.self_attn(x, causal=True)[0])  # post-norm (Vaswani et al. Figure 1)
    w, b = block.cross_attn.in_proj.weight, block.cross_attn.in_proj.bias
    q, k, v = x @ w[:c].T + b[:c], memory @ w[c : 2 * c].T + b[c : 2 * c], memory @ w[2 * c :].T + b[2 * c :]

    def heads(z):
        return z.view(2, -1, h, c // h).transpose(1, 2)  # (B, H, T, D)

    a, weights = attend(heads(q), heads(k), heads(v), pooled_real)
    x = block.norm2(x + block.cross_attn.out_proj(a.transpose(1, 2).reshape(2, -1, c)))
    x = block.norm3(x + block.ffn(x))
    torch.testing.assert_close(model(src, tgt_in), model.output(x), atol=1e-10, rtol=0)
    torch.testing.assert_close(model.cross_attention_layers(src, tgt_in)[0], weights, atol=1e-10, rtol=0)
    # The alignment picture spreads each pooled position's weight over the 4 tokens it holds.
    alignment = model.cross_attention(src, tgt_in)
    assert alignment.shape == (2, 3, 7)
    torch.testing.assert_close(alignment[..., :4], weights.mean(1)[..., :1].expand(-1, -1, 4))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_incremental_decoding_equals_the_full_forward(norm):
    model = tiny(norm=norm)
    src, tgt_in = source(), torch.tensor([[BOS, 5, 6, 7], [BOS, 8, 9, 10]])
    logits = model(src, tgt_in)
    state = model.start(src, max_len=8)
    stepped = torch.stack([model.step(tgt_in[:, t], state) for t in range(4)], dim=1)
    torch.testing.assert_close(stepped, logits, atol=1e-5, rtol=1e-5)
    # Greedy decoding, step by step, picks the full forward's argmax at every position.
    for row, ids in enumerate(greedy_translate(model, src, bos_id=BOS, eos_id=EOS, max_len_extra=4)):
        full = model(src[row : row + 1], torch.tensor([[BOS, *ids]]))[0]  # (T, V)
        picked = full.argmax(-1).tolist()
        assert picked[: len(ids)] == ids
        assert len(picked) == len(ids) + 1  # the last position: eos, or the length limit


def test_a_tiny_funnel_model_learns_to_copy():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        Seq2SeqConfig(
            vocab_size=12, d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=1, d_ff=64, dropout=0.0,
            funnel_stages=(1, 1), max_len=16,
        )
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        src = torch.randint(3, 12, (16, 6))
        tgt_in = torch.cat([torch.full((16, 1), BOS), src], dim=1)
        tgt_out = torch.cat([src, torch.full((16, 1), EOS)], dim=1)
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 2.0
    assert sum(losses[-10:]) / 10 < 0.5 * losses[0]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(funnel_stages=(2, 2)), "summing to n_encoder_layers (3)"),
        (dict(funnel_stages=(3,)), "two or more stages"),
        (dict(positions="rope"), "positions at the input"),
        (dict(attention="synthesizer-dense"), "attention 'full'"),
        (dict(transparent_attention=True), "no transparent_attention"),
    ],
)
def test_a_funnel_the_encoder_cannot_take_is_refused_naming_the_field(fields, message):
    base = dict(vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=3, funnel_stages=(1, 2))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Seq2SeqConfig(**(base | fields))
