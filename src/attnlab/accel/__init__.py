"""attnlab's tuned code, apart from the reference code of `attnlab.nn` and `attnlab.models`.

- `kernels` (kernels.cpp): C++ training kernels for the CPU: GELU, self-attention, whole pre-norm
  blocks and a GPT's stack, the cross-entropy, and ClippingAdamW's step (`attnlab.train.optim`).
- `fused` (fused_step.cpp): a GPT's decoding step, and the encoder–decoder's for beam search, as
  one C++ call each.
- `projection`: the streamed and reordered products of decoding's few rows.
- `extensions`: building the C++ sources, one build per installation (`ATTNLAB_MARCH`).
- `plan`: how a model decodes (fused step, stored weights, torch.compile), decided once where it
  is loaded: `plan_decoding(model, ...)` -> `DecodePlan`, which the decoders carry.
- `rules`: the hardware rules the reference code leaves to its caller (attention's formula for
  bf16 training on a CPU, BERT's dropping of a mask that hides nothing), set on a model's modules
  by `prepare_for_training(model)`, which the trainer calls for every model it trains.

A model takes them in one explicit call: `for_training(model)` (the trainer, where
`train.fused_kernels` resolves on) and `for_decoding(model)` (the decoders), each returning what
it covered and why not the rest (`Applied`). Nothing in `attnlab.nn` or `attnlab.models` imports
this package.
"""

from attnlab.accel.applied import Applied, reference_cross_entropy
from attnlab.accel.coverage import uncovered_parts
from attnlab.accel.decoding import for_decoding
from attnlab.accel.plan import DecodePlan, plan_decoding
from attnlab.accel.rules import prepare_for_training
from attnlab.accel.training import for_training

__all__ = [
    "Applied",
    "DecodePlan",
    "for_decoding",
    "for_training",
    "plan_decoding",
    "prepare_for_training",
    "reference_cross_entropy",
    "uncovered_parts",
]
