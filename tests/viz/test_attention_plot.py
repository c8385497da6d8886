"""Attention pictures: real PNG files, sized to the tokens, validated inputs, atomic writes."""

import sys
from importlib.util import find_spec

import numpy as np
import pytest
import torch

from attnlab.errors import UserError
from attnlab.viz import display_token, plot_alignment, plot_heads
from attnlab.viz.figure import PNG_SIGNATURE, png_size

pytestmark = pytest.mark.slow

needs_matplotlib = pytest.mark.skipif(find_spec("matplotlib") is None, reason="pip install 'attnlab[plot]'")


def random_weights(*shape: int, seed: int = 0) -> np.ndarray:
    """Softmax of random scores: every row sums to 1, as attention weights do."""
    scores = np.random.default_rng(seed).standard_normal(shape)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


def tokens(n: int, stem: str = "Ġtok") -> list[str]:
    return [f"{stem}{i}" for i in range(n)]


@needs_matplotlib
@pytest.mark.filterwarnings("error")  # e.g. matplotlib's "Glyph ... missing from font"
@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "torch"])
def test_alignment_writes_png(tmp_path, as_tensor):
    weights = random_weights(5, 7)
    assert np.allclose(weights.sum(axis=1), 1.0)
    if as_tensor:
        weights = torch.from_numpy(weights).to(torch.bfloat16)
    source = ["ĠZwei", "Ġjunge", "ĠMänner", "Ġim", "ĠFreien", ".", "</s>"]
    target = ["ĠTwo", "Ġyoung", "Ġmen", "Ġoutside", "."]
    path = tmp_path / "align.png"

    returned = plot_alignment(weights, source, target, path, title="de → en")

    assert returned == path
    width, height = png_size(path)
    assert width > 100 and height > 100


@needs_matplotlib
def test_picture_grows_with_tokens(tmp_path):
    small = plot_alignment(random_weights(2, 3), tokens(3), tokens(2), tmp_path / "small.png")
    wide = plot_alignment(random_weights(2, 12), tokens(12), tokens(2), tmp_path / "wide.png")
    tall = plot_alignment(random_weights(12, 3), tokens(3), tokens(12), tmp_path / "tall.png")
    (w_small, h_small), (w_wide, _), (_, h_tall) = map(png_size, (small, wide, tall))
    assert w_wide > w_small + 200  # 9 more columns of about 0.3 in at 150 dpi
    assert h_tall > h_small + 200


@pytest.mark.parametrize(
    ("shape", "n_target", "n_source"),
    [((7, 5), 5, 7), ((5,), 5, 7), ((1, 5, 7), 5, 7), ((5, 6), 5, 7)],
)
def test_alignment_shape_mismatch_names_both_shapes(tmp_path, shape, n_target, n_source):
    with pytest.raises(ValueError) as info:
        plot_alignment(np.zeros(shape), tokens(n_source), tokens(n_target), tmp_path / "a.png")
    message = str(info.value)
    assert str(shape) in message
    assert str((n_target, n_source)) in message
    assert list(tmp_path.iterdir()) == []


def test_alignment_needs_a_token_on_each_side(tmp_path):
    with pytest.raises(ValueError, match="at least one token"):
        plot_alignment(np.zeros((0, 3)), tokens(3), [], tmp_path / "a.png")


@pytest.mark.parametrize("name", ["a.jpg", "a.pdf", "a", "a.png.txt"])
def test_path_must_be_png(tmp_path, name):
    with pytest.raises(UserError, match=r"\.png"):
        plot_alignment(random_weights(2, 2), tokens(2), tokens(2), tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_parent_folder_must_exist(tmp_path):
    missing = tmp_path / "no" / "such" / "folder"
    with pytest.raises(UserError, match="folder"):
        plot_alignment(random_weights(2, 2), tokens(2), tokens(2), missing / "a.png")
    with pytest.raises(UserError, match="folder"):
        plot_heads(random_weights(2, 2, 2), tokens(2), missing / "h.png")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("token", "shown"),
    [
        ("cat", "cat"),
        ("Ġworld", "▁world"),
        ("ĠĠ", "▁▁"),
        (" the", "▁the"),  # a literal space would be an invisible label
        ("Ċ", "\\n"),  # byte-level BPE's newline
        ("\n", "\\n"),
        ("a\nb", "a\\nb"),
        ("\t\r", "\\t\\r"),
        ("</s>", "</s>"),
        ("", ""),
    ],
)
def test_display_token(token, shown):
    assert display_token(token) == shown
    assert "\n" not in display_token(token)


@needs_matplotlib
def test_heads_grid_writes_png(tmp_path):
    words = ["ĠTo", "Ġbe", ",", "Ġor", "Ġnot"]
    path = plot_heads(torch.from_numpy(random_weights(4, 5, 5)), words, tmp_path / "heads.png", title="layer 0")
    width, height = png_size(path)
    # 2 x 2 panels of 5 x 5 cells: more than twice one alignment picture of the same tokens.
    single = png_size(plot_alignment(random_weights(5, 5), words, words, tmp_path / "one.png"))
    assert width > 1.5 * single[0] and height > 1.5 * single[1]


@needs_matplotlib
def test_heads_cross_attention_labels_queries_separately(tmp_path):
    source, target = tokens(6, "Ġs"), tokens(3, "Ġt")
    width, height = png_size(plot_heads(random_weights(3, 3, 6), source, tmp_path / "cross.png", query_tokens=target))
    # The rows are the 3 queries, not the 6 keys: shorter than the self-attention grid of the keys.
    _, self_height = png_size(plot_heads(random_weights(3, 6, 6), source, tmp_path / "self.png"))
    assert height < self_height
    # And they carry the query words: longer query labels widen the left margin, the keys unchanged.
    long_target = [f"Ġ{'query' * 6}{i}" for i in range(3)]
    long_width, _ = png_size(
        plot_heads(random_weights(3, 3, 6), source, tmp_path / "long.png", query_tokens=long_target)
    )
    assert long_width > width


def test_heads_shape_mismatch(tmp_path):
    with pytest.raises(ValueError, match=r"\(4, 5, 6\).*\(H, 5, 5\)"):
        plot_heads(np.zeros((4, 5, 6)), tokens(5), tmp_path / "h.png")
    with pytest.raises(ValueError, match=r"\(5, 5\)"):  # one head's weights: the head axis is missing
        plot_heads(np.zeros((5, 5)), tokens(5), tmp_path / "h.png")


@needs_matplotlib
def test_overwrite_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "align.png"
    path.write_bytes(b"an older picture")
    plot_alignment(random_weights(2, 3), tokens(3), tokens(2), path)
    first = path.read_bytes()
    assert first.startswith(PNG_SIGNATURE)
    plot_alignment(random_weights(4, 3), tokens(3), tokens(4), path)
    assert path.read_bytes() != first
    assert list(tmp_path.iterdir()) == [path]  # hidden temporary files included


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules makes `import` fail
    with pytest.raises(UserError, match=r"pip install 'attnlab\[plot\]'"):
        plot_alignment(random_weights(2, 2), tokens(2), tokens(2), tmp_path / "a.png")
    assert list(tmp_path.iterdir()) == []
