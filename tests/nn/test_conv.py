"""Masked and causal convolutions against PyTorch's plain convolutions on explicitly masked or padded inputs."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn.conv import (
    CausalConv1d,
    MaskedConv2d,
    gated_tanh,
    horizontal_mask,
    raster_mask,
    shift_down,
    vertical_mask,
)


def test_masks_are_the_papers():
    assert raster_mask(3, "A").int().tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert raster_mask(3, "B").int().tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0]]
    assert vertical_mask(3).int().tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0]]
    assert horizontal_mask(5, include_centre=False).int()[2].tolist() == [1, 1, 0, 0, 0]
    assert horizontal_mask(5, include_centre=True).int().sum() == 3
    with pytest.raises(ValueError, match="mask_type"):
        raster_mask(3, "C")


@pytest.mark.parametrize(
    "mask",
    [raster_mask(7, "A"), raster_mask(3, "B"), vertical_mask(5), horizontal_mask(5, True), horizontal_mask(3, False)],
)
def test_masked_conv_is_a_same_size_conv_with_the_masked_taps_zeroed(mask):
    torch.manual_seed(0)
    conv = MaskedConv2d(3, 4, mask).double()
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    # Reference: the full K × K kernel with the cropped weights in the mask's place, padding K // 2.
    k = mask.shape[0]
    full = torch.zeros(4, 3, k, k, dtype=torch.float64)
    rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
    full[:, :, rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1] = conv.weight.detach()
    full = full * mask.double()
    expected = F.conv2d(x, full, conv.bias.detach(), padding=k // 2)
    assert torch.allclose(conv(x), expected, atol=1e-12)


def test_shift_down_moves_rows_down_one():
    x = torch.arange(12.0).view(1, 1, 4, 3)
    assert shift_down(x)[0, 0].tolist() == [[0, 0, 0], [0, 1, 2], [3, 4, 5], [6, 7, 8]]


@pytest.mark.parametrize("kernel, dilation", [(2, 1), (2, 4), (3, 2)])
def test_causal_conv_is_a_left_padded_dilated_conv_and_steps_agree(kernel, dilation):
    torch.manual_seed(0)
    conv = CausalConv1d(3, 5, kernel, dilation).double()
    x = torch.randn(2, 3, 20, dtype=torch.float64)
    pad = (kernel - 1) * dilation
    expected = F.conv1d(F.pad(x, (pad, 0)), conv.weight, conv.bias, dilation=dilation)
    assert torch.allclose(conv(x), expected, atol=1e-12)
    padded = F.pad(x, (pad, 0))
    for t in range(20):  # output t from its K taps t - (K-1) d, ..., t
        taps = padded[:, :, t : t + pad + 1 : dilation]
        assert torch.allclose(conv.step(taps), expected[:, :, t], atol=1e-12)


def test_gated_unit_is_tanh_times_sigmoid():
    x = torch.randn(2, 6, 4)
    assert torch.allclose(gated_tanh(x), torch.tanh(x[:, :3]) / (1 + torch.exp(-x[:, 3:])), atol=1e-6)
