"""WaveNet's fast generation (Paine et al. 2016) as one C++ call a sample (`wavenet_step.cpp`).

`attnlab.models.wavenet.WaveNet.step` is the reference: each layer reads its queue of past inputs
and runs once on one time step, O(layers) a sample rather than the naive O(receptive field). In
Python that is a dozen PyTorch operators a layer on tensors of a few dozen values, so call
overhead, not arithmetic, sets the pace. `FusedWaveNetStep` packs the weights once and runs the
whole step in plain loops, the per-layer queues rings that it writes in place.

It is built with PyTorch's C++ extension tools, like the fused GPT step (`attnlab kernels build`,
or on first use), for WaveNets in float32 or float64 on the CPU (`supports`);
`attnlab.decode.audio.generate_audio` takes it where it is built (`by_default`).
"""

import functools
from pathlib import Path
from types import ModuleType

import torch

from attnlab.accel.extensions import build
from attnlab.accel.extensions import is_built as is_built_here
from attnlab.models.wavenet import WaveNet

NAME = "attnlab_wavenet_step"
SOURCE = Path(__file__).with_name("wavenet_step.cpp")


@functools.cache
def extension() -> ModuleType | None:
    """The compiled step, built on first use; None (with a warning) when it cannot be built."""
    return build(NAME, SOURCE, what="fused WaveNet step", fallback="generating with WaveNet.step")


def is_built() -> bool:
    """Whether `extension()` loads a finished build (no pause to compile)."""
    return is_built_here(NAME, SOURCE)


def supports(model: torch.nn.Module) -> bool:
    """Whether the fused step computes this model's generation step: a WaveNet in float32 or
    float64 on the CPU."""
    p = next(model.parameters(), None)
    return isinstance(model, WaveNet) and p is not None and p.device.type == "cpu" and p.dtype in FLOATS


FLOATS = (torch.float32, torch.float64)


def by_default(model: torch.nn.Module) -> bool:
    """Whether generating from `model` without a flag takes the fused step: it is built here (no
    pause to compile) and covers the model."""
    return supports(model) and is_built()


class FusedWaveNetStep:
    """`WaveNet.step` for one generation, as one C++ call: `step(x (B,))` feeds the samples at the
    next time step and returns the logits of the ones after `(B, 256)`.

    conditions: each layer's V h `(B, 2D, 1)`, as `WaveNet.conditions` gives them. The weights
    are copied and packed when the step is made; later changes to the model do not reach it."""

    def __init__(self, model: WaveNet, conditions: list[torch.Tensor], ext: ModuleType) -> None:
        if not supports(model):
            raise ValueError("the fused WaveNet step takes a WaveNet in float32 or float64 on the CPU")
        c, layers = model.config, model.layers
        batch = conditions[0].size(0)
        with torch.no_grad():
            # (L, 2D, K R): the K taps of each output side by side, oldest first
            conv = torch.stack(
                [layer.conv.weight.permute(0, 2, 1).reshape(layer.conv.out_channels, -1) for layer in layers]
            )
            bias_cond = torch.stack(
                [layer.conv.bias + v[:, :, 0] for layer, v in zip(layers, conditions, strict=True)], 1
            )
            out = torch.stack(
                [torch.cat([layer.residual.weight[:, :, 0], layer.skip.weight[:, :, 0]]) for layer in layers]
            )
            out_bias = torch.stack([torch.cat([layer.residual.bias, layer.skip.bias]) for layer in layers])
            head = [
                model.head[1].weight[:, :, 0],
                model.head[1].bias,
                model.head[3].weight[:, :, 0],
                model.head[3].bias,
            ]
            p = model.embedding.weight
            self.rings = [p.new_zeros(batch, layer.conv.reach, c.residual_channels) for layer in layers]
            tensors = [p, conv, bias_cond, out, out_bias]
            self._step = ext.WaveNetStep(
                *[t.detach().contiguous().clone() for t in tensors],
                [t.detach().contiguous().clone() for t in head],
                self.rings,
                c.dilations,
                c.kernel,
            )
        self.t = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self._step.step(x, self.t)
        self.t += 1
        return logits
