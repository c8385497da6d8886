"""PixelCNN (van den Oord et al. 2016a, "Pixel Recurrent Neural Networks", §3.4-3.5, Figure 5).

An image is a sequence of pixels in raster order, p(x) = Π_i p(x_i | x_<i) (Eq. 1), and every
conditional comes out of one convolutional pass: the convolutions are masked so that the output at
pixel i never sees pixel i or anything after it. The first layer is a 7 × 7 convolution with mask
A (excludes the centre), then residual blocks whose 3 × 3 convolution has mask B (includes the
centre, which by then holds only what came before), then 1 × 1 layers to a 256-way softmax per
pixel (§5.1: discrete values beat a continuous density). Grey images have one channel, so the
masks need no split of the channels into R, G, B groups.

The masks leave a blind spot (van den Oord et al. 2016b, Figure 1): a stack of 3 × 3 masked
convolutions reaches row r - d only up to d columns right of the pixel, so the pixels above and to
the right beyond that diagonal never reach it, however deep the stack. The Gated PixelCNN
(`gated_pixelcnn.py`) removes it.

Shape legend: B batch, H rows, W columns, C channels (2h in the residual stream), V = 256 levels.
"""

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.nn.conv import MaskedConv2d, raster_mask

LEVELS = 256


def normalize_pixels(x: torch.Tensor) -> torch.Tensor:
    """Pixel values `(B, H, W)` 0..255 (any integer or float dtype) -> `(B, 1, H, W)` float in [-1, 1]."""
    return (x.float() / 127.5 - 1.0).unsqueeze(1)


@dataclass(frozen=True)
class PixelCNNConfig:
    """The shape of a PixelCNN; validated on construction."""

    kind: str = "pixelcnn"
    """Always "pixelcnn": lets the image task pick the model family by `model.kind`."""
    hidden: int = 32
    """h: the residual stream has 2h channels, each block's inner convolutions h (Figure 5)."""
    n_layers: int = 7
    """Residual blocks after the first (mask A) layer; each adds one row and column of reach."""
    first_kernel: int = 7
    """Side of the first layer's mask-A kernel (the paper's 7)."""
    kernel: int = 3
    """Side of each block's mask-B kernel (the paper's 3)."""
    head_channels: int = 256
    """Width of the 1 × 1 layers before the softmax (the paper's 1024 for CIFAR-10; less for grey 28 × 28)."""
    n_classes: int = 0
    """Class conditioning: a learned per-class bias on the first layer's output; 0 = unconditional."""

    def __post_init__(self) -> None:
        if self.kind != "pixelcnn":
            raise ValueError(f"kind must be 'pixelcnn', got {self.kind!r}")
        for name in ("hidden", "first_kernel", "kernel", "head_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_layers", "n_classes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("first_kernel", "kernel"):
            if getattr(self, name) % 2 == 0:
                raise ValueError(f"{name} must be odd (a centre pixel), got {getattr(self, name)}")

    @property
    def reach_up(self) -> int:
        """Rows above a pixel that can reach it: the first kernel's half side plus one row per block."""
        return self.first_kernel // 2 + self.n_layers * (self.kernel // 2)


class ResidualBlock(nn.Module):
    """Figure 5 (right): ReLU, 1 × 1 (2h -> h), ReLU, masked k × k type B (h -> h), ReLU, 1 × 1 (h -> 2h), plus x."""

    def __init__(self, hidden: int, kernel: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(2 * hidden, hidden, 1),
            nn.ReLU(),
            MaskedConv2d(hidden, hidden, raster_mask(kernel, "B")),
            nn.ReLU(),
            nn.Conv2d(hidden, 2 * hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)  # (B, 2h, H, W)


class PixelCNN(nn.Module):
    """forward(x `(B, H, W)` pixel values 0..255, labels `(B,)` long or None) -> logits `(B, 256, H, W)`:
    the output at pixel i is the distribution of pixel i given the pixels before it in raster order."""

    def __init__(self, config: PixelCNNConfig) -> None:
        super().__init__()
        self.config = c = config
        self.first = MaskedConv2d(1, 2 * c.hidden, raster_mask(c.first_kernel, "A"))
        self.class_bias = nn.Embedding(c.n_classes, 2 * c.hidden) if c.n_classes else None
        self.blocks = nn.Sequential(*(ResidualBlock(c.hidden, c.kernel) for _ in range(c.n_layers)))
        # 1 × 1 convolutions see only their own pixel, which mask B allows: no mask needed.
        self.head = nn.Sequential(
            nn.ReLU(),
            nn.Conv2d(2 * c.hidden, c.head_channels, 1),
            nn.ReLU(),
            nn.Conv2d(c.head_channels, LEVELS, 1),
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.logits(normalize_pixels(x), labels)

    def logits(self, pixels: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """pixels `(B, 1, H, W)` float in [-1, 1] -> logits `(B, 256, H, W)`. (Split from `forward` so
        that a test can take gradients with respect to the pixels.)"""
        h = self.first(pixels)  # (B, 2h, H, W)
        if self.class_bias is not None:
            if labels is None:
                raise ValueError("this PixelCNN is class-conditional: pass labels")
            h = h + self.class_bias(labels)[:, :, None, None]
        return self.head(self.blocks(h))
