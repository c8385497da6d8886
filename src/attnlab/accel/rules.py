"""Hardware rules the reference code leaves to its caller, set on a model where it is prepared for
training: `prepare_for_training(model)`.

`attnlab.nn` computes attention with PyTorch's fused kernel wherever that is the same function;
which of the two paths is faster depends on the device, the dtype and whether gradients flow,
which is this package's business. The trainer prepares every model it trains (and
`for_training` every model it covers), so the rule is decided once, on the modules, and the
reference code only asks the hooks it was given (`MultiHeadAttention.prefer_formula`,
`Bert.drop_full_mask`).
"""

import torch
from torch import nn

from attnlab.models.bert import Bert
from attnlab.nn import MultiHeadAttention

FORMULA_MAX_KEYS = 128
"""Up to this many keys, bf16 training on a CPU takes the formula (see `formula_trains_faster`)."""


def formula_trains_faster(q: torch.Tensor, t_k: int) -> bool:
    """Whether the formula's three products beat PyTorch's fused kernel for this step, for
    queries q `(B, H, Tq, D)` and t_k keys: in bf16 on a CPU, with gradients, at most
    FORMULA_MAX_KEYS keys. There the fused (flash) kernel's backward walks small blocks in plain
    loops while the formula's products run on the CPU's bf16 matrix units
    (benchmarks/attention_cpu.py; the figures in BENCHMARKS.md, "Tuned CPU paths"). Forward alone
    (no gradients) the fused kernel is the faster, as it is in fp32."""
    return (
        q.device.type == "cpu"
        and q.dtype == torch.bfloat16
        and t_k <= FORMULA_MAX_KEYS
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def prepare_for_training(model: nn.Module) -> nn.Module:
    """`model` with the hardware rules of training set on its modules, in place (parameters and
    state dict unchanged): each attention layer's `prefer_formula`, and on the CPU BERT's
    `drop_full_mask` (seeing that a mask hides nothing is free there; on a GPU it waits for the
    device). Decided for the device the model is on: prepare it after moving it. Preparing twice
    is preparing once."""
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.prefer_formula = formula_trains_faster
        elif isinstance(module, Bert):
            module.drop_full_mask = on_cpu
    return model
