"""Masks: one convention everywhere, a bool tensor with `True` = may attend."""

import pytest
import torch

from attnlab.nn import causal_mask, padding_mask, padding_mask_from_ids

T, F = True, False


@pytest.mark.parametrize(
    ("t_q", "t_k", "expected"),
    [
        (1, None, [[T]]),
        (3, None, [[T, F, F], [T, T, F], [T, T, T]]),
        (3, 3, [[T, F, F], [T, T, F], [T, T, T]]),
        # t_k > t_q: the queries are the last t_q positions of a length-t_k sequence (KV cache).
        (2, 4, [[T, T, T, F], [T, T, T, T]]),
        (1, 4, [[T, T, T, T]]),
        (3, 5, [[T, T, T, F, F], [T, T, T, T, F], [T, T, T, T, T]]),
    ],
)
def test_causal_mask_exact_values(t_q, t_k, expected):
    mask = causal_mask(t_q, t_k)
    assert mask.dtype == torch.bool
    assert mask.tolist() == expected


def test_causal_mask_matches_lower_triangle():
    for t in range(1, 9):
        assert torch.equal(causal_mask(t), torch.ones(t, t).tril().bool())


def test_causal_mask_rejects_fewer_keys_than_queries():
    with pytest.raises(ValueError, match="t_k"):
        causal_mask(3, 2)


@pytest.mark.parametrize(
    ("lengths", "max_len", "expected"),
    [
        ([2, 3], None, [[T, T, F], [T, T, T]]),
        ([2, 3], 5, [[T, T, F, F, F], [T, T, T, F, F]]),
        ([1], 1, [[T]]),
        ([0, 2], 2, [[F, F], [T, T]]),
    ],
)
def test_padding_mask_values_and_shape(lengths, max_len, expected):
    mask = padding_mask(torch.tensor(lengths), max_len)
    n_keys = len(expected[0])
    assert mask.dtype == torch.bool
    assert mask.shape == (len(lengths), 1, 1, n_keys)  # broadcasts over heads and queries
    assert mask[:, 0, 0, :].tolist() == expected


def test_padding_mask_broadcasts_to_scores():
    mask = padding_mask(torch.tensor([1, 3]), 3)
    scores = torch.zeros(2, 4, 5, 3)  # (B, H, Tq, Tk)
    assert (scores.masked_fill(~mask, 1.0)).shape == scores.shape
    assert torch.equal(scores.masked_fill(~mask, 1.0)[1], torch.zeros(4, 5, 3))
    assert torch.equal(scores.masked_fill(~mask, 1.0)[0, :, :, 1:], torch.ones(4, 5, 2))


def test_padding_mask_from_ids():
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 9]])
    mask = padding_mask_from_ids(ids, pad_id=0)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[:, 0, 0, :].tolist() == [[T, T, F, F], [T, F, T, T]]
