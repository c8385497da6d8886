"""A pre-norm GPT's decoding step as one C++ call on the CPU (`fused_step.cpp`).

An eager decoding step of a small GPT is ~100 PyTorch operators, and at batch 1 their call
overhead is as large as the arithmetic; torch.compile fuses the elementwise ones but still calls
the products one by one. The fused step is the whole step in plain loops: one call per token. It
is built with PyTorch's C++ extension tools on first use (~1 minute, cached afterwards in
`TORCH_EXTENSIONS_DIR`, by default ~/.cache/torch_extensions), so it is opt-in:
`generate_tokens(..., fused=True)`, `attnlab sample --fused`, `attnlab bench --fused`.

What it covers: `attnlab.models.GPT` with pre-norm blocks (GPT-2's order), any positional encoding
(all of attnlab's are added to the embeddings, which stay in Python), the activations of
`attnlab.nn.ACTIVATIONS`, with or without biases, fp32 on the CPU. `supports` says whether a
model qualifies; the decoding loop falls back to the model's own forward otherwise.
"""

import functools
import os
import sysconfig
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from attnlab.nn import KVCache

ACTIVATION_CODES = {"gelu": 0, "gelu_tanh": 1, "relu": 2}
"""The C++ side's numbering of the feed-forward activations."""


@functools.cache
def extension() -> ModuleType | None:
    """The compiled step, built on first use; None (with a warning) when it cannot be built."""
    from torch.utils import cpp_extension

    source = Path(__file__).with_name("fused_step.cpp")
    # The build runs `ninja`, which the `ninja` package installs beside this interpreter: on PATH
    # only in an activated environment.
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])
    try:
        return cpp_extension.load(
            name="attnlab_fused_step",
            sources=[str(source)],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as e:  # no compiler, no ninja, a build error: decode with the model instead
        warnings.warn(
            f"the fused decoding step could not be built ({type(e).__name__}: {e}); decoding eagerly", stacklevel=2
        )
        return None


def supports(model: nn.Module, cache: list[KVCache]) -> bool:
    """Whether the fused step computes this model's decoding step: a pre-norm GPT, fp32, on the
    CPU, in inference, with a known activation and contiguous caches."""
    from attnlab.models import GPT

    if not isinstance(model, GPT):
        return False
    c = model.config
    p = model.lm_head.weight
    return (
        c.norm == "pre"
        and c.activation in ACTIVATION_CODES
        and p.device.type == "cpu"
        and p.dtype == torch.float32
        and not model.training
        and all(layer.k.is_contiguous() and layer.v.is_contiguous() for layer in cache)
    )


def _bias(layer: nn.Module) -> torch.Tensor:
    return layer.bias if layer.bias is not None else torch.empty(0)


class FusedStep:
    """The decoding step of a GPT that `supports` accepts, bound to one generation's cache:
    `step(token (B, 1), cache, position)` -> logits `(B, 1, V)`, the new keys and values written
    at `position` of the cache (the same cache, whose buffers the C++ side holds)."""

    def __init__(self, model: nn.Module, ext: ModuleType, cache: list[KVCache]) -> None:
        params: list[torch.Tensor] = []
        for block in model.blocks:
            layers = (block.norm1, block.attn.in_proj, block.attn.out_proj, block.norm2, block.ffn.fc1, block.ffn.fc2)
            for layer in layers:
                params += [layer.weight.detach(), _bias(layer).detach()]
        params += [model.final_norm.weight.detach(), _bias(model.final_norm).detach(), model.lm_head.weight.detach()]
        c = model.config
        with torch.inference_mode():  # every position's vector, whatever the encoding (all are added)
            positions = model.positions(torch.arange(c.block_size)).contiguous()
        self.cache = cache
        self.step = ext.GPTStep(
            params,
            model.token_embedding.weight.detach(),
            positions,
            [layer.k for layer in cache],
            [layer.v for layer in cache],
            c.n_head,
            c.layer_norm_eps,
            ACTIVATION_CODES[c.activation],
        )

    def __call__(self, token: torch.Tensor, cache: list[KVCache], position: int) -> torch.Tensor:
        if cache is not self.cache:
            raise ValueError("this fused step is bound to another cache")
        logits = self.step.step(token.view(-1), position)
        for layer in cache:
            layer.length = position + 1
        return logits.unsqueeze(1)
