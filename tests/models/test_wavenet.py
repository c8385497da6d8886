"""WaveNet: the receptive field computed from the config equals the one measured by gradient, and
generation with the per-layer cache (Paine et al. 2016) equals naive generation sample for sample."""

import warnings

import pytest
import torch

from attnlab.decode.audio import generate_audio
from attnlab.decode.sampling import sampling_picker
from attnlab.models.wavenet import WaveNet, WaveNetConfig

SMALL = dict(residual_channels=6, dilation_channels=5, skip_channels=7)


def wavenet(**kw) -> WaveNet:
    torch.manual_seed(0)
    return WaveNet(WaveNetConfig(**SMALL, **kw)).double()


def test_dilations_and_receptive_field_from_the_config():
    c = WaveNetConfig(layers_per_block=4, n_blocks=2, kernel=2)
    assert c.dilations == [1, 2, 4, 8, 1, 2, 4, 8]
    assert c.receptive_field == 1 + 15 * 2
    assert WaveNetConfig(layers_per_block=3, n_blocks=2, kernel=3).receptive_field == 1 + 2 * 7 * 2
    assert WaveNetConfig().receptive_field == 511  # the preset: 1..128, twice


@pytest.mark.parametrize("kernel, layers, blocks", [(2, 4, 2), (3, 3, 2), (2, 5, 1)])
def test_receptive_field_measured_by_gradient(kernel, layers, blocks):
    model = wavenet(kernel=kernel, layers_per_block=layers, n_blocks=blocks)
    rf = model.config.receptive_field
    t_len, t = rf + 20, rf + 10
    h = torch.randn(1, SMALL["residual_channels"], t_len, dtype=torch.float64, requires_grad=True)
    conditions = model.conditions(torch.tensor([3]), None, 1)
    model.logits(h, conditions)[0, :, t].sum().backward()
    seen = (h.grad[0].abs().sum(0) != 0).nonzero().flatten().tolist()
    assert seen == list(range(t - rf + 1, t + 1))


@pytest.mark.parametrize("speakers", [(), ("george", "jackson")])
def test_cached_steps_give_the_full_pass_logits(speakers):
    model = wavenet(kernel=3, layers_per_block=3, n_blocks=2, speakers=speakers)
    x = torch.randint(0, 256, (2, 40))
    digits, who = torch.tensor([1, 8]), torch.tensor([0, 1]) if speakers else None
    full = model(x, digits, who)  # (B, 256, T)
    cache, conditions = model.new_cache(2), model.conditions(digits, who, 2)
    steps = torch.stack([model.step(x[:, t], cache, conditions) for t in range(40)], dim=2)
    assert torch.allclose(steps, full, atol=1e-10)


@pytest.mark.parametrize("kernel, layers", [(2, 5), (3, 3)])
def test_cached_generation_equals_naive_generation_sample_for_sample(kernel, layers):
    model = wavenet(kernel=kernel, layers_per_block=layers, n_blocks=2, speakers=("a", "b"))
    digits, speakers = torch.tensor([2, 7, 7]), torch.tensor([0, 1, 0])
    out = {}
    for cached in (True, False):
        pick = sampling_picker(1.0, generator=torch.Generator().manual_seed(11))
        out[cached] = generate_audio(model, digits, speakers, 3 * model.config.receptive_field, pick, cached=cached)
    assert out[True].shape == (3, 3 * model.config.receptive_field)
    assert torch.equal(out[True], out[False])
    assert len(out[True].unique()) > 20  # really sampled, not a constant


def test_conditioning_is_required_and_changes_the_output():
    model = wavenet(layers_per_block=2, n_blocks=1)
    x = torch.randint(0, 256, (1, 10))
    with pytest.raises(ValueError, match="digits"):
        model(x)
    assert not torch.allclose(model(x, torch.tensor([0])), model(x, torch.tensor([1])))


@pytest.mark.parametrize(
    "kw, field", [({"kernel": 1}, "kernel"), ({"n_blocks": 0}, "n_blocks"), ({"speakers": ("a", "a")}, "speakers")]
)
def test_config_names_the_bad_field(kw, field):
    with pytest.raises(ValueError, match=field):
        WaveNetConfig(**kw)


def test_fused_step_asked_for_a_model_it_does_not_cover_warns_and_generates_with_the_step():
    model = wavenet(layers_per_block=3, n_blocks=1).to(torch.bfloat16)
    digits = torch.tensor([4])
    out = {}
    for fused in (True, False):
        pick = sampling_picker(1.0, generator=torch.Generator().manual_seed(2))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out[fused] = generate_audio(model, digits, None, 30, pick, fused=fused)
        assert [str(w.message) for w in caught if "fused WaveNet" in str(w.message)] == (
            ["the fused WaveNet step takes float32 or float64 on the CPU; generating with WaveNet.step"]
            if fused
            else []
        )
    assert torch.equal(out[True], out[False])
