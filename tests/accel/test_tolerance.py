"""tests/tolerance.py: the float32 bound that the C++ and oneDNN comparisons state."""

import pytest
import torch

from tolerance import UNIT_ROUNDOFF, assert_float32_close, float32_factor, layer_depth


def test_sums_in_three_orders_stay_inside_the_bound_and_their_float64_value_too():
    """The bound's premise, checked: the same dot products of n = 4096 terms summed in float32
    forward, backward and by PyTorch's blocked kernel differ from each other and from the float64
    sum by less than one sum's bound, over values of mixed signs and of one sign."""
    generator = torch.Generator().manual_seed(0)
    n = 4096
    for shift in (0.0, 1.0):  # mixed signs, and mostly positive terms (no cancellation)
        a = torch.randn(200, n, generator=generator) + shift
        b = torch.randn(200, n, generator=generator)
        exact = (a.double() * b.double()).sum(-1)
        terms = a * b
        forward = torch.stack([torch.cumsum(t, 0)[-1] for t in terms])
        backward = torch.stack([torch.cumsum(t.flip(0), 0)[-1] for t in terms])
        blocked = (a * b).sum(-1)
        for got in (forward, backward, blocked):
            assert_float32_close(got, blocked, reduction=n)
            assert_float32_close(got.double(), exact, reduction=n)


def test_the_factor_is_twice_lambda_n_u_per_chained_sum():
    assert float32_factor(100) == pytest.approx(2 * 6 * 100 * 2.0**-24)
    assert float32_factor(100, depth=3) == pytest.approx(3 * float32_factor(100))
    assert UNIT_ROUNDOFF == torch.finfo(torch.float32).eps / 2
    assert layer_depth(2) == 18
    with pytest.raises(ValueError, match="count terms"):
        float32_factor(0)


def test_one_term_too_many_or_too_few_is_outside_the_bound():
    """A sum that drops or repeats one of its 4096 terms is a mistake, and fails the comparison."""
    generator = torch.Generator().manual_seed(1)
    a, b = torch.randn(50, 4096, generator=generator), torch.randn(50, 4096, generator=generator)
    full = (a * b).sum(-1)
    with pytest.raises(AssertionError, match="float32 bound"):
        assert_float32_close((a * b)[:, 1:].sum(-1), full, reduction=4096)
    with pytest.raises(AssertionError, match="float32 bound"):
        assert_float32_close(full + (a * b)[:, -1], full, reduction=4096)
