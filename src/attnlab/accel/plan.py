"""How a model decodes, decided once where it is prepared for decoding: `plan_decoding(model, ...)`.

Whether the decoding step is the fused C++ one, which weights that step reads, whether the eager
step goes through torch.compile and with which inductor options: one `DecodePlan`, made by the
entry point that loads the model (`attnlab sample`, `attnlab translate`, the server's worker, a
task's evaluation) and carried by the generator that decodes, never re-derived below it (as timm
asks `use_fused_attn()` once at construction and gpt-fast decides in `main`). The public decoding
functions that take `fused=` / `weights=` / `compile=` build their plan once, at their top, from
what the caller spelled out (no default resolved there: `fused` is a bool).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import nn

CPU_COMPILE_OPTIONS: dict[str, object] = {}
"""Inductor options of a compiled decoding step on a CPU. None by default: the wrapper that calls
the step's kernels written in C++ instead of Python (`cpp_wrapper`) gave no consistent gain and
compiles for longer (`benchmarks/decode_ab.py wrapper`; docs/history.md, "Decoding: stream the
weights, then fuse the step")."""


@dataclass(frozen=True)
class DecodePlan:
    """How one model's decoding step runs: the fused C++ step (`fused`: the GPT's, the
    encoder–decoder's for beam search or WaveNet's, whichever the model is), the weights that step
    reads (`attnlab.accel.fused.WEIGHT_FORMATS`; fp32 off the fused step), or torch.compile with
    `compile_options` (never both)."""

    fused: bool = False
    weights: str = "fp32"
    compile: bool = False
    compile_options: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.compile and self.fused:
            raise ValueError("compile and fused are two ways to run the decoding step; pick one")
        if self.weights != "fp32" and not self.fused:
            raise ValueError(f"{self.weights} weights are the fused step's (fused=True, with the cache)")


EAGER = DecodePlan()
"""PyTorch's step, fp32, not compiled."""


def plan_decoding(
    model: nn.Module, *, fused: bool | None = None, weights: str = "fp32", compile: bool = False
) -> DecodePlan:
    """The one decision of how `model` decodes. fused None (no flag): the fused step where it
    covers the model and is built here (no pause to compile), or wherever it covers the model for
    bf16, int8, int4 or q4_k weights (`attnlab.accel.fused.by_default`; WaveNet's step,
    `attnlab.accel.wavenet.by_default`); never beside `compile`. weights: kept for the fused step,
    fp32 without it. fused True or False: as asked (bf16, int8, int4 or q4_k weights without the fused
    step are refused). The inductor options follow the model's device."""
    if fused is None:
        fused = not compile and _fused_by_default(model, weights)
        weights = weights if fused else "fp32"
    options = dict(CPU_COMPILE_OPTIONS) if compile and _device_type(model) == "cpu" else {}
    return DecodePlan(fused, weights, compile, options)


def _fused_by_default(model: nn.Module, weights: str) -> bool:
    """The fused steps' own rules; their modules (and builders) load only where a default is asked."""
    from attnlab.models.wavenet import WaveNet

    if isinstance(model, WaveNet):
        from attnlab.accel import wavenet

        return wavenet.by_default(model)
    from attnlab.accel import fused

    return fused.by_default(model, weights)


def _device_type(model: nn.Module) -> str:
    p = next(model.parameters(), None)
    return p.device.type if p is not None else "cpu"  # no parameters: nothing leaves the CPU
