"""Gated PixelCNN (van den Oord et al. 2016b, "Conditional Image Generation with PixelCNN
Decoders", §2.1-2.3, Figure 2).

Two changes to PixelCNN (`pixelcnn.py`), and conditioning:
- Two stacks remove the blind spot (§2.2): a vertical stack sees every row above the pixel (a
  k × k kernel cut to its upper half and centre row, its output moved down one row before anyone
  else reads it) and a horizontal stack sees the pixels left of it in its own row (a 1 × (k//2 + 1)
  kernel). Each layer feeds the vertical stack into the horizontal one (a 1 × 1 convolution),
  never the other way, so no pixel ever sees its own value or a later one.
- Gated units replace the ReLUs (§2.1, Eq. 2): y = tanh(W_f * x) ⊙ σ(W_g * x), as in the LSTM's
  gates; the horizontal stack has residual connections.
- Class conditioning (§2.3, Eq. 4): y = tanh(W_f * x + V_f h) ⊙ σ(W_g * x + V_g h), h the class's
  one-hot vector: a learned per-class bias on each gate's pre-activation in every layer.

Shape legend: B batch, H rows, W columns, h hidden channels, V = 256 levels.
"""

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.models.pixelcnn import LEVELS, normalize_pixels
from attnlab.nn.conv import MaskedConv2d, gated_tanh, horizontal_mask, shift_down, vertical_mask


@dataclass(frozen=True)
class GatedPixelCNNConfig:
    """The shape of a Gated PixelCNN; validated on construction."""

    kind: str = "gated-pixelcnn"
    """Always "gated-pixelcnn": lets the image task pick the model family by `model.kind`."""
    hidden: int = 32
    """h: channels of each stack."""
    n_layers: int = 8
    """Gated layers (the first one masks the pixel itself out of the horizontal stack)."""
    kernel: int = 5
    """k: the vertical stack reads k//2 rows up and k//2 columns each side per layer, the horizontal
    k//2 columns left."""
    head_channels: int = 256
    """Width of the 1 × 1 layer before the softmax."""
    n_classes: int = 10
    """Class conditioning (Eq. 4); 0 = unconditional."""

    def __post_init__(self) -> None:
        if self.kind != "gated-pixelcnn":
            raise ValueError(f"kind must be 'gated-pixelcnn', got {self.kind!r}")
        for name in ("hidden", "n_layers", "kernel", "head_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kernel % 2 == 0 or self.kernel < 3:
            raise ValueError(f"kernel must be odd and >= 3, got {self.kernel}")
        if self.n_classes < 0:
            raise ValueError(f"n_classes must be >= 0, got {self.n_classes}")


class GatedLayer(nn.Module):
    """One layer of Figure 2: (vertical, horizontal) `(B, C_in, H, W)` each -> `(B, h, H, W)` each."""

    def __init__(self, in_channels: int, hidden: int, kernel: int, n_classes: int, first: bool) -> None:
        super().__init__()
        self.first = first
        self.vertical = MaskedConv2d(in_channels, 2 * hidden, vertical_mask(kernel))
        self.horizontal = MaskedConv2d(in_channels, 2 * hidden, horizontal_mask(kernel, include_centre=not first))
        self.link = nn.Conv2d(2 * hidden, 2 * hidden, 1)  # vertical -> horizontal, after the shift
        self.out = nn.Conv2d(hidden, hidden, 1)
        self.class_bias = nn.Embedding(n_classes, 4 * hidden) if n_classes else None

    def forward(
        self, v: torch.Tensor, h: torch.Tensor, labels: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        v_pre = self.vertical(v)  # (B, 2h, H, W): rows <= r
        h_pre = self.horizontal(h) + self.link(shift_down(v_pre))  # rows < r, and row r left of c
        if self.class_bias is not None:
            bias_v, bias_h = self.class_bias(labels)[:, :, None, None].chunk(2, dim=1)  # V h of Eq. 4
            v_pre, h_pre = v_pre + bias_v, h_pre + bias_h
        h_out = self.out(gated_tanh(h_pre))
        # The first layer's input is the image (1 channel): no residual connection to add it to.
        return gated_tanh(v_pre), h_out if self.first else h + h_out


class GatedPixelCNN(nn.Module):
    """forward(x `(B, H, W)` pixel values 0..255, labels `(B,)` long or None) -> logits `(B, 256, H, W)`."""

    def __init__(self, config: GatedPixelCNNConfig) -> None:
        super().__init__()
        self.config = c = config
        self.layers = nn.ModuleList(
            GatedLayer(1 if i == 0 else c.hidden, c.hidden, c.kernel, c.n_classes, first=i == 0)
            for i in range(c.n_layers)
        )
        self.head = nn.Sequential(
            nn.ReLU(), nn.Conv2d(c.hidden, c.head_channels, 1), nn.ReLU(), nn.Conv2d(c.head_channels, LEVELS, 1)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.logits(normalize_pixels(x), labels)

    def logits(self, pixels: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """pixels `(B, 1, H, W)` float in [-1, 1] -> logits `(B, 256, H, W)`."""
        if self.config.n_classes and labels is None:
            raise ValueError("this Gated PixelCNN is class-conditional: pass labels")
        v = h = pixels
        for layer in self.layers:
            v, h = layer(v, h, labels)
        return self.head(h)
