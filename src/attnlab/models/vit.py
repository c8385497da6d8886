"""Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16x16 Words", §3.1, Eqs. 1-4),
and the small CNN it is measured against.

ViT: cut the image into P × P patches, project each (flattened) to the model width (Eq. 1's E,
one strided convolution), put a learned [CLS] vector in front, add learned positions, run the
Transformer encoder (attnlab's own `TransformerBlock`, pre-norm as in the paper), and classify
from [CLS]'s final state after a LayerNorm (Eq. 4). Parts as in timm's `vision_transformer.py`:
`PatchEmbed`, then `forward_features` / `forward_head`.

The hybrid (§3.1, "Hybrid Architecture"): the tokens are the cells of a CNN's feature map instead
of raw patches (`embed = "conv"`). Here the CNN is the small stem of Xiao et al. 2021: stride-2
3 × 3 convolutions with BatchNorm and ReLU, then a 1 × 1 convolution to the model width. It gives
the Transformer the locality that a patch embedding leaves it to learn from data.

CNN: two 3 × 3 convolution + ReLU + 2 × 2 max-pool stages and a two-layer classifier: the
"2 Conv + pooling" family of Fashion-MNIST's own benchmark table (91.6% reported).

Shape legend: B batch, H rows, W columns, N patches, C model width, L classes.
"""

from dataclasses import dataclass

import torch
from torch import nn

from attnlab.nn import ACTIVATIONS, NORM_ORDERS, LearnedPositions, TransformerBlock, normal_init


def check_image(image_size: int, channels: int) -> None:
    if image_size < 1 or channels < 1:
        raise ValueError(f"image_size and channels must be >= 1, got {image_size} and {channels}")


@dataclass(frozen=True)
class ViTConfig:
    """The shape of a Vision Transformer; validated on construction."""

    kind: str = "vit"
    """Always "vit": lets the image-classification task pick the model family by `model.kind`."""
    image_size: int = 28
    """Side of the (square) input image."""
    channels: int = 1
    """Input channels (1: grey)."""
    embed: str = "patch"
    """How pixels become tokens, by name (`EMBEDDINGS`): "patch", the paper's P × P patches, or
    "conv", the hybrid's convolutional stem."""
    patch_size: int = 4
    """P, for embed = "patch": side of each patch; must divide image_size. 28 / 4 = 7 × 7 = 49
    patches, 50 tokens with [CLS]."""
    stem_channels: tuple[int, ...] = (24, 48, 96)
    """For embed = "conv": output channels of each stride-2 3 × 3 convolution of the stem; each
    halves the side (rounding up), so three take 28 × 28 to a 4 × 4 grid."""
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 128
    dropout: float = 0.1
    """Dropout on attention weights, residual branches and the embedded patches."""
    activation: str = "gelu"
    norm: str = "pre"
    """Residual block order; the paper's is "pre" (Eq. 2-3: LN before each sublayer)."""
    n_classes: int = 10

    def __post_init__(self) -> None:
        if self.kind != "vit":
            raise ValueError(f"kind must be 'vit', got {self.kind!r}")
        check_image(self.image_size, self.channels)
        for name in ("patch_size", "d_model", "n_heads", "n_layers", "d_ff", "n_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.embed not in EMBEDDINGS:
            raise ValueError(f"embed must be one of {sorted(EMBEDDINGS)}, got {self.embed!r}")
        if not self.stem_channels or min(self.stem_channels) < 1:
            raise ValueError(f"stem_channels must be a non-empty list of counts >= 1, got {list(self.stem_channels)}")
        if self.embed == "patch" and self.image_size % self.patch_size != 0:
            raise ValueError(f"patch_size ({self.patch_size}) must divide image_size ({self.image_size})")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.norm not in NORM_ORDERS:
            raise ValueError(f"norm must be one of {list(NORM_ORDERS)}, got {self.norm!r}")

    @property
    def grid(self) -> int:
        """Tokens per side (patches, or cells of the stem's feature map)."""
        if self.embed == "conv":
            return conv_stem_side(self.image_size, len(self.stem_channels))
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid**2


class PatchEmbed(nn.Module):
    """Eq. 1's x_p E: non-overlapping P × P patches, each flattened and projected to C (a
    convolution with stride P is exactly that). `(B, ch, H, W)` -> `(B, N, C)`, patches in raster order."""

    tokens = "patches"  # what each token is, for pictures of the attention over them

    def __init__(self, config: "ViTConfig") -> None:
        super().__init__()
        self.proj = nn.Conv2d(config.channels, config.d_model, config.patch_size, stride=config.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, C, H/P, W/P) -> (B, N, C)


def conv_stem_side(side: int, n_convs: int) -> int:
    """The side of the feature map after `n_convs` stride-2 3 × 3 convolutions with padding 1."""
    for _ in range(n_convs):
        side = (side + 1) // 2
    return side


class ConvStem(nn.Module):
    """The hybrid's embedding (§3.1) with the stem of Xiao et al. 2021: stride-2 3 × 3 convolutions,
    each with BatchNorm and ReLU, then a 1 × 1 convolution to C; each cell of the final map is a
    token. `(B, ch, H, W)` -> `(B, N, C)`, cells in raster order."""

    tokens = "stem cells"

    def __init__(self, config: "ViTConfig") -> None:
        super().__init__()
        layers, width = [], config.channels
        for out in config.stem_channels:
            layers += [nn.Conv2d(width, out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
            width = out
        layers.append(nn.Conv2d(width, config.d_model, 1))
        self.stem = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x).flatten(2).transpose(1, 2)  # (B, C, g, g) -> (B, N, C)


EMBEDDINGS: dict[str, type[nn.Module]] = {"patch": PatchEmbed, "conv": ConvStem}


def normalize_image(x: torch.Tensor) -> torch.Tensor:
    """Pixel values `(B, H, W)` 0..255 -> `(B, 1, H, W)` float, about zero mean and unit scale."""
    return (x.float() / 255.0 - 0.5).unsqueeze(1) / 0.5


class ViT(nn.Module):
    """forward(x `(B, H, W)` pixel values 0..255) -> logits `(B, L)`."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = EMBEDDINGS[c.embed](c)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.positions = LearnedPositions(c.n_patches + 1, c.d_model)  # E_pos of Eq. 1, [CLS] at 0
        self.dropout = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation=c.activation, norm=c.norm)
            for _ in range(c.n_layers)
        )
        self.final_norm = nn.LayerNorm(c.d_model) if c.norm == "pre" else nn.Identity()
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.apply(normal_init)
        nn.init.normal_(self.cls_token, std=0.02)

    def forward_features(
        self, x: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Pixels `(B, H, W)` -> final states `(B, N + 1, C)` ([CLS] first) and each block's attention
        weights `(B, heads, N + 1, N + 1)` when asked for."""
        patches = self.patch_embed(normalize_image(x))  # (B, N, C)
        h = torch.cat([self.cls_token.expand(x.size(0), -1, -1), patches], dim=1)  # (B, N + 1, C)
        h = self.dropout(h + self.positions(torch.arange(h.size(1), device=h.device)))
        weights = []
        for block in self.blocks:
            h, w = block(h, need_weights=need_weights)
            weights.append(w)
        return self.final_norm(h), weights

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features[:, 0])  # Eq. 4: y = LN(z_L^0), here the norm is in forward_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x)[0])

    @torch.no_grad()
    def cls_attention(self, x: torch.Tensor) -> torch.Tensor:
        """How much [CLS] attends to each patch, per block and head: `(B, layers, heads, grid, grid)`."""
        _, weights = self.forward_features(x, need_weights=True)
        g = self.config.grid
        return torch.stack([w[:, :, 0, 1:] for w in weights], dim=1).unflatten(-1, (g, g))


@dataclass(frozen=True)
class CNNConfig:
    """The shape of the CNN baseline; validated on construction."""

    kind: str = "cnn"
    """Always "cnn"."""
    image_size: int = 28
    channels: int = 1
    conv_channels: tuple[int, ...] = (32, 64)
    """Output channels of each 3 × 3 convolution + ReLU + 2 × 2 max-pool stage."""
    hidden: int = 128
    """Width of the classifier's hidden layer."""
    dropout: float = 0.25
    """Dropout before each classifier layer."""
    n_classes: int = 10

    def __post_init__(self) -> None:
        if self.kind != "cnn":
            raise ValueError(f"kind must be 'cnn', got {self.kind!r}")
        check_image(self.image_size, self.channels)
        if not self.conv_channels or min(self.conv_channels) < 1:
            raise ValueError(f"conv_channels must be a non-empty list of counts >= 1, got {list(self.conv_channels)}")
        if self.image_size >> len(self.conv_channels) < 1:
            raise ValueError(
                f"{len(self.conv_channels)} pooling stages leave nothing of a {self.image_size}-pixel side"
            )
        for name in ("hidden", "n_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class CNN(nn.Module):
    """forward(x `(B, H, W)` pixel values 0..255) -> logits `(B, L)`."""

    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        self.config = c = config
        stages, width = [], c.channels
        for out in c.conv_channels:
            stages += [nn.Conv2d(width, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            width = out
        self.features = nn.Sequential(*stages)
        side = c.image_size >> len(c.conv_channels)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(c.dropout),
            nn.Linear(width * side * side, c.hidden),
            nn.ReLU(),
            nn.Dropout(c.dropout),
            nn.Linear(c.hidden, c.n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(normalize_image(x)))
