"""attnlab's tuned code, apart from the reference code of `attnlab.nn` and `attnlab.models`.

- `kernels` (kernels.cpp): C++ training kernels for the CPU: GELU, self-attention, whole pre-norm
  blocks and a GPT's stack, the cross-entropy, and ClippingAdamW's step (`attnlab.train.optim`).
- `fused` (fused_step.cpp): a GPT's decoding step, and the encoder–decoder's for beam search, as
  one C++ call each.
- `projection`: the streamed and reordered products of decoding's few rows.
- `extensions`: building the C++ sources, one build per installation (`ATTNLAB_MARCH`).

A model takes them in one explicit call: `for_training(model)` (the trainer, where
`train.fused_kernels` resolves on) and `for_decoding(model)` (the decoders), each returning what
it covered and why not the rest (`Applied`). Nothing in `attnlab.nn` or `attnlab.models` imports
this package.
"""

from attnlab.accel.applied import Applied, reference_cross_entropy
from attnlab.accel.coverage import uncovered_parts
from attnlab.accel.decoding import for_decoding
from attnlab.accel.training import for_training

__all__ = ["Applied", "for_decoding", "for_training", "reference_cross_entropy", "uncovered_parts"]
