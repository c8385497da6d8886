"""Attention maps as pictures: one alignment matrix, or every head of a layer in a grid.

Shape legend: H heads, T target (query) tokens, S source (key) tokens, Tq queries, Tk keys.
Rows are the tokens doing the attending (queries, target words), columns the tokens attended to
(keys, source words); each row of softmax weights sums to 1.

matplotlib is an optional extra (`pip install 'attnlab[plot]'`), imported only when a picture is
drawn. We draw on a bare `Figure` with the Agg canvas rather than through `pyplot`: no global
backend switch, no figure registry to leak from, and it works on a machine without a display.

References:
- Bahdanau, Cho & Bengio, "Neural Machine Translation by Jointly Learning to Align and
  Translate" (2015), Figure 3: the alignment picture, source words along the top, target words
  down the side, one cell per (target, source) weight.
- Vaswani et al., "Attention Is All You Need" (2017), Figures 3-5: one panel per head.
"""

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from attnlab.viz.figure import check_png_path, new_figure, save_png
from attnlab.viz.maps import AttentionMaps

CMAP = "viridis"  # perceptually uniform, and still ordered when printed in grey
CELL_IN = 0.3  # inches per token in an alignment picture: room for a 9 pt label beside each cell
FONT_PT = 9.0
X_ROTATION = 60  # source labels on the top axis: steep enough to pack 60 tokens, shallow enough to read

# Byte-level BPE (GPT-2, RoBERTa) spells some bytes as printable stand-ins: "Ġ" is a space, "Ċ" a newline.
_DISPLAY = str.maketrans({"Ġ": "▁", " ": "▁", "Ċ": "\\n", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def display_token(token: str) -> str:
    """A token as a one-line axis label.

    A space, whether literal or byte-level BPE's "Ġ", becomes "▁" (SentencePiece's mark) so it stays
    visible; newlines, carriage returns and tabs are escaped, byte-level "Ċ" included.
    `"Ġworld" -> "▁world"`, `"\\n" -> "\\\\n"`, `"Ċ" -> "\\\\n"`, `"cat" -> "cat"`.
    """
    return token.translate(_DISPLAY)


def draw_alignment(task, model: torch.nn.Module, source_ids: Sequence[int], out: str | Path, device, **search) -> Path:
    """`attnlab translate --attention PNG`: a translation task's decoder cross-attention over one
    source sentence (its ids) while `model` translates it (`task.align`, with the beam `search`
    settings), drawn as a heatmap in `out`."""
    from attnlab.errors import UserError

    if not source_ids:
        raise UserError("the first input line is empty: there is no alignment to draw")
    found = task.align(model, list(source_ids), device, **search)
    plot_alignment(found.weights, found.source_tokens, found.target_tokens, out, title="decoder cross-attention")
    return Path(out)


def plot_alignment(
    weights: np.ndarray | torch.Tensor,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    path: str | Path,
    *,
    title: str | None = None,
    axis_labels: tuple[str, str] = ("source", "target"),
) -> Path:
    """Save the alignment heatmap of `weights (T, S)` as a PNG and return its path.

    Row t holds how much target token t attends to each source token (float, any dtype; numpy or
    torch on any device). Source tokens run along the top, target tokens down the left; the
    picture grows with the number of tokens so each label has a cell's width. Weights in [0, 1]
    are drawn on a fixed 0..1 scale, so two pictures' colours mean the same probability.
    `axis_labels` name the columns and the rows (self-attention: keys and queries).
    Raises `ValueError` if the shape does not match the tokens, `UserError` for a bad path.
    """
    path = check_png_path(path)
    w = _as_array(weights)
    expected = (len(target_tokens), len(source_tokens))
    if w.ndim != 2 or w.shape != expected:
        raise ValueError(
            f"weights have shape {tuple(w.shape)} but {len(target_tokens)} target and {len(source_tokens)} "
            f"source tokens need shape (T, S) = {expected}"
        )
    _check_not_empty(expected)
    n_tgt, n_src = expected
    left, top = _label_margins(source_tokens, target_tokens, FONT_PT)
    width = left + n_src * CELL_IN + 1.2  # + colourbar and its tick labels
    height = top + n_tgt * CELL_IN + (0.4 if title else 0.1)
    fig = new_figure(max(width, 2.5), max(height, 1.8))
    ax = fig.add_subplot()
    image = _draw(ax, w, source_tokens, target_tokens, FONT_PT)
    ax.set_xlabel(axis_labels[0], fontsize=FONT_PT)
    ax.set_ylabel(axis_labels[1], fontsize=FONT_PT)
    bar = fig.colorbar(image, ax=ax, shrink=min(1.0, max(0.4, n_tgt / 8)), aspect=max(5, min(20, 2.5 * n_tgt)))
    bar.ax.tick_params(labelsize=FONT_PT)
    if title:
        ax.set_title(title, fontsize=FONT_PT + 2)
    save_png(fig, path)
    return path


def plot_heads(
    weights: np.ndarray | torch.Tensor,
    tokens: Sequence[str],
    path: str | Path,
    *,
    query_tokens: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Save every head of one layer, `weights (H, Tq, Tk)`, as a grid of heatmaps in one PNG.

    `tokens` label the keys (columns); `query_tokens` label the queries (rows) and default to
    `tokens`, which is self-attention. For cross-attention pass the source as `tokens` and the
    target as `query_tokens`. Panels are titled "head 0", "head 1", ... and share one colour scale,
    so heads can be compared cell by cell. Take one example of a batch first: `weights[b]` of the
    `(B, H, Tq, Tk)` that `MultiHeadAttention` returns. Raises `ValueError` for a shape that does
    not match the tokens, `UserError` for a bad path.
    """
    path = check_png_path(path)
    w = _as_array(weights)
    query_tokens = tokens if query_tokens is None else query_tokens
    if w.ndim != 3 or w.shape[1:] != (len(query_tokens), len(tokens)):
        raise ValueError(
            f"weights have shape {tuple(w.shape)} but {len(query_tokens)} query and {len(tokens)} key tokens need "
            f"shape (H, Tq, Tk) = (H, {len(query_tokens)}, {len(tokens)})"
        )
    n_heads = w.shape[0]
    _check_not_empty((n_heads, len(query_tokens), len(tokens)))
    n_query, n_key = w.shape[1:]
    n_cols = math.ceil(math.sqrt(n_heads))
    n_rows = math.ceil(n_heads / n_cols)
    # Keep the whole grid within about 16 inches across: smaller cells and labels for more heads.
    cell = min(CELL_IN, max(0.12, 16 / (n_cols * max(n_key, n_query))))
    font = min(FONT_PT, max(5.0, 0.8 * cell * 72))
    left, top = _label_margins(tokens, query_tokens, font)
    width = n_cols * (left + n_key * cell + 0.2) + 1.0
    height = n_rows * (top + n_query * cell + 0.35) + (0.4 if title else 0.1)
    fig = new_figure(max(width, 2.5), max(height, 1.8))
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
    for h, ax in enumerate(axes):
        if h >= n_heads:
            ax.set_axis_off()
            continue
        image = _draw(ax, w[h], tokens, query_tokens, font)
        ax.set_title(f"head {h}", fontsize=font + 1)
    bar = fig.colorbar(image, ax=axes[:n_heads].tolist(), shrink=0.8)
    bar.ax.tick_params(labelsize=FONT_PT)
    if title:
        fig.suptitle(title, fontsize=FONT_PT + 2)
    save_png(fig, path)
    return path


def plot_attention(maps: AttentionMaps, path: str | Path, *, layer: int | None = None, head: int | None = None) -> Path:
    """Save one layer of `maps` as a PNG: every head in a grid, or the one `head` alone.

    layer: default the last (the one nearest the output). Raises `UserError` naming the valid range
    when `layer` or `head` does not exist, or for a bad path.
    """
    path = check_png_path(path)
    maps.check(layer, head)
    layer = maps.n_layers - 1 if layer is None else layer
    weights = maps.weights[layer]  # (H, Tq, Tk)
    title = f"{maps.kind}, layer {layer}"
    if head is None:
        return plot_heads(weights, maps.key_tokens, path, query_tokens=maps.query_tokens, title=title)
    return plot_alignment(
        weights[head],
        maps.key_tokens,
        maps.query_tokens,
        path,
        title=f"{title}, head {head}",
        axis_labels=("source", "target") if maps.cross else ("key", "query"),
    )


def _draw(ax, w: np.ndarray, col_tokens: Sequence[str], row_tokens: Sequence[str], font: float):
    """One heatmap of `w (rows, cols)` on `ax`, labelled; returns the image for the colourbar."""
    finite = w[np.isfinite(w)]
    probabilities = finite.size == 0 or (finite.min() >= 0 and finite.max() <= 1)
    vmin, vmax = (0.0, 1.0) if probabilities else (None, None)  # raw scores: let the data set the range
    image = ax.imshow(w, cmap=CMAP, vmin=vmin, vmax=vmax, aspect="equal", interpolation="nearest")
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xticks(range(len(col_tokens)))
    ax.set_yticks(range(len(row_tokens)))
    # parse_math=False: a token such as "$5" or "x^2$" is text, not mathtext.
    ax.set_xticklabels(
        [display_token(t) for t in col_tokens],
        rotation=X_ROTATION,
        ha="left",
        rotation_mode="anchor",
        fontsize=font,
        parse_math=False,
    )
    ax.set_yticklabels([display_token(t) for t in row_tokens], fontsize=font, parse_math=False)
    ax.tick_params(length=2, pad=2)
    return image


def _label_margins(col_tokens: Sequence[str], row_tokens: Sequence[str], font: float) -> tuple[float, float]:
    """Rough room in inches for the row labels (left) and the rotated column labels (top).

    Only a first guess for the figure size: `bbox_inches="tight"` in `_save` makes sure nothing is
    clipped, whatever the font does.
    """
    char_in = 0.6 * font / 72  # an average glyph is about 0.6 em wide
    longest_row = max(len(display_token(t)) for t in row_tokens)
    longest_col = max(len(display_token(t)) for t in col_tokens)
    left = longest_row * char_in + 0.5
    top = longest_col * char_in * math.sin(math.radians(X_ROTATION)) + 0.5
    return left, top


def _check_not_empty(shape: tuple[int, ...]) -> None:
    if 0 in shape:
        raise ValueError(f"nothing to draw: weights have shape {shape}; give at least one token on each side")


def _as_array(weights: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(weights, torch.Tensor):
        return weights.detach().to("cpu", torch.float32).numpy()
    return np.asarray(weights, dtype=np.float32)
