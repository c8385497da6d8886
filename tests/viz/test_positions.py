"""The positions picture: the table drawn is §3.5's, the dot products depend on the offset only
(checked against Σ_i cos(k ω_i), the identity that says why), and the PNG has its stated size."""

import math

import numpy as np
import pytest

from attnlab.errors import UserError
from attnlab.viz.figure import DPI, png_size
from attnlab.viz.positions import HEIGHT_IN, WIDTH_IN, plot_positions

pytest.importorskip("matplotlib")


def test_table_and_dot_products(tmp_path):
    d_model, n = 16, 40
    plot = plot_positions(d_model, n, tmp_path / "positions.png")

    expected = np.zeros((n, d_model))
    for pos in range(n):  # the formula of §3.5, element by element
        for i in range(d_model // 2):
            expected[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / d_model))
            expected[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / d_model))
    np.testing.assert_allclose(plot.table, expected, atol=1e-6)

    assert sorted(plot.dots) == [0, 10, 20] and list(plot.offsets) == list(range(n - 20))
    omegas = np.array([10000 ** (-2 * i / d_model) for i in range(d_model // 2)])
    relative = np.cos(np.outer(plot.offsets, omegas)).sum(axis=1)  # sin a sin b + cos a cos b = cos(a - b)
    for dot in plot.dots.values():
        np.testing.assert_allclose(dot, relative, atol=1e-5)
    assert plot.dots[0][0] == pytest.approx(d_model / 2, abs=1e-5)  # |PE[p]|² = d/2


def test_png_has_the_stated_size(tmp_path):
    plot = plot_positions(128, 100, tmp_path / "positions.png")
    assert png_size(plot.path) == plot.size == (round(WIDTH_IN * DPI), round(HEIGHT_IN * DPI))
    import matplotlib.image

    image = matplotlib.image.imread(plot.path)  # decodes: a real image, not just a header
    assert image.shape[:2] == (plot.size[1], plot.size[0])


def test_bad_arguments(tmp_path):
    with pytest.raises(UserError, match=r"\.png"):
        plot_positions(16, 10, tmp_path / "p.svg")
    with pytest.raises(ValueError, match="d_model >= 2"):
        plot_positions(1, 10, tmp_path / "p.png")
