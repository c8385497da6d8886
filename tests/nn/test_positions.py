"""Positional encodings: the sinusoidal table of Vaswani et al. §3.5, and choosing an encoding by name."""

import math

import pytest
import torch
from torch import nn

from attnlab.nn import (
    INPUT_POSITIONS,
    LearnedPositions,
    NoPositions,
    SinusoidalPositions,
    build_positions,
    sinusoidal_positions,
)


def reference_sinusoidal(n_positions: int, d_model: int) -> list[list[float]]:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)), one entry at a time."""
    table = []
    for pos in range(n_positions):
        row = []
        for j in range(d_model):
            two_i = j - (j % 2)
            angle = pos / 10000 ** (two_i / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        table.append(row)
    return table


@pytest.mark.parametrize("d_model", [1, 2, 5, 8, 16])
@pytest.mark.parametrize("n_positions", [1, 50])
def test_sinusoidal_table_equals_formula(n_positions, d_model):
    table = sinusoidal_positions(n_positions, d_model)
    assert table.shape == (n_positions, d_model)
    assert table.dtype == torch.float32
    expected = torch.tensor(reference_sinusoidal(n_positions, d_model), dtype=torch.float64)
    torch.testing.assert_close(table.double(), expected, rtol=0.0, atol=1e-6)


def test_sinusoidal_table_worked_values():
    # d = 4: frequencies 1 and 1/100. Position 0 is (0, 1, 0, 1) for every d.
    table = sinusoidal_positions(3, 4)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    expected_row2 = [math.sin(2.0), math.cos(2.0), math.sin(0.02), math.cos(0.02)]
    torch.testing.assert_close(table[2].double(), torch.tensor(expected_row2, dtype=torch.float64), rtol=0, atol=1e-7)


@pytest.mark.parametrize("d_model", [8, 16])
@pytest.mark.parametrize("k", [0, 1, 3, 10])
def test_sinusoidal_dot_product_depends_only_on_offset(d_model, k):
    # sin(a p) sin(a (p + k)) + cos(a p) cos(a (p + k)) = cos(a k) for each frequency a.
    table = sinusoidal_positions(64, d_model).double()
    closed_form = sum(math.cos(k / 10000 ** (two_i / d_model)) for two_i in range(0, d_model, 2))
    for p in [0, 1, 7, 20, 40, 53]:
        dot = float(table[p] @ table[p + k])
        assert dot == pytest.approx(closed_form, abs=1e-5), f"p={p}"


@pytest.mark.parametrize(
    ("kind", "cls"),
    [("learned", LearnedPositions), ("sinusoidal", SinusoidalPositions), ("none", NoPositions)],
)
def test_build_positions_by_name(kind, cls):
    module = build_positions(kind, 10, 6)
    assert type(module) is cls
    assert INPUT_POSITIONS[kind] is cls
    out = module(torch.arange(4))
    assert out.shape == (4, 6)


def test_build_positions_unknown_name_raises():
    with pytest.raises(ValueError, match="rotary"):
        build_positions("rotary", 10, 6)


def test_learned_positions_have_parameters_sinusoidal_none():
    learned = build_positions("learned", 10, 6)
    assert sum(p.numel() for p in learned.parameters()) == 10 * 6
    assert all(p.requires_grad for p in learned.parameters())
    sinusoidal = build_positions("sinusoidal", 10, 6)
    assert list(sinusoidal.parameters()) == []
    assert list(build_positions("none", 10, 6).parameters()) == []


def test_learned_positions_look_up_rows():
    torch.manual_seed(0)
    learned = build_positions("learned", 10, 6)
    weight = next(learned.parameters())
    positions = torch.tensor([3, 0, 9])
    assert torch.equal(learned(positions), weight[positions])


def test_sinusoidal_module_returns_table_rows():
    module = build_positions("sinusoidal", 12, 6)
    positions = torch.tensor([5, 6, 7])
    assert torch.equal(module(positions), sinusoidal_positions(12, 6)[5:8])


@pytest.mark.parametrize("kind", sorted(INPUT_POSITIONS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_positions_follow_module_dtype(kind, dtype):
    # Adding float32 vectors to a bf16 model's embeddings would promote its activations to float32.
    torch.manual_seed(0)
    module = build_positions(kind, 12, 6).to(dtype)
    out = module(torch.arange(3))
    assert out.dtype == dtype and out.shape == (3, 6)


def test_no_positions_are_zero():
    module = build_positions("none", 10, 6)
    assert isinstance(module, nn.Module)
    assert torch.equal(module(torch.arange(5)), torch.zeros(5, 6))
    assert module(torch.arange(6).view(2, 3)).shape == (2, 3, 6)
    assert module.state_dict() == {}
