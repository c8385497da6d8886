"""Causal convolutions: masked 2-D convolutions over images in raster order (PixelCNN) and causal,
dilated 1-D convolutions over time (WaveNet), and the gated unit both papers use.

Masks follow attnlab's one convention: boolean, True = this kernel tap may see its input. They are
built by small pure functions; `MaskedConv2d` zeroes the masked taps of its kernel at every call.

References: van den Oord et al. 2016a, "Pixel Recurrent Neural Networks", §3.4 and Figure 2 (masks
A and B); van den Oord et al. 2016b, "Conditional Image Generation with PixelCNN Decoders", §2.1-2.2
(vertical and horizontal stacks, the gate); van den Oord et al. 2016c, "WaveNet", §2.1-2.3 (causal
dilated convolutions, gated activation units).

Shape legend: B batch, C channels, H rows, W columns, T time, K kernel taps.
"""

import torch
import torch.nn.functional as F
from torch import nn

MASK_TYPES = ("A", "B")


def raster_mask(kernel: int, mask_type: str) -> torch.Tensor:
    """PixelCNN's mask `(K, K)`: the rows above the centre, and the centre row left of the centre;
    type "A" (the first layer) excludes the centre itself, type "B" includes it. Example, 3 × 3:
    A = [[1, 1, 1], [1, 0, 0], [0, 0, 0]], B = [[1, 1, 1], [1, 1, 0], [0, 0, 0]]."""
    if mask_type not in MASK_TYPES:
        raise ValueError(f"mask_type must be one of {MASK_TYPES}, got {mask_type!r}")
    c = kernel // 2
    mask = torch.zeros(kernel, kernel, dtype=torch.bool)
    mask[:c] = True
    mask[c, : c + (mask_type == "B")] = True
    return mask


def vertical_mask(kernel: int) -> torch.Tensor:
    """The Gated PixelCNN's vertical stack `(K, K)`: every row up to and including the centre row, all
    columns. The stack sees its own row; `shift_down` keeps that row from the horizontal stack."""
    mask = torch.zeros(kernel, kernel, dtype=torch.bool)
    mask[: kernel // 2 + 1] = True
    return mask


def horizontal_mask(kernel: int, include_centre: bool) -> torch.Tensor:
    """The Gated PixelCNN's horizontal stack `(K, K)`: the centre row, left of the centre (and the
    centre itself unless this is the first layer)."""
    c = kernel // 2
    mask = torch.zeros(kernel, kernel, dtype=torch.bool)
    mask[c, : c + include_centre] = True
    return mask


def shift_down(x: torch.Tensor) -> torch.Tensor:
    """x `(B, C, H, W)` moved down one row (a zero row on top): row r then holds only what came from
    rows < r, which the horizontal stack of row r may read."""
    return F.pad(x, (0, 0, 1, 0))[:, :, :-1, :]


class MaskedConv2d(nn.Conv2d):
    """A same-size 2-D convolution whose kernel taps outside `mask` `(K, K)` (centred on the output
    pixel) are always zero. Only the rows and columns of the mask that hold a True tap are stored
    and computed, padded so that the centre stays in place: the horizontal stack's 5 × 5 mask is a
    1 × 3 convolution, not 25 taps of which 22 are zero."""

    def __init__(self, in_channels: int, out_channels: int, mask: torch.Tensor, bias: bool = True) -> None:
        kernel = mask.shape[0]
        if mask.shape != (kernel, kernel) or kernel % 2 == 0 or not mask.any():
            raise ValueError(f"mask must be square with an odd side and a True tap, got {mask.tolist()}")
        rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
        r0, r1, c0, c1 = int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])
        cropped = mask[r0 : r1 + 1, c0 : c1 + 1]
        super().__init__(in_channels, out_channels, tuple(cropped.shape), bias=bias)
        c = kernel // 2
        self.pad = (c - c0, c1 - c, c - r0, r1 - c)  # (left, right, top, bottom), as F.pad takes them
        self.register_buffer("mask", cropped.to(self.weight.dtype)[None, None], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x `(B, C_in, H, W)` -> `(B, C_out, H, W)`."""
        return self._conv_forward(F.pad(x, self.pad), self.weight * self.mask, self.bias)


class CausalConv1d(nn.Conv1d):
    """A dilated convolution over time whose output at t reads inputs t, t - d, ..., t - (K-1) d
    only (WaveNet §2.1, Figure 3): padded on the left by (K-1) d, never on the right."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, dilation: int = 1) -> None:
        super().__init__(in_channels, out_channels, kernel, dilation=dilation)

    @property
    def reach(self) -> int:
        """How far back the kernel reads: (K-1) d samples."""
        return (self.kernel_size[0] - 1) * self.dilation[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x `(B, C_in, T)` -> `(B, C_out, T)`."""
        return super().forward(F.pad(x, (self.reach, 0)))

    def step(self, taps: torch.Tensor) -> torch.Tensor:
        """One output sample from the K inputs it reads, taps `(B, C_in, K)` oldest first (inputs
        t - (K-1) d, ..., t) -> `(B, C_out)`: the fast-generation path (Paine et al. 2016)."""
        return F.conv1d(taps, self.weight, self.bias).squeeze(-1)


def gated_tanh(x: torch.Tensor) -> torch.Tensor:
    """The gated activation unit tanh(a) ⊙ σ(b), a and b the two halves of x's channels (dim 1):
    `(B, 2C, ...)` -> `(B, C, ...)` (Gated PixelCNN Eq. 2, WaveNet Eq. 2)."""
    a, b = x.chunk(2, dim=1)
    return torch.tanh(a) * torch.sigmoid(b)
