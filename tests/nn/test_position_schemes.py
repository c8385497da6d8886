"""Position schemes inside attention (rotary, ALiBi, Shaw's relative) and the Fourier basis, each
against its paper's formula or an independent implementation (`transformers`' rotary helper,
BLOOM's ALiBi tensor)."""

import math

import pytest
import torch

from attnlab.nn import (
    ALiBiPositions,
    AttentionSpec,
    MultiHeadAttention,
    RelativePositions,
    RotaryPositions,
    alibi_slopes,
    build_attention_positions,
    build_positions,
    fourier_positions,
    fourier_shift,
)


def test_rope_equals_transformers_llama_rotary():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    torch.manual_seed(0)
    b, h, t, d, theta = 2, 3, 11, 16, 500.0
    config = LlamaConfig(hidden_size=h * d, num_attention_heads=h, rope_theta=theta, max_position_embeddings=64)
    q, k = torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    pos = torch.arange(5, 5 + t)
    cos, sin = LlamaRotaryEmbedding(config)(q, pos[None].expand(b, t))
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryPositions(h, d, theta=theta)
    q_rot, k_rot = rope.rotate(q, k, pos)
    torch.testing.assert_close(q_rot, q_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(k_rot, k_ref, rtol=0, atol=1e-5)


def test_rope_dot_products_depend_only_on_the_offset():
    # RoFormer Eq. 16: <R(m) q, R(n) k> = <q, R(n - m) k>.
    torch.manual_seed(0)
    rope = RotaryPositions(1, 8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    dots = {}
    for m, n in [(0, 3), (10, 13), (100, 103), (7, 7), (50, 50), (9, 2), (42, 35)]:
        q_m, _ = rope.rotate(q, k, torch.tensor([m]))
        _, k_n = rope.rotate(q, k, torch.tensor([n]))
        dot = float((q_m * k_n).sum())
        dots.setdefault(n - m, []).append(dot)
    for offset, values in dots.items():
        assert max(values) - min(values) < 1e-4, offset
    assert len({round(v[0], 3) for v in dots.values()}) == 3  # and the offsets do differ


def test_rope_refuses_odd_head_size():
    with pytest.raises(ValueError, match="even"):
        RotaryPositions(2, 7)


@pytest.mark.parametrize("n_heads", [1, 2, 4, 5, 6, 8, 12, 16])
def test_alibi_slopes_equal_bloom(n_heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 4, dtype=torch.long), n_heads, torch.float32)  # (H, 1, T): m_h * j
    torch.testing.assert_close(alibi_slopes(n_heads), alibi[:, 0, 1], rtol=1e-6, atol=0)


def test_alibi_slopes_of_the_paper_for_eight_heads():
    # §3: "For 8 heads, the slopes are 1/2^1, 1/2^2, ..., 1/2^8".
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]


def test_alibi_attention_equals_bloom_biased_softmax():
    # BLOOM adds m_h * j to the scores; under the causal mask that differs from -m_h (i - j) by a
    # per-row constant, which the softmax ignores.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    torch.manual_seed(0)
    b, h, t, d = 2, 6, 9, 8
    attn = MultiHeadAttention(h * d, h, spec=AttentionSpec(positions="alibi")).eval()
    x = torch.randn(b, t, h * d)
    ours, weights = attn(x, causal=True, need_weights=True)
    q, k, v = attn.in_proj(x).split(h * d, dim=-1)
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
    alibi = build_alibi_tensor(torch.ones(b, t, dtype=torch.long), h, torch.float32).view(b, h, 1, t)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) + alibi
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    ref_weights = scores.softmax(-1)
    ref = attn.out_proj((ref_weights @ v).transpose(1, 2).reshape(b, t, h * d))
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    fused, _ = attn(x, causal=True)  # the same through PyTorch's fused kernel with a float mask
    torch.testing.assert_close(fused, ref, rtol=0, atol=1e-5)


def shaw_reference(x, w_q, w_k, w_v, a_k, a_v, k_max):
    """Shaw et al. Eq. 3-5, one head, one query and one key at a time: e_ij = x_i W^Q (x_j W^K +
    a^K_ij)^T / sqrt(d), z_i = sum_j alpha_ij (x_j W^V + a^V_ij), a_ij = w_clip(j - i, k)."""
    t, d = x.size(0), w_q.size(1)
    out = torch.zeros(t, d, dtype=torch.float64)
    for i in range(t):
        e = torch.zeros(t, dtype=torch.float64)
        for j in range(t):
            r = max(-k_max, min(k_max, j - i)) + k_max
            e[j] = (x[i] @ w_q) @ (x[j] @ w_k + a_k[r]) / math.sqrt(d)
        alpha = torch.softmax(e, 0)
        for j in range(t):
            r = max(-k_max, min(k_max, j - i)) + k_max
            out[i] += alpha[j] * (x[j] @ w_v + a_v[r])
    return out


@pytest.mark.parametrize("k_max", [1, 3, 20])
def test_relative_attention_equals_shaw_equations(k_max):
    torch.manual_seed(0)
    t, c = 7, 6
    attn = MultiHeadAttention(c, 1, bias=False, spec=AttentionSpec(positions="relative", relative_distance=k_max))
    attn = attn.double()
    with torch.no_grad():
        attn.positions.keys.normal_()
        attn.positions.values.normal_()
        attn.out_proj.weight.copy_(torch.eye(c))
    x = torch.randn(1, t, c, dtype=torch.float64)
    w_q, w_k, w_v = (w.t() for w in attn.in_proj.weight.split(c))
    expected = shaw_reference(x[0], w_q, w_k, w_v, attn.positions.keys, attn.positions.values, k_max)
    ours, _ = attn(x)
    torch.testing.assert_close(ours[0], expected.detach(), rtol=0, atol=1e-10)


def test_relative_positions_share_one_table_per_layer_across_heads():
    scheme = build_attention_positions("relative", 4, 8, max_distance=5)
    assert isinstance(scheme, RelativePositions)
    assert [tuple(p.shape) for p in scheme.parameters()] == [(11, 8), (11, 8)]
    assert build_attention_positions("learned", 4, 8) is None
    assert isinstance(build_attention_positions("alibi", 4, 8), ALiBiPositions)


def test_fourier_basis_is_the_lecture_formula():
    t_period, d = 16, 6
    table = fourier_positions(20, d, t_period)
    for t in range(20):
        expected = []
        for k in range(1, d // 2 + 1):
            expected += [math.cos(math.pi * k * t / t_period), math.sin(math.pi * k * t / t_period)]
        torch.testing.assert_close(table[t].double(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-6)


@pytest.mark.parametrize("d_shift", [0, 1, 5, 13])
def test_fourier_time_shift_is_a_matrix_product(d_shift):
    period, d = 32, 10
    table = fourier_positions(64, d, period).double()
    shift = fourier_shift(d_shift, d, period).double()
    for t in range(d_shift, 64):
        torch.testing.assert_close(shift @ table[t], table[t - d_shift], rtol=0, atol=1e-6)
    assert not torch.allclose(fourier_shift(3, d, period) @ table[10].float(), table[10].float())


@pytest.mark.parametrize("d_shift", [1, 3, 8])
def test_attention_with_w_q_set_to_the_shift_attends_d_steps_back(d_shift):
    # The lecture's slide: with W_Q = R(d) (and W_K = I) a query at t matches the key at t - d,
    # since q_t = e_{t-d}; scaled up, the softmax puts nearly all its weight there.
    period, d_model = 32, 64
    positions = build_positions("fourier", period, d_model)
    e = positions(torch.arange(period))  # (T, C): the inputs are the positions alone
    attn = MultiHeadAttention(d_model, 1, bias=False)
    with torch.no_grad():
        w_q, w_k, w_v = attn.in_proj.weight.split(d_model)
        w_q.copy_(fourier_shift(d_shift, d_model, period) * 8.0)  # a sharp softmax
        w_k.copy_(torch.eye(d_model))
        w_v.copy_(torch.eye(d_model))
    with torch.no_grad():
        _, weights = attn(e[None], causal=True, need_weights=True)
    looked_at = weights[0, 0].argmax(-1)
    assert looked_at[d_shift:].tolist() == list(range(period - d_shift))
    assert float(weights[0, 0, d_shift:].max(-1).values.min()) > 0.9


def test_sinusoidal_and_fourier_tables_grow_past_the_training_length():
    for kind in ("sinusoidal", "fourier"):
        module = build_positions(kind, 8, 6)
        assert module.max_positions is None
        module.grow(20)
        assert module(torch.arange(20)).shape == (20, 6)
        torch.testing.assert_close(module(torch.arange(8)), build_positions(kind, 8, 6)(torch.arange(8)))
    assert build_positions("learned", 8, 6).max_positions == 8


def test_unknown_scheme_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean 'rope'"):
        build_positions("rop", 8, 6)
    with pytest.raises(ValueError, match="alibi"):
        build_attention_positions("alibli", 2, 4)
