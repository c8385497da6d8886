"""Attention patterns (`attnlab.nn.sparse`), each checked against dense attention with a (T, T) mask built
here from the paper's rule, and BigBird's masks checked against the rule of Zaheer et al. block by block.

Shape legend: B batch, H heads, T time, D head dim.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnlab.nn.sparse import (
    PATTERNS,
    BigBirdAttention,
    FullAttention,
    LinformerAttention,
    WindowAttention,
    build_pattern,
)


def make_qkv(b: int, h: int, t: int, d: int, *, seed: int = 0, dtype=torch.float64, grad: bool = False):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, t, d, generator=gen, dtype=dtype).requires_grad_(grad) for _ in range(3))


def make_padding(b: int, t: int, seed: int = 1) -> torch.Tensor:
    """bool (B, T), True = real key; about a third padding, scattered (not only at the end)."""
    return torch.rand(b, t, generator=torch.Generator().manual_seed(seed)) > 0.33


def dense_reference(q, k, v, mask, *, key_padding=None, terms=None):
    """softmax(q kᵀ/√D + bias) v over a full (T, T) mask, rows without keys zero; with `StandInTerms`, the
    score bias -m_h |i - j| and the value bias Σ_j w_ij table[clip(j - i)] written out on the (T, T) grid."""
    t, d = q.size(-2), q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    if terms is not None:
        scores = scores - terms.slopes[:, None, None] * (i - j).abs()
    allowed = mask if key_padding is None else mask & key_padding[:, None, None, :]
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    weights = torch.where(allowed, weights, 0.0)
    y = weights @ v
    if terms is not None:
        rel = (j - i).clamp(-terms.clip, terms.clip) + terms.clip  # (T, T)
        y = y + torch.einsum("bhij,ijd->bhid", weights, terms.table[rel])
    return y


def mask_from_rule(t: int, rule) -> torch.Tensor:
    """bool (T, T) with mask[i, j] = rule(i, j), by loops."""
    return torch.tensor([[rule(i, j) for j in range(t)] for i in range(t)])


class StandInTerms:
    """A position scheme's terms: ALiBi-like score bias -m_h |i - j| (Press et al.) and a Shaw-like value
    bias Σ_j w_ij table[clip(j - i)] (Shaw et al. Eq. 3), taking positions of any block layout."""

    def __init__(self, n_heads: int, d: int, clip: int = 2) -> None:
        gen = torch.Generator().manual_seed(7)
        self.slopes = torch.tensor([2.0 ** -(h + 1) for h in range(n_heads)], dtype=torch.float64)
        self.table = torch.randn(2 * clip + 1, d, generator=gen, dtype=torch.float64)
        self.clip = clip

    def score_bias(self, q, q_pos, k_pos):
        distance = (k_pos - q_pos).abs().to(q.dtype)  # (*S, Tq, Tk)
        return -self.slopes.to(q.dtype).view(-1, *[1] * (q.dim() - 2)) * distance  # (H, *S, Tq, Tk)

    def value_bias(self, weights, q_pos, k_pos):
        rel = (k_pos - q_pos).clamp(-self.clip, self.clip) + self.clip  # (*S, Tq, Tk)
        return (weights.unsqueeze(-1) * self.table.to(weights.dtype)[rel]).sum(dim=-2)  # (B, H, *S, Tq, D)


def full_rule(causal: bool):
    return (lambda i, j: j <= i) if causal else (lambda i, j: True)


# --- window -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("window", [10, 11, 25])
def test_window_as_wide_as_the_sequence_is_full_attention(causal, padded, window):
    q, k, v = make_qkv(2, 3, 10, 4)
    key_padding = make_padding(2, 10) if padded else None
    y = WindowAttention(window)(q, k, v, causal=causal, key_padding=key_padding)
    expected = dense_reference(q, k, v, mask_from_rule(10, full_rule(causal)), key_padding=key_padding)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-5)
    full = FullAttention()(q, k, v, causal=causal, key_padding=key_padding)
    torch.testing.assert_close(y, full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("t", "window"), [(12, 1), (12, 3), (12, 4), (13, 4), (14, 5), (7, 6)])
def test_narrow_window_matches_the_dense_reference(causal, t, window):
    q, k, v = make_qkv(2, 2, t, 4)
    key_padding = make_padding(2, t)
    if causal:  # Longformer's window, looking back: the last w keys, itself included
        rule = lambda i, j: i - window < j <= i  # noqa: E731
    else:
        rule = lambda i, j: abs(i - j) < window  # noqa: E731
    mask = mask_from_rule(t, rule)
    pattern = WindowAttention(window)
    assert torch.equal(pattern.key_mask(torch.arange(t), t, causal=causal), mask)
    for padding in (None, key_padding):
        y = pattern(q, k, v, causal=causal, key_padding=padding)
        torch.testing.assert_close(y, dense_reference(q, k, v, mask, key_padding=padding), rtol=0, atol=1e-5)


# --- BigBird ------------------------------------------------------------------------------------------


def check_bigbird_rule(mask: torch.Tensor, t: int, block: int, n_global: int, n_random: int, causal: bool) -> None:
    """Zaheer et al. Fig. 1 / App. D, block by block: every query block sees whole key blocks (cut by the
    causal mask only); its window blocks and the global blocks; exactly min(r, #candidates) more blocks,
    drawn from the candidates (causal: strictly before the window); bidirectional global queries see all."""
    nb = -(-t // block)
    rows_of = [range(n * block, min((n + 1) * block, t)) for n in range(nb)]
    for n, rows in enumerate(rows_of):
        seen = set()
        for m, cols in enumerate(rows_of):
            sub = mask[rows.start : rows.stop, cols.start : cols.stop]
            causal_ok = torch.tensor([[j <= i or not causal for j in cols] for i in rows])
            visible = bool(sub.any())
            assert torch.equal(sub, causal_ok & visible), f"query block {n} sees part of key block {m}"
            if visible:
                seen.add(m)
        window = {n - 1, n} if causal else {n - 1, n, n + 1}
        window &= set(range(nb))
        global_blocks = set(range(min(n_global, n + 1 if causal else nb)))  # causal: only those in the past
        if not causal and n < n_global:
            assert seen == set(range(nb)), f"global query block {n} must see every key"
            continue
        assert window | global_blocks <= seen, f"query block {n} misses window or global blocks"
        if causal:
            candidates = set(range(n_global, n - 1))
        else:
            candidates = {j for j in range(n_global, nb) if abs(j - n) > 1}
        extra = seen - window - global_blocks
        assert extra <= candidates
        assert len(extra) == min(n_random, len(candidates)), f"query block {n}: {sorted(extra)}"
    if causal:
        assert not torch.triu(mask, diagonal=1).any(), "a causal mask shows a future key"


BIGBIRD_CASES = [  # (T, block, global, random)
    (24, 3, 1, 1),
    (24, 3, 2, 2),
    (25, 4, 1, 2),  # T not a multiple of the block
    (24, 2, 0, 3),
    (21, 3, 1, 0),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("t", "block", "n_global", "n_random"), BIGBIRD_CASES)
def test_bigbird_mask_follows_the_paper_and_forward_matches_it(causal, t, block, n_global, n_random):
    pattern = BigBirdAttention(block, n_global, n_random, seed=5)
    mask = pattern.key_mask(torch.arange(t), t, causal=causal)
    check_bigbird_rule(mask, t, block, n_global, n_random, causal)
    assert not mask.all(), "the case should be sparse, or it tests nothing beyond full attention"
    q, k, v = make_qkv(2, 2, t, 4)
    key_padding = make_padding(2, t)
    for padding in (None, key_padding):
        y = pattern(q, k, v, causal=causal, key_padding=padding)
        torch.testing.assert_close(y, dense_reference(q, k, v, mask, key_padding=padding), rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("t", "block", "n_global"), [(18, 3, 1), (20, 3, 2), (9, 2, 0)])
def test_bigbird_covering_every_block_is_full_attention(causal, t, block, n_global):
    # Random blocks enough for every block: the window, global and random choices overlap (block 1's
    # previous block is global), so this equals full attention only when duplicates are counted once.
    pattern = BigBirdAttention(block, n_global, random_blocks=t, seed=3)
    q, k, v = make_qkv(2, 3, t, 4)
    for padding in (None, make_padding(2, t)):
        y = pattern(q, k, v, causal=causal, key_padding=padding)
        expected = dense_reference(q, k, v, mask_from_rule(t, full_rule(causal)), key_padding=padding)
        torch.testing.assert_close(y, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_bigbird_block_longer_than_the_sequence_is_full_attention(causal):
    q, k, v = make_qkv(1, 2, 5, 4)
    y = BigBirdAttention(8, 1, 1)(q, k, v, causal=causal)
    torch.testing.assert_close(y, dense_reference(q, k, v, mask_from_rule(5, full_rule(causal))), rtol=0, atol=1e-5)


def test_causal_bigbird_key_mask_does_not_depend_on_later_keys():
    # Cached decoding asks for the mask with t_k = p + 1; the full forward used t_k = T.
    pattern = BigBirdAttention(3, 1, 2, seed=11)
    t = 40
    whole = pattern.key_mask(torch.arange(t), t, causal=True)
    for p in range(t):
        q_pos = torch.arange(max(0, p - 2), p + 1)  # a few queries at a time, ending at p
        prefix = pattern.key_mask(q_pos, p + 1, causal=True)
        assert torch.equal(prefix, whole[q_pos, : p + 1])
        assert not whole[q_pos, p + 1 :].any()


def test_causal_bigbird_forward_on_a_prefix_equals_the_prefix_of_the_forward():
    pattern = BigBirdAttention(2, 1, 1, seed=2)
    q, k, v = make_qkv(1, 2, 23, 4)
    whole = pattern(q, k, v, causal=True)
    for p in (5, 12, 17):
        prefix = pattern(q[:, :, :p], k[:, :, :p], v[:, :, :p], causal=True)
        torch.testing.assert_close(prefix, whole[:, :, :p], rtol=0, atol=1e-12)


def test_bigbird_random_blocks_follow_the_seed():
    t = 60
    masks = [BigBirdAttention(3, 1, 2, seed=s).key_mask(torch.arange(t), t, causal=False) for s in (0, 0, 1)]
    assert torch.equal(masks[0], masks[1])
    assert not torch.equal(masks[0], masks[2])


# --- Linformer ----------------------------------------------------------------------------------------


def test_linformer_with_identity_projections_is_full_attention():
    t = 9
    pattern = LinformerAttention(max_len=t, k=t)
    with torch.no_grad():
        pattern.E.copy_(torch.eye(t))
        pattern.F.copy_(torch.eye(t))
    q, k, v = make_qkv(2, 3, t, 4, dtype=torch.float32)
    y = pattern(q, k, v, causal=False)
    torch.testing.assert_close(y, dense_reference(q, k, v, mask_from_rule(t, full_rule(False))), rtol=0, atol=1e-5)


def test_linformer_projects_keys_and_values_along_the_sequence():
    # T < max_len: the first T columns of E and F; padding keys and values zeroed before projecting.
    pattern = LinformerAttention(max_len=12, k=4)
    q, k, v = make_qkv(2, 2, 7, 4, dtype=torch.float32)
    key_padding = make_padding(2, 7)
    y = pattern(q, k, v, causal=False, key_padding=key_padding)
    real = key_padding[:, None, :, None].float()
    e, f = pattern.E.detach()[:, :7], pattern.F.detach()[:, :7]
    k_proj = torch.einsum("ct,bhtd->bhcd", e, k * real)
    v_proj = torch.einsum("ct,bhtd->bhcd", f, v * real)
    weights = torch.softmax(q @ k_proj.transpose(-2, -1) / 2.0, dim=-1)  # √D = 2
    torch.testing.assert_close(y, weights @ v_proj, rtol=0, atol=1e-5)


def test_linformer_refuses_causal_long_sequences_position_biases_and_key_masks():
    pattern = LinformerAttention(max_len=8, k=4)
    q, k, v = make_qkv(1, 2, 8, 4, dtype=torch.float32)
    assert not LinformerAttention.causal_ok
    with pytest.raises(ValueError, match="causal model cannot use it"):
        pattern(q, k, v, causal=True)
    with pytest.raises(ValueError, match="causal"):
        pattern.check(4, causal=True)
    q9, k9, v9 = make_qkv(1, 2, 9, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match="max_len=8"):
        pattern(q9, k9, v9, causal=False)
    with pytest.raises(ValueError, match="no positions"):
        pattern(q, k, v, causal=False, terms=StandInTerms(2, 4))
    with pytest.raises(ValueError, match="no key mask"):
        pattern.key_mask(torch.arange(3), 8, causal=False)


# --- position terms, gradients ------------------------------------------------------------------------

SPARSE_CASES = [  # (pattern, T)
    (lambda: WindowAttention(3), 11),
    (lambda: WindowAttention(4), 16),
    (lambda: BigBirdAttention(3, 1, 1, seed=4), 20),
    (lambda: BigBirdAttention(4, 2, 1, seed=4), 26),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("make", "t"), SPARSE_CASES)
def test_position_terms_see_the_true_positions_inside_blocks(make, t, causal):
    pattern = make()
    q, k, v = make_qkv(2, 3, t, 4)
    terms = StandInTerms(n_heads=3, d=4)
    mask = pattern.key_mask(torch.arange(t), t, causal=causal)
    key_padding = make_padding(2, t)
    y = pattern(q, k, v, causal=causal, key_padding=key_padding, terms=terms)
    expected = dense_reference(q, k, v, mask, key_padding=key_padding, terms=terms)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_full_attention_with_terms_matches_the_dense_reference(causal):
    q, k, v = make_qkv(2, 3, 9, 4)
    terms = StandInTerms(n_heads=3, d=4)
    y = FullAttention()(q, k, v, causal=causal, terms=terms)
    expected = dense_reference(q, k, v, mask_from_rule(9, full_rule(causal)), terms=terms)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("make", "t"), SPARSE_CASES)
def test_gradients_equal_the_dense_reference(make, t, causal):
    pattern = make()
    mask = pattern.key_mask(torch.arange(t), t, causal=causal)
    terms = StandInTerms(n_heads=2, d=4)
    upstream = torch.randn(1, 2, t, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    grads = []
    for run in (pattern, lambda q, k, v: dense_reference(q, k, v, mask, terms=terms)):
        q, k, v = make_qkv(1, 2, t, 4, grad=True)
        y = run(q, k, v, causal=causal, terms=terms) if run is pattern else run(q, k, v)
        (y * upstream).sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    for got, expected in zip(*grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["full", "window", "bigbird"])
def test_dropout_reaches_the_weights(name):
    # p = 1 drops every weight: the output is zero (a dropout applied elsewhere, or not at all, is not).
    pattern = build_pattern(
        name, n_heads=2, head_dim=4, max_len=16, window=3, block=4, global_blocks=1, random_blocks=1, linformer_k=4
    )
    q, k, v = make_qkv(1, 2, 16, 4, dtype=torch.float32)
    assert pattern(q, k, v, causal=False, dropout_p=1.0).abs().max() == 0
    assert pattern(q, k, v, causal=False, dropout_p=0.0).abs().max() > 0


# --- memory: no (T, T) tensor -------------------------------------------------------------------------


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel())
        return out


def largest_tensor(pattern, t: int, causal: bool, terms=None) -> int:
    q, k, v = make_qkv(1, 2, t, 8, dtype=torch.float32, grad=True)
    with LargestTensor() as record:
        pattern(q, k, v, causal=causal, terms=terms).sum().backward()
    return record.largest


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pattern", [WindowAttention(64), BigBirdAttention(64, 1, 1)], ids=["window", "bigbird"])
def test_no_tensor_grows_as_t_squared(pattern, causal):
    t, bh = 4096, 2
    assert largest_tensor(pattern, t, causal) < bh * t * t / 4


def test_the_memory_probe_sees_a_t_squared_tensor():
    # The probe of the test above, on full attention's formula (with position terms): it must fire.
    t = 512
    assert largest_tensor(FullAttention(), t, causal=True, terms=StandInTerms(2, 8)) >= 2 * t * t / 4


# --- registry and bad input ---------------------------------------------------------------------------

BUILD_ARGS = dict(n_heads=2, head_dim=4, max_len=32, window=4, block=4, global_blocks=1, random_blocks=1, linformer_k=8)


def test_build_pattern_makes_each_registered_pattern():
    assert set(PATTERNS) == {"full", "window", "bigbird", "linformer"}
    for name, cls in PATTERNS.items():
        pattern = build_pattern(name, **BUILD_ARGS, seed=3)
        assert type(pattern) is cls
    assert build_pattern("window", **BUILD_ARGS).window == 4
    bigbird = build_pattern("bigbird", **BUILD_ARGS, seed=3)
    assert (bigbird.block, bigbird.global_blocks, bigbird.random_blocks, bigbird.seed) == (4, 1, 1, 3)
    assert build_pattern("linformer", **BUILD_ARGS).E.shape == (8, 32)
    assert [cls.causal_ok for cls in PATTERNS.values()] == [True, True, True, False]


@pytest.mark.parametrize(
    ("name", "changes", "match"),
    [
        ("dense", {}, r"choose one of \['bigbird', 'full', 'linformer', 'window'\]"),
        ("window", {"window": 0}, "window must be a positive"),
        ("window", {"window": -3}, "window must be a positive"),
        ("bigbird", {"block": 0}, "block must be a positive"),
        ("bigbird", {"global_blocks": -1}, "must be >= 0"),
        ("bigbird", {"random_blocks": -1}, "must be >= 0"),
        ("linformer", {"linformer_k": 0}, "k > 0"),
        ("linformer", {"max_len": 0}, "max_len > 0"),
    ],
)
def test_bad_options_raise_value_errors(name, changes, match):
    with pytest.raises(ValueError, match=match):
        build_pattern(name, **{**BUILD_ARGS, **changes})


def test_bad_inputs_raise_value_errors():
    pattern = WindowAttention(3)
    q, k, v = make_qkv(2, 2, 6, 4)
    with pytest.raises(ValueError, match=r"\(B, H, T, D\)"):
        pattern(q, k[:, :, :5], v, causal=True)
    with pytest.raises(ValueError, match="key_padding must be bool"):
        pattern(q, k, v, causal=True, key_padding=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding must be bool"):
        pattern(q, k, v, causal=True, key_padding=torch.ones(2, 6))
    with pytest.raises(ValueError, match="t_k"):
        BigBirdAttention(2, 1, 1).key_mask(torch.arange(5), 4, causal=True)
