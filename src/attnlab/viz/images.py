"""Pictures of images: a grid of samples (or completions), and a ViT's [CLS] attention over an image.

Shape legend: N images, H rows, W columns, G patches per side.
"""

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnlab.viz.figure import new_figure, save_png


def plot_image_grid(
    images: np.ndarray, path: Path, *, titles: Sequence[str] | None = None, columns: int = 8, title: str = ""
) -> None:
    """Grey images `(N, H, W)` uint8 in a grid of `columns` columns (0 = black), saved atomically as PNG."""
    n = len(images)
    columns = max(1, min(columns, n))
    rows = -(-n // columns)
    fig = new_figure(1.1 * columns, 1.1 * rows + (0.3 if title else 0.0) + (0.2 * rows if titles else 0.0))
    for i, image in enumerate(images):
        ax = fig.add_subplot(rows, columns, i + 1)
        ax.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        ax.set_axis_off()
        if titles is not None:
            ax.set_title(titles[i], fontsize=6)
    if title:
        fig.suptitle(title, fontsize=8)
    save_png(fig, path)


def plot_cls_attention(
    image: np.ndarray, attention: np.ndarray, path: Path, *, title: str = "", tokens: str = "patches"
) -> None:
    """An image `(H, W)` beside the same image under [CLS]'s attention to each patch `(G, G)`,
    the weights stretched over their patches (nearest neighbour: each patch one flat colour).
    tokens: what the G × G tokens are, for the panel's title (a hybrid's are a stem's cells)."""
    h, w = image.shape
    g = attention.shape[0]
    fig = new_figure(4.2, 2.3)
    left, right = fig.subplots(1, 2)
    left.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    left.set_title("image", fontsize=7)
    right.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    shown = right.imshow(attention, cmap="inferno", alpha=0.6, extent=(-0.5, w - 0.5, h - 0.5, -0.5))
    right.set_title(f"[CLS] -> {g} x {g} {tokens}", fontsize=7)
    for ax in (left, right):
        ax.set_axis_off()
    fig.colorbar(shown, ax=right, fraction=0.046).ax.tick_params(labelsize=6)
    if title:
        fig.suptitle(title, fontsize=8)
    save_png(fig, path)
