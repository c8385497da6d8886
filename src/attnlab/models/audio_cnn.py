"""A spoken-digit classifier: a small CNN over the log-power spectrogram of the waveform.

The judge of WaveNet's samples (WaveNet §3.1 asks listeners; we ask a classifier trained on real
recordings, as the Inception score asks an image classifier): the spectrogram is a picture of
frequency against time, where a digit is a shape; 3 × 3 convolutions with max-pooling find it, and
an average over the (variable) number of frames gives one vector per recording.

Shape legend: B batch, T samples, F frequency bins, N frames, C channels, L classes.
"""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SpectrogramCNNConfig:
    """The shape of the digit classifier; validated on construction."""

    kind: str = "spectrogram-cnn"
    """Always "spectrogram-cnn"."""
    n_fft: int = 256
    """Samples per analysis window (32 ms at 8 kHz): n_fft // 2 + 1 frequency bins."""
    hop: int = 80
    """Samples between windows (10 ms at 8 kHz)."""
    channels: tuple[int, ...] = (16, 32, 64)
    """Output channels of each 3 × 3 convolution + ReLU + 2 × 2 max-pool stage."""
    dropout: float = 0.2
    """Dropout before the classifier."""
    n_classes: int = 10

    def __post_init__(self) -> None:
        if self.kind != "spectrogram-cnn":
            raise ValueError(f"kind must be 'spectrogram-cnn', got {self.kind!r}")
        for name in ("n_fft", "hop", "n_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.channels or min(self.channels) < 1:
            raise ValueError(f"channels must be a non-empty list of counts >= 1, got {list(self.channels)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def frames(self, lengths: torch.Tensor) -> torch.Tensor:
        """Whole analysis windows in each recording `(B,)` long (at least 1)."""
        return ((lengths - self.n_fft) // self.hop + 1).clamp(min=1)


def log_spectrogram(x: torch.Tensor, n_fft: int, hop: int) -> torch.Tensor:
    """Waveforms `(B, T)` in [-1, 1] -> log power `(B, F, N)` of Hann-windowed frames, each wholly
    inside the waveform (no centring pad: a recording's frames never read past its end)."""
    window = torch.hann_window(n_fft, device=x.device, dtype=x.dtype)
    spec = torch.stft(x, n_fft, hop, window=window, center=False, return_complex=True)
    return torch.log(spec.abs() ** 2 + 1e-6)


def valid_frames(frames: torch.Tensor, n: int) -> torch.Tensor:
    """Bool `(B, 1, n)`: True on each recording's own first `frames` `(B,)` frames."""
    return (torch.arange(n, device=frames.device)[None] < frames[:, None])[:, None]


def standardize(spec: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """Each recording's spectrogram `(B, F, N)` to zero mean and unit variance over its own first
    `frames` `(B,)` frames, zero after them: loudness and the padding of a batch do not matter."""
    valid = valid_frames(frames, spec.size(-1))  # (B, 1, N)
    count = valid.sum((1, 2), keepdim=True) * spec.size(1)
    mean = (spec * valid).sum((1, 2), keepdim=True) / count
    var = (((spec - mean) * valid) ** 2).sum((1, 2), keepdim=True) / count
    return (spec - mean) / (var + 1e-5).sqrt() * valid


class SpectrogramCNN(nn.Module):
    """forward(x `(B, T)` float waveforms, zero-padded; lengths `(B,)` long) -> logits `(B, L)`.
    A batch's padding does not change a recording's logits: the frames past its end are zeroed
    after every stage, as the convolutions' own zero padding would be, and the mean is over its frames."""

    def __init__(self, config: SpectrogramCNNConfig) -> None:
        super().__init__()
        self.config = c = config
        widths = (1, *c.channels)
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
            for i, o in zip(widths, widths[1:], strict=False)
        )
        width = widths[-1]
        self.classifier = nn.Sequential(nn.Dropout(c.dropout), nn.Linear(width, c.n_classes))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        c = self.config
        frames = c.frames(lengths)  # (B,)
        h = standardize(log_spectrogram(x, c.n_fft, c.hop), frames)[:, None]  # (B, 1, F, N)
        for stage in self.stages:
            h = stage(h)  # (B, C, F / 2, N / 2)
            frames = (frames // 2).clamp(min=1)
            h = h * valid_frames(frames, h.size(-1))[:, :, None]  # (B, 1, 1, N): padding back to zeros
        h = h.amax(dim=2)  # (B, C, N): the strongest response over frequency, per frame
        pooled = h.sum(-1) / frames[:, None]  # (B, C): the mean over its own frames
        return self.classifier(pooled)
