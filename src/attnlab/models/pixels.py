"""What the three pixel models share: the GPT's config for pixels (`PixelGPTConfig`: a GPT over the
784 pixels as tokens, after a start token that may name the class), and every pixel's distribution
given the pixels before it, whichever the family (`pixel_logits`). The image task trains with them
and `attnlab.decode.pixels` samples with them.

Shape legend: B batch, H rows, W columns, T = H W pixels, 256 levels.
"""

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.pixelcnn import LEVELS


@dataclass(frozen=True)
class PixelGPTConfig(GPTConfig):
    """A GPTConfig for pixels: `kind` to be chosen by, and whether the start token names the class."""

    kind: str = "pixel-gpt"
    """Always "pixel-gpt"."""
    n_classes: int = 0
    """Class conditioning through the start token (256 + class); 0 = one start token for all."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind != "pixel-gpt":
            raise ValueError(f"kind must be 'pixel-gpt', got {self.kind!r}")
        if self.n_classes < 0:
            raise ValueError(f"n_classes must be >= 0, got {self.n_classes}")

    @property
    def n_start_tokens(self) -> int:
        return max(1, self.n_classes)


def pixel_logits(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Every pixel's distribution given the pixels before it: x `(B, H, W)` -> logits `(B, 256, H, W)`,
    whichever the model family."""
    if not isinstance(model, GPT):
        return model(x, labels if model.config.n_classes else None)
    b, h, w = x.shape
    tokens = torch.cat([start_tokens(model.config, labels)[:, None], x.reshape(b, h * w)[:, :-1].long()], dim=1)
    logits = model(tokens)[..., :LEVELS]  # (B, T, V): a pixel is never a start token
    return logits.transpose(1, 2).reshape(b, LEVELS, h, w)


def start_tokens(config: PixelGPTConfig, labels: torch.Tensor) -> torch.Tensor:
    """The GPT's first token per image `(B,)`: 256 + class, or 256 when unconditional."""
    return LEVELS + (labels.long() if config.n_classes else torch.zeros_like(labels, dtype=torch.long))
