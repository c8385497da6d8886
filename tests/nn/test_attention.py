"""Scaled dot-product attention and multi-head attention, checked against references written out
by hand and against `torch.nn.MultiheadAttention` with the same weights copied in.

Shape legend: B batch, T time (Tq queries, Tk keys), H heads, D head dim, C model dim.
"""

import inspect
import math

import pytest
import torch
from torch import nn

from attnlab.nn import KVCache, MultiHeadAttention, causal_mask, padding_mask, scaled_dot_product_attention
from attnlab.nn import attention as attention_module


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """Eq. 1 one query at a time with Python floats. q (Tq, D), k (Tk, D), v (Tk, Dv), mask (Tq, Tk)."""
    q, k, v = q.tolist(), k.tolist(), v.tolist()
    allowed = mask.tolist() if mask is not None else [[True] * len(k) for _ in q]
    d = len(q[0])
    outs, weights = [], []
    for i, qi in enumerate(q):
        scores = [sum(a * b for a, b in zip(qi, kj, strict=True)) / math.sqrt(d) for kj in k]
        keys = [j for j in range(len(k)) if allowed[i][j]]
        row = [0.0] * len(k)
        if keys:
            top = max(scores[j] for j in keys)
            exps = {j: math.exp(scores[j] - top) for j in keys}
            total = sum(exps.values())
            for j in keys:
                row[j] = exps[j] / total
        weights.append(row)
        outs.append([sum(row[j] * v[j][c] for j in range(len(k))) for c in range(len(v[0]))])
    return torch.tensor(outs, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)


def test_attention_worked_example():
    # One-dimensional keys 1 and 0. Query ln 3 scores (ln 3, 0): weights (3/4, 1/4). Query 0 scores (0, 0):
    # weights (1/2, 1/2). Values 4 and 8: outputs 3/4 * 4 + 1/4 * 8 = 5 and 6.
    q = torch.tensor([[math.log(3.0)], [0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    v = torch.tensor([[4.0], [8.0]], dtype=torch.float64)
    out, weights = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(weights, torch.tensor([[0.75, 0.25], [0.5, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([[5.0], [6.0]], dtype=torch.float64))


def test_attention_worked_example_scales_by_sqrt_d():
    # D = 4, so scores are q.k / 2: q.k = 2 ln 3 gives weights (3/4, 1/4) again; without the 1/sqrt(D) it
    # would be (9/10, 1/10).
    q = torch.tensor([[math.log(3.0), math.log(3.0), 0.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[4.0, 0.0], [8.0, 1.0]], dtype=torch.float64)
    out, weights = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(weights, torch.tensor([[0.75, 0.25]], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([[5.0, 0.25]], dtype=torch.float64))


def test_attention_worked_example_with_mask():
    # Masking the first key leaves all the weight on the second: output is its value, 8.
    q = torch.tensor([[math.log(3.0)], [0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    v = torch.tensor([[4.0], [8.0]], dtype=torch.float64)
    mask = torch.tensor([[False, True], [True, True]])
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert weights.tolist() == [[0.0, 1.0], [0.5, 0.5]]
    torch.testing.assert_close(out, torch.tensor([[8.0], [6.0]], dtype=torch.float64))


@pytest.mark.parametrize(("t_q", "t_k", "d", "d_v"), [(1, 1, 1, 1), (3, 5, 4, 2), (4, 4, 8, 8), (6, 2, 3, 5)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_equals_hand_computation(t_q, t_k, d, d_v, masked):
    torch.manual_seed(0)
    q, k, v = torch.randn(t_q, d), torch.randn(t_k, d), torch.randn(t_k, d_v)
    mask = torch.rand(t_q, t_k) > 0.4 if masked else None
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    ref_out, ref_weights = reference_attention(q, k, v, mask)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-5, atol=1e-6)


def test_attention_batched_over_leading_dims():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 7)
    mask = padding_mask(torch.tensor([6, 2]), 6)  # (B, 1, 1, Tk)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, 3, 4, 7)
    assert weights.shape == (2, 3, 4, 6)
    for b in range(2):
        for h in range(3):
            ref_out, ref_weights = reference_attention(q[b, h], k[b, h], v[b, h], mask[b, 0].expand(4, 6))
            torch.testing.assert_close(out[b, h].double(), ref_out, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(weights[b, h].double(), ref_weights, rtol=1e-5, atol=1e-6)


def test_attention_rows_sum_to_one_and_masked_keys_get_zero_weight():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    mask = torch.rand(2, 5, 7) > 0.5
    mask[..., 0] = True  # every query has at least one key
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))
    assert torch.all(weights[~mask] == 0.0)
    assert torch.all(weights[mask] > 0.0)


def test_attention_fully_masked_row_is_zero_not_nan():
    torch.manual_seed(0)
    q = torch.randn(3, 4, requires_grad=True)
    k = torch.randn(5, 4, requires_grad=True)
    v = torch.randn(5, 4, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert not out.isnan().any() and not weights.isnan().any()
    assert torch.all(out[1] == 0.0) and torch.all(weights[1] == 0.0)
    torch.testing.assert_close(weights[[0, 2]].sum(-1), torch.ones(2))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


# --- Multi-head attention -----------------------------------------------------------------------

C, H = 8, 2


def make_mha(seed: int = 0, **kwargs) -> MultiHeadAttention:
    """An MHA whose biases are non-zero too, so that copying them is tested."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(C, H, **kwargs)
    with torch.no_grad():
        for p in mha.parameters():
            p.normal_(0.0, 0.5)
    return mha.eval()


def torch_mha_like(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(mha.d_model, mha.n_heads, batch_first=True, bias=mha.in_proj.bias is not None)
    with torch.no_grad():
        ref.in_proj_weight.copy_(mha.in_proj.weight)
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        if mha.in_proj.bias is not None:
            ref.in_proj_bias.copy_(mha.in_proj.bias)
            ref.out_proj.bias.copy_(mha.out_proj.bias)
    return ref.eval()


MASK_CASES = ["none", "causal", "padding", "causal+padding"]


def mask_case(case: str, lengths: list[int], t: int) -> dict:
    """Keyword arguments for MHA: a padding mask and/or the causal flag."""
    kwargs: dict = {"causal": "causal" in case}
    if "padding" in case:
        kwargs["mask"] = padding_mask(torch.tensor(lengths), t)
    return kwargs


@pytest.mark.parametrize("case", MASK_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_mha_fused_and_explicit_paths_agree(case, bias):
    mha = make_mha(bias=bias)
    torch.manual_seed(1)
    x = torch.randn(3, 6, C)
    kwargs = mask_case(case, [6, 4, 1], 6)
    fused, no_weights = mha(x, need_weights=False, **kwargs)
    explicit, weights = mha(x, need_weights=True, **kwargs)
    assert no_weights is None
    assert weights.shape == (3, H, 6, 6)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", ["none", "padding"])
def test_mha_cross_attention_fused_and_explicit_paths_agree(case):
    mha = make_mha()
    torch.manual_seed(1)
    x, memory = torch.randn(2, 3, C), torch.randn(2, 5, C)
    kwargs = mask_case(case, [5, 2], 5)
    fused, _ = mha(x, memory, **kwargs)
    explicit, weights = mha(x, memory, need_weights=True, **kwargs)
    assert fused.shape == (2, 3, C) and weights.shape == (2, H, 3, 5)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_mha_fully_masked_row_is_zero_not_nan(need_weights):
    # Sequence 1 has no real keys at all: its heads see nothing, so concat(heads) is zero and the
    # output is out_proj(0) = out_proj.bias.
    mha = make_mha()
    torch.manual_seed(1)
    x = torch.randn(2, 4, C, requires_grad=True)
    mask = padding_mask(torch.tensor([3, 0]), 4)
    out, weights = mha(x, mask=mask, need_weights=need_weights)
    assert not out.isnan().any()
    torch.testing.assert_close(out[1], mha.out_proj.bias.expand(4, C), rtol=0, atol=0)
    if need_weights:
        assert torch.all(weights[1] == 0.0)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mha.parameters())


def test_mha_fully_masked_query_row_in_fused_path():
    # Only the second query is cut off from every key; the others are unaffected.
    mha = make_mha(bias=False)
    torch.manual_seed(1)
    x = torch.randn(1, 3, C)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    out, _ = mha(x, mask=mask)
    explicit, _ = mha(x, mask=mask, need_weights=True)
    assert not out.isnan().any()
    assert torch.all(out[0, 1] == 0.0)
    torch.testing.assert_close(out, explicit, rtol=0, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("case", MASK_CASES)
def test_mha_self_attention_equals_torch(case, need_weights):
    mha = make_mha()
    ref = torch_mha_like(mha)
    torch.manual_seed(1)
    lengths, t = [5, 3], 5
    x = torch.randn(2, t, C)
    kwargs = mask_case(case, lengths, t)
    out, weights = mha(x, need_weights=need_weights, **kwargs)

    # torch's masks are the other way round: True = may NOT attend.
    key_padding_mask = ~padding_mask(torch.tensor(lengths), t)[:, 0, 0, :] if "padding" in case else None
    attn_mask = ~causal_mask(t) if "causal" in case else None
    with torch.no_grad():
        ref_out, ref_weights = ref(
            x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, average_attn_weights=False
        )
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_mha_cross_attention_equals_torch(padded, need_weights):
    mha = make_mha()
    ref = torch_mha_like(mha)
    torch.manual_seed(1)
    lengths, t_k = [2, 6], 6
    x, memory = torch.randn(2, 4, C), torch.randn(2, t_k, C)
    mask = padding_mask(torch.tensor(lengths), t_k) if padded else None
    out, weights = mha(x, memory, mask=mask, need_weights=need_weights)
    with torch.no_grad():
        ref_out, ref_weights = ref(
            x, memory, memory, key_padding_mask=None if mask is None else ~mask[:, 0, 0, :], average_attn_weights=False
        )
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)


def test_mha_heads_are_split_like_the_paper():
    # Head h uses rows h*D:(h+1)*D of W_Q, W_K, W_V; out_proj maps concat(head_1..head_H).
    mha = make_mha()
    torch.manual_seed(1)
    x = torch.randn(1, 4, C)
    out, weights = mha(x, need_weights=True)
    w_q, w_k, w_v = mha.in_proj.weight.split(C)
    b_q, b_k, b_v = mha.in_proj.bias.split(C)
    d = C // H
    heads = []
    for h in range(H):
        rows = slice(h * d, (h + 1) * d)
        q = x[0] @ w_q[rows].T + b_q[rows]
        k = x[0] @ w_k[rows].T + b_k[rows]
        v = x[0] @ w_v[rows].T + b_v[rows]
        head, head_weights = reference_attention(q, k, v)
        torch.testing.assert_close(weights[0, h].double(), head_weights, rtol=1e-5, atol=1e-6)
        heads.append(head)
    expected = torch.cat(heads, dim=-1) @ mha.out_proj.weight.double().T + mha.out_proj.bias.double()
    torch.testing.assert_close(out[0].double(), expected, rtol=1e-5, atol=1e-5)


def test_mha_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)


# --- KV cache ------------------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 1, 2], [2, 5], [7], [4, 3]])
def test_kv_cache_incremental_equals_full_causal(chunks, need_weights):
    mha = make_mha()
    torch.manual_seed(1)
    b, t = 2, sum(chunks)
    x = torch.randn(b, t, C)
    full, full_weights = mha(x, causal=True, need_weights=True)

    cache = KVCache(b, H, max_len=10, head_dim=C // H)
    outs, start = [], 0
    for n in chunks:  # the layer writes where it is told: the caller (a model) keeps the count
        out, weights = mha(
            x[:, start : start + n], causal=True, cache=cache, positions=start, need_weights=need_weights
        )
        if need_weights:
            # The new queries see every cached key, and none after themselves.
            torch.testing.assert_close(weights, full_weights[:, :, start : start + n, : start + n], atol=1e-6, rtol=0)
        outs.append(out)
        start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=0, atol=1e-5)


def test_kv_cache_incremental_with_padding_mask_equals_full():
    mha = make_mha()
    torch.manual_seed(1)
    x = torch.randn(2, 5, C)
    lengths = torch.tensor([5, 3])
    full, _ = mha(x, causal=True, mask=padding_mask(lengths, 5))
    cache = KVCache(2, H, max_len=5, head_dim=C // H)
    first, _ = mha(x[:, :2], causal=True, cache=cache, positions=0, mask=padding_mask(lengths, 2))
    rest, _ = mha(x[:, 2:], causal=True, cache=cache, positions=2, mask=padding_mask(lengths, 5))
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, rtol=0, atol=1e-5)


def test_kv_cache_stores_keys_and_values():
    torch.manual_seed(0)
    cache = KVCache(1, 2, max_len=4, head_dim=3)
    k1, v1 = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
    k, v, positions, mask = cache.update(0, k1, v1)
    assert torch.equal(k, k1) and torch.equal(v, v1) and positions is None and mask is None
    k2, v2 = torch.randn(1, 2, 1, 3), torch.randn(1, 2, 1, 3)
    k, v, _, _ = cache.update(3, k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], dim=2))
    k, _, _, _ = cache.update(0, k2, v2)  # position 0 again: a new sequence
    assert torch.equal(k, k2)


def test_kv_cache_overflow_raises_and_keeps_state():
    cache = KVCache(1, 2, max_len=4, head_dim=3)
    cache.update(0, torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3))
    with pytest.raises(ValueError, match="overflow"):
        cache.update(3, torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 2, 3))
    assert torch.all(cache.k[:, :, :3] == 1) and not cache.k[:, :, 3:].any()


def test_mha_with_full_cache_raises():
    mha = make_mha()
    cache = KVCache(1, H, max_len=3, head_dim=C // H)
    mha(torch.randn(1, 3, C), causal=True, cache=cache, positions=0)
    with pytest.raises(ValueError, match="overflow"):
        mha(torch.randn(1, 1, C), causal=True, cache=cache, positions=3)


def test_mha_with_a_cache_needs_the_positions():
    """A layer's cache counts nothing: without the model's count (or a tensor) the layer cannot
    know where the new keys go, and says so rather than guess."""
    cache = KVCache(1, H, max_len=3, head_dim=C // H)
    with pytest.raises(ValueError, match="positions"):
        make_mha()(torch.randn(1, 1, C), causal=True, cache=cache)


# --- Dropout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_dropout_only_in_training(need_weights):
    mha = make_mha(dropout=0.5)
    plain = make_mha(dropout=0.0)
    plain.load_state_dict(mha.state_dict())
    torch.manual_seed(1)
    x = torch.randn(2, 6, C)

    mha.eval()
    evaluated, weights = mha(x, causal=True, need_weights=need_weights)
    again, _ = mha(x, causal=True, need_weights=need_weights)
    reference, _ = plain(x, causal=True, need_weights=need_weights)
    assert torch.equal(evaluated, again)
    torch.testing.assert_close(evaluated, reference, rtol=0, atol=0)

    mha.train()
    torch.manual_seed(2)
    first, train_weights = mha(x, causal=True, need_weights=need_weights)
    second, _ = mha(x, causal=True, need_weights=need_weights)
    assert not torch.allclose(first, reference, atol=1e-3)
    assert not torch.allclose(first, second, atol=1e-3)
    if need_weights:
        # The returned weights are the softmax's, before dropout.
        torch.testing.assert_close(train_weights, weights)


def test_attention_function_dropout_zeroes_and_rescales():
    torch.manual_seed(0)
    q, k = torch.randn(50, 4), torch.randn(50, 4)
    v = torch.eye(50)  # out = applied weights, row by row
    out, weights = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    dropped = out == 0.0
    assert 0.3 < dropped.float().mean() < 0.7
    torch.testing.assert_close(out[~dropped], 2.0 * weights[~dropped])
    out_no_dropout, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out_no_dropout, weights)


def test_static_cache_steps_equal_full_causal_attention():
    # Prefill 5 positions, then 4 one-token steps written at explicit positions: every output
    # equals causal attention over the whole sequence at once (the reference).
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        full, _ = mha(x, causal=True)
        cache = KVCache(2, 4, 12, 4)
        outs = [mha(x[:, :5], cache=cache, positions=torch.arange(5))[0]]
        for t in range(5, 9):
            outs.append(mha(x[:, t : t + 1], cache=cache, positions=torch.tensor([t]))[0])
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=1e-4)
    # The slots past the last position were never written.
    assert torch.all(cache.k[:, :, 9:] == 0) and cache.k.shape == (2, 4, 12, 4)


def test_static_cache_write_casts_and_stays_in_place():
    cache = KVCache(1, 2, 6, 3)
    k_buffer = cache.k
    k, v = torch.ones(1, 2, 2, 3, dtype=torch.bfloat16), torch.full((1, 2, 2, 3), 2.0)
    all_k, all_v, _, _ = cache.update(torch.tensor([3, 4]), k, v)
    assert all_k is k_buffer and all_k.dtype == torch.float32
    assert torch.all(all_k[:, :, 3:5] == 1) and torch.all(all_v[:, :, 3:5] == 2)
    assert torch.all(all_k[:, :, :3] == 0) and torch.all(all_k[:, :, 5:] == 0)


def test_cache_select_reorders_the_filled_rows_and_leaves_room_to_append():
    cache = KVCache(3, 2, 6, 4)
    k = torch.arange(3 * 2 * 2 * 4, dtype=torch.float32).view(3, 2, 2, 4)
    cache.update(0, k, -k)
    index = torch.tensor([2, 0, 0])  # same row count: selected into the spare buffers, swapped
    cache.select_rows(index, filled=2)
    torch.testing.assert_close(cache.k[:, :, :2], k[index])
    torch.testing.assert_close(cache.v[:, :, :2], -k[index])
    again = torch.tensor([1, 2, 0])  # and back into the first pair: the selection composes
    cache.select_rows(again, filled=2)
    torch.testing.assert_close(cache.k[:, :, :2], k[index][again])
    torch.testing.assert_close(cache.v[:, :, :2], -k[index][again])
    k = k[index][again]
    cache.select_rows(torch.tensor([1]), filled=2)  # fewer rows: new buffers, the filled part copied
    assert cache.k.shape == (1, 2, 6, 4)
    torch.testing.assert_close(cache.k[:, :, :2], k[[1]])
    all_k, _, _, _ = cache.update(2, torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert all_k.shape == (1, 2, 3, 4) and torch.all(all_k[:, :, 2] == 1)


def _written_by_hand(shape, writes):
    """The buffer a cache of `shape` holds after writes [(row, slot, values (H, D)), ...] into zeros."""
    want = torch.zeros(shape)
    for row, slot, values in writes:
        want[row, :, slot] = values
    return want


def test_update_writes_each_row_at_its_own_positions():
    torch.manual_seed(3)
    cache = KVCache(3, 2, 8, 4)
    positions = torch.tensor([[5, 1], [0, 7], [4, 3]])  # (B, T): any slots, in any order
    k, v = torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 4)
    all_k, all_v, _, mask = cache.update(positions, k, v)
    assert all_k is cache.k and all_v is cache.v  # the whole buffers
    # each row's queries see the slots up to their own position, (B, 1, Tq, max_len)
    assert torch.equal(mask, (torch.arange(8) <= positions[..., None])[:, None])
    cells = [(row, int(positions[row, t]), t) for row in range(3) for t in range(2)]
    assert torch.equal(cache.k, _written_by_hand(cache.k.shape, [(r, p, k[r, :, t]) for r, p, t in cells]))
    assert torch.equal(cache.v, _written_by_hand(cache.v.shape, [(r, p, v[r, :, t]) for r, p, t in cells]))
    # The same positions for every row, as (T,) or as (B, T), write the same.
    shared, per_row = KVCache(3, 2, 8, 4), KVCache(3, 2, 8, 4)
    shared.update(torch.tensor([6, 2]), k, v)
    per_row.update(torch.tensor([[6, 2]] * 3), k, v)
    assert torch.equal(shared.k, per_row.k) and torch.equal(shared.v, per_row.v)
    assert torch.equal(shared.k[:, :, [6, 2]], k) and not shared.k[:, :, [0, 1, 3, 4, 5, 7]].any()


@pytest.mark.parametrize("chunks", [[3, 1, 1], [1, 4], [5]])
def test_update_at_an_int_writes_what_update_at_those_positions_writes(chunks):
    """Appending (an int: the next slots, as slices) and the static path (a position tensor) fill
    the buffers alike, and both return what the new queries see: the filled slots under the
    look-ahead rule, or the whole buffers with the mask of the slots up to each query's position."""
    torch.manual_seed(4)
    growing, static = KVCache(2, 2, 6, 3), KVCache(2, 2, 6, 3)
    start = 0
    for n in chunks:
        k, v = torch.randn(2, 2, n, 3), torch.randn(2, 2, n, 3)
        got = growing.update(start, k, v)
        every = static.update(torch.arange(start, start + n), k, v)
        assert got.k.shape == (2, 2, start + n, 3) and got.mask is None and every.k.shape == (2, 2, 6, 3)
        assert torch.equal(every.mask, torch.arange(6) <= torch.arange(start, start + n)[:, None])
        assert torch.equal(got.k, every.k[:, :, : start + n]) and torch.equal(got.v, every.v[:, :, : start + n])
        start += n
    assert torch.equal(growing.k, static.k) and torch.equal(growing.v, static.v)
    # An int before the end rewrites those slots and returns the slots up to them alone.
    k = torch.full((2, 2, 1, 3), 9.0)
    got_k = growing.update(1, k, k).k
    assert got_k.shape[2] == 2 and torch.equal(got_k[:, :, 1:], k) and torch.equal(got_k[:, :, :1], static.k[:, :, :1])


def test_view_rows_writes_through_to_the_shared_buffers():
    cache = KVCache(4, 2, 6, 3)
    part = cache.view_rows(slice(1, 3), 4)
    assert part.k.shape == (2, 2, 4, 3)
    k = torch.ones(2, 2, 2, 3)
    part.update(torch.tensor([[0, 1], [2, 3]]), k, 2 * k)
    assert torch.equal(cache.k[1, :, :2], k[0]) and torch.equal(cache.v[2, :, 2:4], 2 * k[1])
    assert not cache.k[[0, 3]].any() and not cache.k[1, :, 2:].any() and not cache.k[2, :, :2].any()


def _bf16_mha_step(mha: MultiHeadAttention, x: torch.Tensor, **kwargs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output and the gradients of x and the weights, one training step of the module in bf16."""
    mha.zero_grad()
    x = x.detach().requires_grad_()
    out, _ = mha(x, **kwargs)
    out.float().square().sum().backward()
    return out.float(), [x.grad.float()] + [p.grad.float() for p in mha.parameters()]


@pytest.mark.parametrize("case", MASK_CASES)
def test_bf16_training_that_prefers_the_formula_computes_the_same(monkeypatch, case):
    """Where the hook set from outside prefers the formula (`prefer_formula`; accel's rule for bf16
    training on a CPU, tests/accel/test_rules.py), the formula runs: the same outputs and gradients
    as the fused kernel, and the float64 module's to bf16 precision."""
    import attnlab.nn.attention as attention

    mha = make_mha().train()
    torch.manual_seed(2)
    x = torch.randn(3, 128, C)
    kwargs = mask_case(case, [128, 100, 7], 128)
    out64, grads64 = _bf16_mha_step(make_mha().double().train(), x.double(), **kwargs)
    fused = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **k: pytest.fail("fused kernel ran"))
    mha_bf16 = mha.to(torch.bfloat16)
    mha_bf16.prefer_formula = lambda q, t_k: True
    out, grads = _bf16_mha_step(mha_bf16, x.bfloat16(), **kwargs)
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", fused)
    mha_bf16.prefer_formula = None  # the reference: the fused kernel, for comparison
    out_fused, grads_fused = _bf16_mha_step(mha_bf16, x.bfloat16(), **kwargs)
    torch.testing.assert_close(out, out64.float(), atol=0.1, rtol=0.02)
    torch.testing.assert_close(out, out_fused, atol=0.1, rtol=0.02)
    for g, g64, g_fused in zip(grads, grads64, grads_fused, strict=True):
        scale = g64.abs().max().item()
        assert (g - g64.float()).abs().max().item() < 0.03 * scale
        assert (g - g_fused).abs().max().item() < 0.03 * scale


def test_forward_reads_as_its_three_steps_with_no_special_case_by_type():
    """Project, update the cache, attend: `forward` stays short, and a pattern with logits of its
    own (the synthesizers) goes through the patterns' interface, not a check of its class."""
    source = inspect.getsource(MultiHeadAttention.forward)
    body = source.split('"""')[2].strip().splitlines()  # after the docstring
    signature = source.split('"""')[0].strip().splitlines()
    assert len(signature) + len(body) <= 25, len(signature) + len(body)
    assert "isinstance" not in source and "isinstance" not in inspect.getsource(MultiHeadAttention._attend_pattern)
    assert "Synthesizer" not in inspect.getsource(attention_module)
