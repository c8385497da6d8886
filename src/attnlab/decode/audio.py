"""Generating audio sample by sample from a WaveNet, naively or with its cache (Paine et al. 2016).

Naive: at every step rerun the network over the last receptive-field samples and keep the last
output: O(receptive field × layers) per sample. Cached (`WaveNet.step`): each layer keeps its past
inputs, so a step runs each layer once on one time step: O(layers) per sample. Both see the same
inputs and compute the same function, so with the same random draws they produce the same
samples (tested). Fused (`attnlab.accel.wavenet`): the cached step as one C++ call, the same
function in plain loops; without it each sample is a dozen PyTorch operators a layer, whose call
overhead outweighs their arithmetic.

Shape legend: B batch, T time.
"""

import warnings
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from attnlab.accel.plan import DecodePlan, plan_decoding
from attnlab.data.audio import SILENCE
from attnlab.decode.sampling import Picker
from attnlab.models.wavenet import WaveNet


def generate_audio(
    model: WaveNet,
    digits: torch.Tensor | None,
    speakers: torch.Tensor | None,
    n_samples: int,
    pick: Picker,
    *,
    cached: bool = True,
    fused: bool | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """`n_samples` μ-law classes per sequence `(B, T)` long, after a silence, for digits / speakers `(B,)`.

    pick: logits `(B, 256)` -> classes `(B,)`. cached=False is the naive reference. fused: the
    cached step in C++ (`attnlab.accel.wavenet`; built on first use, or `WaveNet.step` with a
    warning where it cannot be built); None takes it where it is already built and covers the
    model (`attnlab.accel.plan.plan_decoding`, decided once here), False keeps `WaveNet.step`."""
    b = (digits if digits is not None else speakers).size(0)
    token = torch.full((b,), SILENCE, dtype=torch.long, device=model.embedding.weight.device)
    out = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            conditions = model.conditions(digits, speakers, b)
            cache = model.new_cache(b) if cached else None
            fast = _fused_step(model, conditions, plan_decoding(model, fused=fused)) if cached else None
            window = token[:, None]  # naive: the inputs so far, at most one receptive field
            rf = model.config.receptive_field
            for _ in tqdm(range(n_samples), disable=not progress, unit="sample", desc="generating", leave=False):
                if fast is not None:
                    logits = fast(token)
                elif cache is not None:
                    logits = model.step(token, cache, conditions)
                else:
                    logits = model.logits(model.embedding(window).transpose(1, 2), conditions)[:, :, -1]
                token = pick(logits)
                out.append(token)
                if cache is None:
                    window = torch.cat([window, token[:, None]], dim=1)[:, -rf:]
    finally:
        model.train(was_training)
    return torch.stack(out, dim=1) if out else token.new_zeros(b, 0)


def _fused_step(model: WaveNet, conditions: list[torch.Tensor], plan: DecodePlan) -> Callable | None:
    """The fused step for this generation where the plan asks for it, or None: `WaveNet.step`."""
    from attnlab.accel import wavenet

    if not plan.fused:
        return None
    if not wavenet.supports(model):
        warnings.warn(
            "the fused WaveNet step takes float32 or float64 on the CPU; generating with WaveNet.step", stacklevel=3
        )
        return None
    ext = wavenet.extension()
    return wavenet.FusedWaveNetStep(model, conditions, ext) if ext is not None else None
