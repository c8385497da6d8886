"""The streamed and reordered projections applied to a model for eager decoding: `for_decoding(model)`.

A decoding step multiplies a few rows by every weight matrix; `attnlab.accel.projection.Linear`
takes faster routes for those products on a CPU, with the same parameters and the same function.
`for_decoding` gives the projections that a decoding step multiplies by (attention, the
feed-forward layers, the language models' heads) that class in place, and the cross-attention
of an encoder–decoder model its sliced products through `projection.linear`.
"""

from torch import nn

from attnlab.accel.applied import Applied
from attnlab.accel.projection import Linear, linear
from attnlab.models import GPT, Seq2SeqTransformer
from attnlab.nn import DecoderBlock, FeedForward, GatedFeedForward, MultiHeadAttention

PROJECTIONS: dict[type, tuple[str, ...]] = {
    MultiHeadAttention: ("in_proj", "out_proj"),
    FeedForward: ("fc1", "fc2"),
    GatedFeedForward: ("fc1", "fc2"),
    GPT: ("embedding_proj", "head_proj", "lm_head"),
    Seq2SeqTransformer: ("output",),
}
"""The linear layers, by the class that holds them, that take the decoding routes."""


class DecodingCrossAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose cross-attention products (the query rows and the memory rows of
    `in_proj`, sliced by its own `project_query` and `project_memory`) go through
    `projection.linear`: a one-row product streams the weights."""

    cross_linear = staticmethod(linear)


def for_decoding(model: nn.Module) -> Applied:
    """The decoding routes on `model`'s projections (`PROJECTIONS`) and its encoder–decoder
    cross-attention, which change class in place (parameters and state dict unchanged; the same
    function, rounded as the faster product rounds). Applying twice is applying once."""
    covered = []
    for name, module in model.named_modules():
        holds = next((names for kind, names in PROJECTIONS.items() if isinstance(module, kind)), ())
        for child in holds:
            layer = getattr(module, child, None)
            if type(layer) is nn.Linear:
                layer.__class__ = Linear
            if isinstance(layer, Linear):
                covered.append(f"{name}.{child}" if name else child)
        if isinstance(module, DecoderBlock) and type(module.cross_attn) is MultiHeadAttention:
            module.cross_attn.__class__ = DecodingCrossAttention
        if isinstance(module, DecoderBlock):
            covered.append(f"{name}.cross_attn")
    return Applied(model, tuple(covered))
