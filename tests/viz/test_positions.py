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


def test_fourier_picture_queries_find_the_key_d_back(tmp_path):
    from attnlab.viz.positions import plot_scheme

    plot = plot_scheme("fourier", tmp_path / "f.png", d_model=32, n_positions=40, shift=5)
    expected = np.array(
        [[f(math.pi * k * t / 40) for k in range(1, 17) for f in (math.cos, math.sin)] for t in range(40)]
    )
    np.testing.assert_allclose(plot.heatmap, expected, atol=1e-6)  # the lecture's e_t, written out
    for label, scores in plot.curves.items():
        t = int(label.rsplit("= ", 1)[1])
        assert int(np.argmax(scores)) == t - 5, label


def test_alibi_picture_has_the_paper_slopes(tmp_path):
    from attnlab.viz.positions import plot_scheme

    plot = plot_scheme("alibi", tmp_path / "a.png", n_heads=4, n_positions=10)
    for h, curve in enumerate(plot.curves.values()):  # four heads: 2^-2, 2^-4, 2^-6, 2^-8
        np.testing.assert_allclose(curve, -(2.0 ** (-2 * (h + 1))) * np.arange(10))
    assert np.isnan(plot.heatmap[0, 1]) and plot.heatmap[9, 0] == pytest.approx(-0.25 * 9)


def test_rope_picture_dot_products_follow_the_offset_alone(tmp_path):
    from attnlab.viz.positions import plot_scheme

    d = 16
    plot = plot_scheme("rope", tmp_path / "r.png", d_model=d, n_positions=40)
    thetas = np.array([10000 ** (-2 * i / d) for i in range(d // 2)])
    closed_form = 2 * np.cos(np.outer(plot.offsets, thetas)).sum(axis=1)  # q = 1: each pair gives 2 cos(k θ_i)
    assert len(plot.curves) == 3
    for curve in plot.curves.values():
        np.testing.assert_allclose(curve, closed_form, atol=1e-4)


def test_relative_picture_is_the_clipped_offset(tmp_path):
    from attnlab.viz.positions import plot_scheme

    plot = plot_scheme("relative", tmp_path / "s.png", n_positions=12, max_distance=3)
    for i in range(12):
        for j in range(12):
            assert plot.heatmap[i, j] == max(-3, min(3, j - i))


def test_positions_cli_draws_each_kind_and_refuses_bad_ones(tmp_path, capsys):
    from helpers import assert_user_error, cli

    for kind in ("fourier", "rope", "alibi", "relative"):
        code, out, _ = cli(capsys, "positions", "--kind", kind, "--out", str(tmp_path / f"{kind}.png"))
        assert code == 0 and kind in out and png_size(tmp_path / f"{kind}.png") == (1650, 630)
    assert_user_error(cli(capsys, "positions", "--kind", "rotary", "--out", str(tmp_path / "x.png")), "rotary", "rope")
    assert_user_error(cli(capsys, "positions", "--kind", "rope", "--d-model", "7", "--out", str(tmp_path / "y.png")))
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "y.png").exists()


def test_draw_positions_checks_the_request_and_takes_each_schemes_defaults(tmp_path):
    from attnlab.viz.positions import PositionsPlot, SchemePlot, draw_positions

    sinusoidal = draw_positions("sinusoidal", tmp_path / "s.png")
    assert isinstance(sinusoidal, PositionsPlot) and sinusoidal.table.shape == (100, 128)
    alibi = draw_positions("alibi", tmp_path / "a.png", n_heads=4)
    assert isinstance(alibi, SchemePlot) and alibi.n_positions == 64 and alibi.path.exists()
    for kind, kwargs, fragment in [
        ("ropee", {}, "did you mean 'rope'"),
        ("rope", {"d_model": 5}, "must be even"),
        ("fourier", {"n_positions": 3}, "--shift 3 must be below --n 3"),
        ("relative", {"n_positions": 1}, ">= 2"),
    ]:
        with pytest.raises(UserError, match=fragment):
            draw_positions(kind, tmp_path / "x.png", **kwargs)
    assert not (tmp_path / "x.png").exists()
