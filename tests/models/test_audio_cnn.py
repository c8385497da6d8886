"""The spectrogram CNN: the log spectrogram against the DFT written out, per-recording
standardisation over its own frames, shapes, and a batch's padding changing nothing."""

import math

import pytest
import torch

from attnlab.models.audio_cnn import SpectrogramCNN, SpectrogramCNNConfig, log_spectrogram, standardize


def test_log_spectrogram_is_the_log_power_of_hann_windowed_frames():
    torch.manual_seed(0)
    x = torch.randn(1, 1000, dtype=torch.float64)
    got = log_spectrogram(x, 256, 80)  # (1, 129, 13)
    assert got.shape == (1, 129, (1000 - 256) // 80 + 1)
    # Reference: frame 5 by hand: samples 400..655, Hann window, |DFT|².
    frame = x[0, 5 * 80 : 5 * 80 + 256] * torch.hann_window(256, dtype=torch.float64)
    k, n = torch.arange(129, dtype=torch.float64)[:, None], torch.arange(256, dtype=torch.float64)[None]
    re, im = (
        (frame * torch.cos(2 * math.pi * k * n / 256)).sum(1),
        (frame * torch.sin(2 * math.pi * k * n / 256)).sum(1),
    )
    assert torch.allclose(got[0, :, 5], torch.log(re**2 + im**2 + 1e-6), atol=1e-8)


def test_standardize_uses_each_recordings_own_frames():
    spec = torch.randn(2, 4, 10) * 3 + 5
    out = standardize(spec, torch.tensor([10, 6]))
    assert torch.allclose(out[0].mean(), torch.tensor(0.0), atol=1e-5)
    assert torch.allclose(out[1, :, :6].mean(), torch.tensor(0.0), atol=1e-5)
    assert torch.allclose(out[1, :, :6].std(unbiased=False), torch.tensor(1.0), atol=1e-3)
    assert torch.equal(out[1, :, 6:], torch.zeros(4, 4))


def test_shapes_and_padding():
    torch.manual_seed(0)
    model = SpectrogramCNN(SpectrogramCNNConfig()).eval()
    x, lengths = torch.randn(3, 6000) * 0.1, torch.tensor([6000, 3000, 1500])
    for row, n in enumerate(lengths):
        x[row, n:] = 0
    batched = model(x, lengths)
    alone = torch.cat([model(x[row : row + 1, :n], n[None]) for row, n in enumerate(lengths)])
    assert batched.shape == (3, 10)
    assert torch.allclose(batched, alone, atol=1e-5)  # the padding changes nothing
    x[1, 3000:] = 1.0  # not even loud padding
    assert torch.allclose(model(x, lengths)[1], alone[1], atol=1e-5)


@pytest.mark.parametrize(
    "kw, field", [({"hop": 0}, "hop"), ({"channels": ()}, "channels"), ({"dropout": -0.1}, "dropout")]
)
def test_config_names_the_bad_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SpectrogramCNNConfig(**kw)
