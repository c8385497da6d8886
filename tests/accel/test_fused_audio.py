"""attnlab.accel.wavenet: WaveNet's generation step in C++ against the model's own paths.

The references are `WaveNet.step` (itself tested against the full forward pass) and the naive
generation that reruns the receptive field for every sample: the fused step must give the same
logits to rounding and, with the same random draws, the same samples. The extension is built once
per machine (about a minute; cached by torch.utils.cpp_extension).
"""

import pytest
import torch

from attnlab.accel.wavenet import FusedWaveNetStep, extension
from attnlab.decode.audio import generate_audio
from attnlab.decode.sampling import sampling_picker
from attnlab.models.wavenet import WaveNet, WaveNetConfig
from tolerance import assert_float32_close

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(extension() is None, reason="the fused WaveNet step could not be built here"),
]

SMALL = dict(residual_channels=6, dilation_channels=5, skip_channels=7)


def wavenet(dtype: torch.dtype, **kw) -> WaveNet:
    torch.manual_seed(0)
    return WaveNet(WaveNetConfig(**SMALL, **kw)).to(dtype).eval()


def wavenet_sums(c: WaveNetConfig) -> dict[str, int]:
    """`assert_float32_close`'s reduction and depth: per layer the convolution's K R terms and the
    1 × 1 convolutions' D; then the skips summed over the layers and the head's two products."""
    layers = len(c.dilations)
    width = max(c.kernel * c.residual_channels, c.dilation_channels, c.skip_channels, layers)
    return dict(reduction=width, depth=2 * layers + 3)


@pytest.mark.parametrize("kernel, layers, blocks", [(2, 4, 2), (3, 3, 2)])
def test_fused_step_logits_equal_the_model_step(kernel, layers, blocks):
    model = wavenet(torch.float32, kernel=kernel, layers_per_block=layers, n_blocks=blocks, speakers=("a", "b"))
    digits, speakers = torch.tensor([1, 8]), torch.tensor([0, 1])
    x = torch.randint(0, 256, (2, 3 * model.config.receptive_field), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        conditions = model.conditions(digits, speakers, 2)
        cache, fused = model.new_cache(2), FusedWaveNetStep(model, conditions, extension())
        for t in range(x.size(1)):  # three receptive fields: every ring wraps around
            want = model.step(x[:, t], cache, conditions)
            assert_float32_close(fused(x[:, t]), want, **wavenet_sums(model.config))
        for ring, queue in zip(fused.rings, cache.queues, strict=True):
            # the same inputs in the same slots (the first layer's, the embeddings, exactly)
            assert_float32_close(ring, queue.transpose(1, 2), **wavenet_sums(model.config))
        assert torch.equal(fused.rings[0], cache.queues[0].transpose(1, 2))


@pytest.mark.parametrize("kernel, layers", [(2, 5), (3, 3)])
def test_fused_generation_equals_naive_generation_sample_for_sample(kernel, layers):
    model = wavenet(torch.float64, kernel=kernel, layers_per_block=layers, n_blocks=2, speakers=("a", "b"))
    digits, speakers = torch.tensor([2, 7, 7]), torch.tensor([0, 1, 0])
    n = 3 * model.config.receptive_field
    out = {}
    for how in ("fused", "naive"):
        pick = sampling_picker(1.0, generator=torch.Generator().manual_seed(11))
        out[how] = generate_audio(model, digits, speakers, n, pick, cached=how == "fused", fused=True)
    assert torch.equal(out["fused"], out["naive"])
    assert len(out["fused"].unique()) > 20  # really sampled, not a constant


def test_the_lectures_block_in_float32_samples_as_the_naive_path():
    """Dilations 1, 2, ..., 512 (receptive field 1,024), float32 as generated in practice, past
    one receptive field so that the naive path's window is full and every ring has wrapped."""
    model = wavenet(torch.float32, layers_per_block=10, n_blocks=1)
    assert model.config.receptive_field == 1024
    digits = torch.tensor([3, 9])
    out = {}
    for how in ("fused", "naive"):
        pick = sampling_picker(1.0, generator=torch.Generator().manual_seed(5))
        out[how] = generate_audio(model, digits, None, 1100, pick, cached=how == "fused", fused=True)
    assert torch.equal(out["fused"], out["naive"])


def test_the_step_keeps_the_weights_it_packed():
    model = wavenet(torch.float32, layers_per_block=2, n_blocks=1)
    token = torch.tensor([128])
    with torch.inference_mode():
        conditions = model.conditions(torch.tensor([4]), None, 1)
        want = model.step(token, model.new_cache(1), conditions)
        fused = FusedWaveNetStep(model, conditions, extension())
        model.head[3].bias.add_(1.0)  # a later change to the model does not reach the step
        assert_float32_close(fused(token), want, **wavenet_sums(model.config))
