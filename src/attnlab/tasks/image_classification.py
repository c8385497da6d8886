"""Image classification (Fashion-MNIST): one label per image.

Which model (`model.kind`): a Vision Transformer or the small CNN baseline (`attnlab.models.vit`).
Which data: the IDX files of `data.data_dir`, `data.val_size` training images held out. Which
loss: cross-entropy. Which metric: accuracy, on the held-out images to pick the best checkpoint,
on the test images to report.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data.images import flip_and_shift
from attnlab.errors import UserError
from attnlab.models.vit import CNN, CNNConfig, ViT, ViTConfig
from attnlab.tasks.checks import unknown_split
from attnlab.tasks.image_density import (
    SPLITS,
    ImagesDataConfig,
    batches,
    model_config_class,
    random_batch,
    read_images,
)


@dataclass(frozen=True)
class ClassifiedImagesDataConfig(ImagesDataConfig):
    """The images of a classifier, and how its training images are varied (`flip_and_shift`)."""

    flip: bool = False
    """Mirror each training image left-right with probability 1/2."""
    max_shift: int = 0
    """Move each training image by up to this many pixels up/down and left/right (0 = never)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.max_shift <= 8:
            raise ValueError(f"max_shift must be in 0..8 pixels, got {self.max_shift}")


MODEL_KINDS: dict[str, type] = {"vit": ViTConfig, "cnn": CNNConfig}
MODELS: dict[type, type[nn.Module]] = {ViTConfig: ViT, CNNConfig: CNN}


class ImageClassification:
    """The class of each image."""

    name = "image-classification"
    data_config_class = ClassifiedImagesDataConfig
    selection = ("val_accuracy", "max")
    split_names = SPLITS
    report_split = "test"
    uses_tokenizer = False

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        return model_config_class(values, MODEL_KINDS, "image classification")

    @staticmethod
    def build_model_from_config(config: ViTConfig | CNNConfig) -> nn.Module:
        return MODELS[type(config)](config)

    def __init__(
        self,
        data: ClassifiedImagesDataConfig,
        model: ViTConfig | CNNConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 64,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        self.data_config, self.batch_size = data, batch_size
        self.images = read_images(data, splits, "image classification")
        for split, images in self.images.items():
            side = images.images.shape[1]
            if side != model.image_size or int(images.labels.max()) >= model.n_classes:
                raise UserError(
                    f"the {split} images are {side} x {side} with labels up to {int(images.labels.max())}, but "
                    f"the model takes {model.image_size} x {model.image_size} images and {model.n_classes} classes"
                )
        self.model_config = model

    def build_model(self) -> nn.Module:
        return self.build_model_from_config(self.model_config)

    def train_batch(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        images, labels = random_batch(self.images["train"], self.batch_size, generator)
        if self.data_config.flip or self.data_config.max_shift:
            images = flip_and_shift(images, self.data_config.flip, self.data_config.max_shift, generator)
        return images, labels

    @staticmethod
    def batch_tokens(batch: tuple[torch.Tensor, ...]) -> int:
        return batch[0].size(0)  # images per second

    @staticmethod
    def loss(model: nn.Module, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        x, labels = (t.to(device, non_blocking=True) for t in batch)
        return F.cross_entropy(model(x).float(), labels, label_smoothing=label_smoothing)

    @torch.no_grad()
    def scores(self, model: nn.Module, device: torch.device, split: str, limit: int | None = None) -> dict[str, float]:
        """Mean loss and accuracy over the first `limit` (or all) images of `split`."""
        loss, correct, n = 0.0, 0, 0
        for x, labels in batches(self.images[split], 256, limit):
            logits = model(x.to(device)).float().cpu()
            loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += int((logits.argmax(-1) == labels).sum())
            n += len(labels)
        return {"loss": loss / n, "accuracy": correct / n, "images": n}

    def evaluate_during_training(self, model: nn.Module, device: torch.device, **_: Any) -> dict[str, float]:
        s = self.scores(model, device, "val", self.data_config.eval_images)
        return {"val_loss": s["loss"], "val_accuracy": s["accuracy"]}

    def evaluate(self, model: nn.Module, device: torch.device, *, split: str = "test", **_: Any) -> dict[str, Any]:
        if split not in self.images:
            raise unknown_split(split, SPLITS)
        model.eval()
        s = self.scores(model, device, split)
        return {
            "accuracy": s["accuracy"],
            f"{split}_loss": s["loss"],
            "images": s["images"],
            "parameters": sum(p.numel() for p in model.parameters()),
        }

    @torch.no_grad()
    def image(self, split: str, index: int) -> tuple[torch.Tensor, int]:
        """One image `(H, W)` uint8 and its label, by position in its split."""
        images = self.images[split]
        if not 0 <= index < len(images):
            raise UserError(
                f"the {split} split has {len(images)} images; index {index} is outside 0..{len(images) - 1}"
            )
        return torch.from_numpy(images.images[index]), int(images.labels[index])
