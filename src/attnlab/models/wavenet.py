"""WaveNet (van den Oord et al. 2016c, "WaveNet: A Generative Model for Raw Audio", §2), with the
fast generation of Paine et al. 2016 ("Fast Wavenet Generation Algorithm").

Audio as a sequence of samples, p(x) = Π_t p(x_t | x_<t) (Eq. 1), each sample μ-law companded to
256 classes and predicted by a 256-way softmax (§2.2). Every conditional comes from one pass of
causal convolutions (§2.1): the output at t reads inputs ≤ t only. Dilation doubles the reach of
each layer (1, 2, 4, ..., 2^k, then again from 1: Figure 3), so the receptive field grows
exponentially with depth, (K-1) Σ dilations + 1 samples. Each layer is a gated unit
z = tanh(W_f * x + V_f h) ⊙ σ(W_g * x + V_g h) (Eqs. 2 and 3, h the global condition: here the
digit and, optionally, the speaker), with a residual connection to the next layer and a skip
connection to the output (§2.4, Figure 4).

Fast generation: generating naively reruns the whole receptive field for every new sample. But
a layer's output at t needs only its inputs at t, t - d, ..., t - (K-1) d, all computed already,
so each layer keeps a queue of its past inputs (`WaveNetCache`) and a new sample costs one step
per layer (`WaveNet.step`): O(layers), not O(receptive field).

Shape legend: B batch, T time, R residual channels, D dilation channels, S skip channels, V = 256.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.conv import CausalConv1d, gated_tanh

LEVELS = 256


@dataclass(frozen=True)
class WaveNetConfig:
    """The shape of a WaveNet; validated on construction."""

    kind: str = "wavenet"
    """Always "wavenet"."""
    residual_channels: int = 32
    """R: width of the residual stream between layers."""
    dilation_channels: int = 32
    """D: width of each gated unit (each dilated convolution makes 2D: filter and gate)."""
    skip_channels: int = 64
    """S: width of the skip connections summed into the output."""
    kernel: int = 2
    """K: taps of each dilated convolution (the paper's 2)."""
    layers_per_block: int = 8
    """Dilations 1, 2, ..., 2^(layers_per_block - 1) in each block."""
    n_blocks: int = 2
    """Blocks of dilations, one after another."""
    n_digits: int = 10
    """Global condition: the spoken digit (0 = unconditional)."""
    speakers: tuple[str, ...] = ()
    """Global condition: the speakers' names, in id order (empty = not conditioned on the speaker)."""

    def __post_init__(self) -> None:
        if self.kind != "wavenet":
            raise ValueError(f"kind must be 'wavenet', got {self.kind!r}")
        for name in ("residual_channels", "dilation_channels", "skip_channels", "layers_per_block", "n_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kernel < 2:
            raise ValueError(f"kernel must be >= 2 (a causal convolution reads the past), got {self.kernel}")
        if self.n_digits < 0:
            raise ValueError(f"n_digits must be >= 0, got {self.n_digits}")
        if len(set(self.speakers)) != len(self.speakers):
            raise ValueError(f"speakers must be distinct, got {list(self.speakers)}")

    @property
    def dilations(self) -> list[int]:
        """[1, 2, ..., 2^(L-1)] repeated n_blocks times (Figure 3; §2.1's "1, 2, ..., 512, 1, 2, ...")."""
        return [2**i for i in range(self.layers_per_block)] * self.n_blocks

    @property
    def receptive_field(self) -> int:
        """Samples the output at t depends on, t itself included: (K-1) Σ dilations + 1."""
        return (self.kernel - 1) * sum(self.dilations) + 1


class WaveNetCache:
    """Each layer's past inputs, for generating one sample at a time (Paine et al. 2016, Figure 2).

    queues[i] `(B, R, (K-1) d_i)`: a ring buffer of layer i's last (K-1) d_i inputs; zeros before
    the first sample, which is what the causal convolution's left padding reads too. `t` counts
    the samples fed so far."""

    def __init__(self, model: "WaveNet", batch_size: int) -> None:
        p = model.embedding.weight
        self.queues = [
            torch.zeros(batch_size, p.size(1), layer.conv.reach, device=p.device, dtype=p.dtype)
            for layer in model.layers
        ]
        self.t = 0


class WaveNetLayer(nn.Module):
    """Figure 4: dilated causal convolution, gated unit with the global condition, then a 1 × 1
    convolution to the residual stream and another to the skip connections."""

    def __init__(self, c: WaveNetConfig, dilation: int) -> None:
        super().__init__()
        self.conv = CausalConv1d(c.residual_channels, 2 * c.dilation_channels, c.kernel, dilation)
        self.residual = nn.Conv1d(c.dilation_channels, c.residual_channels, 1)
        self.skip = nn.Conv1d(c.dilation_channels, c.skip_channels, 1)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x `(B, R, T)`, condition `(B, 2D, 1)` (V h of Eq. 3) -> (next x `(B, R, T)`, skip `(B, S, T)`)."""
        z = gated_tanh(self.conv(x) + condition)  # (B, D, T)
        return x + self.residual(z), self.skip(z)

    def step(
        self, x: torch.Tensor, condition: torch.Tensor, queue: torch.Tensor, t: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step: x `(B, R)` the input at t; queue `(B, R, (K-1) d)` the inputs before it
        (updated in place). Returns (next x `(B, R)`, skip `(B, S)`)."""
        k, d, reach = self.conv.kernel_size[0], self.conv.dilation[0], self.conv.reach
        past = [(t - j * d) % reach for j in range(k - 1, 0, -1)]  # t - (K-1) d, ..., t - d in the ring
        taps = torch.cat([queue[:, :, past], x[:, :, None]], dim=2)  # (B, R, K), oldest first
        queue[:, :, t % reach] = x
        z = gated_tanh(self.conv.step(taps) + condition[:, :, 0])  # (B, D)
        # The 1 × 1 convolutions of one time step are matrix products.
        residual = F.linear(z, self.residual.weight[:, :, 0], self.residual.bias)
        return x + residual, F.linear(z, self.skip.weight[:, :, 0], self.skip.bias)


class WaveNet(nn.Module):
    """forward(x `(B, T)` μ-law classes, digits `(B,)`, speakers `(B,)` or None) -> logits `(B, 256, T)`:
    the output at t is the distribution of sample t + 1 given samples ≤ t."""

    def __init__(self, config: WaveNetConfig) -> None:
        super().__init__()
        self.config = c = config
        # The input layer: a one-hot sample times a weight matrix is an embedding lookup.
        self.embedding = nn.Embedding(LEVELS, c.residual_channels)
        self.layers = nn.ModuleList(WaveNetLayer(c, d) for d in c.dilations)
        # V of Eq. 3 for every layer at once: one row per condition value, split per layer.
        width = 2 * c.dilation_channels * len(self.layers)
        self.digit = nn.Embedding(c.n_digits, width) if c.n_digits else None
        self.speaker = nn.Embedding(len(c.speakers), width) if c.speakers else None
        self.head = nn.Sequential(
            nn.ReLU(), nn.Conv1d(c.skip_channels, c.skip_channels, 1), nn.ReLU(), nn.Conv1d(c.skip_channels, LEVELS, 1)
        )

    def conditions(self, digits: torch.Tensor | None, speakers: torch.Tensor | None, batch: int) -> list[torch.Tensor]:
        """Each layer's V h `(B, 2D, 1)` (zeros when unconditional)."""
        c = self.config
        total = self.embedding.weight.new_zeros(batch, 2 * c.dilation_channels * len(self.layers))
        for table, ids, what in ((self.digit, digits, "digits"), (self.speaker, speakers, "speakers")):
            if table is not None:
                if ids is None:
                    raise ValueError(f"this WaveNet is conditioned on {what}: pass them")
                total = total + table(ids)
        return [v[:, :, None] for v in total.chunk(len(self.layers), dim=1)]

    def forward(
        self, x: torch.Tensor, digits: torch.Tensor | None = None, speakers: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = self.embedding(x).transpose(1, 2)  # (B, R, T)
        return self.logits(h, self.conditions(digits, speakers, x.size(0)))

    def logits(self, h: torch.Tensor, conditions: list[torch.Tensor]) -> torch.Tensor:
        """The embedded input `(B, R, T)` -> logits `(B, 256, T)` (split from `forward` so that a test
        can take gradients with respect to the input)."""
        skips = 0
        for layer, condition in zip(self.layers, conditions, strict=True):
            h, s = layer(h, condition)
            skips = skips + s
        return self.head(skips)

    def new_cache(self, batch_size: int) -> WaveNetCache:
        return WaveNetCache(self, batch_size)

    def step(self, x: torch.Tensor, cache: WaveNetCache, conditions: list[torch.Tensor]) -> torch.Tensor:
        """Feed the samples at time `cache.t`, x `(B,)` classes; return the logits of the next `(B, 256)`."""
        h = self.embedding(x)  # (B, R)
        skips = 0
        for layer, condition, queue in zip(self.layers, conditions, cache.queues, strict=True):
            h, s = layer.step(h, condition, queue, cache.t)
            skips = skips + s
        cache.t += 1
        return self.head(skips[:, :, None])[:, :, 0]
