"""Pictures of images: a grid of samples (or completions), and a ViT's [CLS] attention over an image.

Shape legend: N images, H rows, W columns, G patches per side.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.errors import UserError
from attnlab.fileio import check_writable
from attnlab.tasks.media import SEED, ImageSamples, sample_run_images
from attnlab.viz.figure import check_png_path, new_figure, save_png


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


def sample_image_grid(
    run: Any,
    out: str | Path,
    n: int = 16,
    *,
    label: int | None = None,
    complete: tuple[str, int] | None = None,
    data_dir: str | None = None,
    temperature: float = 1.0,
    seed: int = SEED,
    progress: bool = False,
) -> ImageSamples:
    """`attnlab sample IMAGE_RUN`: `n` images from an image density run drawn as a grid in the PNG
    `out` (checked writable before sampling), completions after the original and its kept top half.
    The arguments are `attnlab.tasks.media.sample_run_images`'s, which samples them."""
    path = check_png_path(out)
    check_writable(path)
    samples = sample_run_images(
        run, n, label=label, complete=complete, data_dir=data_dir, temperature=temperature, seed=seed, progress=progress
    )
    shown, titles = samples.images.numpy(), None
    if samples.given is not None:
        occluded = samples.given.clone()
        occluded[samples.given_rows :] = 0
        shown = np.concatenate([samples.given[None].numpy(), occluded[None].numpy(), shown])
        titles = ["original", "given"] + [f"sample {i + 1}" for i in range(n)]
    conditioned = samples.label is not None and run.config.model.n_classes
    title = f"{run.config.model.kind}: {samples.description}" + (f", class {samples.label}" if conditioned else "")
    plot_image_grid(shown, path, titles=titles, title=title)
    return samples


@dataclass(frozen=True)
class ClsAttention:
    """What `draw_cls_attention` drew: one image, the model's answer, and [CLS]'s attention."""

    path: Path
    label: int
    predicted: int
    layer: int
    head: int | None
    """None: the mean of the layer's heads."""
    attention: np.ndarray
    """`(G, G)`: [CLS]'s attention to each patch (or stem cell)."""
    title: str


def draw_cls_attention(
    run: Any,
    image: tuple[str, int],
    out: str | Path,
    *,
    layer: int | None = None,
    head: int | None = None,
    data_dir: str | None = None,
) -> ClsAttention:
    """`attnlab attention VIT_RUN --image SPLIT:INDEX`: where a ViT run's [CLS] looks in the image
    `(split, index)` of its data (read from `data_dir` when given), drawn over the image as the PNG
    `out`: `layer`'s weights (default the last), one `head`'s or the mean of the heads (Dosovitskiy
    et al. 2020, Figure 6, draws the same from attention rollout; here one layer's, as they are)."""
    from attnlab.data.images import FASHION_CLASSES
    from attnlab.models.vit import ViT
    from attnlab.tasks.image_classification import ImageClassification
    from attnlab.tasks.image_density import SPLITS

    path = check_png_path(out)
    check_writable(path)
    split, index = image
    if split not in SPLITS:
        raise UserError(f"--image takes SPLIT:INDEX with SPLIT one of {', '.join(SPLITS)}, got {split}:{index}")
    if not isinstance(run.model, ViT):
        kind = getattr(run.config.model, "kind", None)  # a language model (GPT) has none
        what = f"{run.config.task!r} run" + (f" ({kind})" if kind else "")
        raise UserError(f"--image draws a ViT's [CLS] attention; {run.path} is a {what}")
    c = run.config.model
    for flag, value, count in (("--layer", layer, c.n_layers), ("--head", head, c.n_heads)):
        if value is not None and value >= count:
            raise UserError(f"{flag} {value}: the model has {count} ({flag[2:]}s 0-{count - 1})")
    data = dataclasses.replace(run.config.data, data_dir=data_dir) if data_dir else run.config.data
    pixels, label = ImageClassification(data, c, run.path, resume=True, splits=(split,)).image(split, index)
    device = next(run.model.parameters()).device
    weights = run.model.cls_attention(pixels[None].to(device))[0].cpu()  # (layers, heads, G, G)
    layer = c.n_layers - 1 if layer is None else layer
    shown = (weights[layer].mean(0) if head is None else weights[layer, head]).numpy()
    predicted = int(run.model(pixels[None].to(device)).argmax(-1))
    names = FASHION_CLASSES if c.n_classes == len(FASHION_CLASSES) else [str(i) for i in range(c.n_classes)]
    heads = "mean of the heads" if head is None else f"head {head}"
    title = f"{split} image {index}: {names[label]}, predicted {names[predicted]}; layer {layer}, {heads}"
    plot_cls_attention(pixels.numpy(), shown, path, title=title, tokens=run.model.patch_embed.tokens)
    return ClsAttention(path, label, predicted, layer, head, shown, title)
