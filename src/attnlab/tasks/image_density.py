"""Image density estimation (Fashion-MNIST): p(image) as a product of per-pixel conditionals in
raster order, each a 256-way softmax.

Which model (`model.kind`): PixelCNN, Gated PixelCNN, or attnlab's GPT over the 784 pixels as
tokens (Image GPT: Chen et al. 2020; the Image Transformer: Parmar et al. 2018). Which data: the
IDX files of `data.data_dir` (`attnlab.data.images`), `data.val_size` training images held out
for validation. Which loss: cross-entropy of each pixel's value, in nats per pixel. Which metric:
the same in bits per dimension (nats / ln 2; a uniform model scores 8), on the held-out images to
pick the best checkpoint, on the test images to report.

The GPT reads tokens `[start, x_0, ..., x_782]` and predicts `x_0, ..., x_783`: ids 0-255 are pixel
values, and the start token is 256 + the class (class-conditional) or 256 (unconditional). So the
GPT is the lm task's model unchanged; only its vocabulary and its block size (784) differ.

Shape legend: B batch, H rows, W columns, T = H W pixels, V = 256 levels.
"""

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data.images import LabelledImages, image_splits
from attnlab.errors import ConfigError
from attnlab.models.gated_pixelcnn import GatedPixelCNN, GatedPixelCNNConfig
from attnlab.models.gpt import GPT
from attnlab.models.pixelcnn import LEVELS, PixelCNN, PixelCNNConfig
from attnlab.models.pixels import PixelGPTConfig, pixel_logits
from attnlab.tasks.checks import check_splits, need_data_dir, unknown_split

SPLITS = ("train", "val", "test")


MODEL_KINDS: dict[str, type] = {
    "pixelcnn": PixelCNNConfig,
    "gated-pixelcnn": GatedPixelCNNConfig,
    "pixel-gpt": PixelGPTConfig,
}
MODELS: dict[type, type[nn.Module]] = {
    PixelCNNConfig: PixelCNN,
    GatedPixelCNNConfig: GatedPixelCNN,
    PixelGPTConfig: GPT,
}
DensityConfig = PixelCNNConfig | GatedPixelCNNConfig | PixelGPTConfig


@dataclass(frozen=True)
class ImagesDataConfig:
    """Which images, and how many of the training images are held out."""

    data_dir: str = ""
    """Folder with the IDX files (train-images-idx3-ubyte.gz, ..., t10k-labels-idx1-ubyte.gz)."""
    val_size: int = 5000
    """Training images held out (a seeded random choice) to pick the best checkpoint."""
    train_size: int = 0
    """Train on the first this many of the remaining training images; 0 = all of them."""
    eval_images: int = 1000
    """Validation images scored at each evaluation during training (the first ones: the same every time)."""
    seed: int = 0
    """Seed of the held-out choice."""

    def __post_init__(self) -> None:
        if self.val_size < 1 or self.eval_images < 1:
            raise ValueError(f"val_size and eval_images must be >= 1, got {self.val_size} and {self.eval_images}")
        if self.train_size < 0:
            raise ValueError(f"train_size must be >= 0 (0 = all), got {self.train_size}")


def model_config_class(values: dict[str, Any], kinds: dict[str, type], task: str) -> type:
    """The model section's dataclass, by `model.kind` (which must be given)."""
    kind = values.get("kind")
    if kind not in kinds:
        raise ConfigError(f"model.kind {kind!r} is not a {task} model; choose one of {', '.join(kinds)}")
    return kinds[kind]


def read_images(data: Any, splits: Sequence[str], task: str) -> dict[str, LabelledImages]:
    """The asked-for splits of `data.data_dir` (a `UserError` for an unknown split or a missing folder)."""
    check_splits(splits, SPLITS)
    if splits:
        need_data_dir(data.data_dir, task, "e.g. ../shared/data/fashion-mnist")
    return image_splits(data.data_dir, tuple(splits), data.val_size, data.seed, data.train_size) if splits else {}


def random_batch(images: LabelledImages, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """`batch_size` images drawn with replacement: pixels `(B, H, W)` uint8 and labels `(B,)` long."""
    index = torch.randint(len(images), (batch_size,), generator=generator).numpy()
    return torch.from_numpy(images.images[index]), torch.from_numpy(images.labels[index])


def batches(images: LabelledImages, batch_size: int, limit: int | None = None):
    """The first `limit` (or all) images in order, `batch_size` at a time, as (pixels, labels)."""
    n = len(images) if limit is None else min(limit, len(images))
    for i in range(0, n, batch_size):
        yield (
            torch.from_numpy(images.images[i : min(i + batch_size, n)]),
            torch.from_numpy(images.labels[i : min(i + batch_size, n)]),
        )


class ImageDensity:
    """The likelihood of each image, pixel by pixel; the models can also sample new images."""

    name = "image-density"
    data_config_class = ImagesDataConfig
    selection = ("val_loss", "min")
    split_names = SPLITS
    report_split = "test"
    uses_tokenizer = False

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        return model_config_class(values, MODEL_KINDS, "image density")

    @staticmethod
    def build_model_from_config(config: DensityConfig) -> nn.Module:
        return MODELS[type(config)](config)

    def __init__(
        self,
        data: ImagesDataConfig,
        model: DensityConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 16,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        self.data_config, self.batch_size = data, batch_size
        self.images = read_images(data, splits, "image density estimation")
        self.model_config = self.fit_model(model)

    def fit_model(self, model: DensityConfig) -> DensityConfig:
        """A GPT's vocabulary (256 pixel values + start tokens) and block size (the pixel count)."""
        if not isinstance(model, PixelGPTConfig):
            return model
        # A test-only run (no images loaded) keeps what its saved config says.
        side = next(iter(self.images.values())).images.shape[1:] if self.images else None
        pixels = int(np.prod(side)) if side is not None else model.block_size
        return dataclasses.replace(model, vocab_size=LEVELS + model.n_start_tokens, block_size=pixels)

    def build_model(self) -> nn.Module:
        return self.build_model_from_config(self.model_config)

    def train_batch(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return random_batch(self.images["train"], self.batch_size, generator)

    @staticmethod
    def batch_tokens(batch: tuple[torch.Tensor, ...]) -> int:
        return batch[0].numel()  # pixels: the trainer's "tokens" per second are pixels per second

    @staticmethod
    def loss(model: nn.Module, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        """Mean cross-entropy of each pixel's value, in nats."""
        x, labels = (t.to(device, non_blocking=True) for t in batch)
        logits = pixel_logits(model, x, labels)  # (B, 256, H, W)
        return F.cross_entropy(logits.float(), x.long(), label_smoothing=label_smoothing)

    @torch.no_grad()
    def nll(self, model: nn.Module, device: torch.device, split: str, limit: int | None = None) -> tuple[float, int]:
        """Mean NLL in nats per pixel over the first `limit` (or all) images of `split`, and the image count."""
        total, count = 0.0, 0
        for x, labels in batches(self.images[split], 64, limit):
            x, labels = x.to(device), labels.to(device)
            logits = pixel_logits(model, x, labels).float()
            total += F.cross_entropy(logits, x.long(), reduction="sum").item()
            count += x.numel()
        return total / count, count // int(np.prod(self.images[split].images.shape[1:]))

    def evaluate_during_training(self, model: nn.Module, device: torch.device, **_: Any) -> dict[str, float]:
        return {"val_loss": self.nll(model, device, "val", self.data_config.eval_images)[0]}

    def evaluate(self, model: nn.Module, device: torch.device, *, split: str = "test", **_: Any) -> dict[str, Any]:
        if split not in self.images:
            raise unknown_split(split, SPLITS)
        model.eval()
        nats, n = self.nll(model, device, split)
        return {
            f"{split}_nll": nats,
            f"{split}_bits_per_dim": nats / math.log(2),
            "images": n,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
