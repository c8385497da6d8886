"""Which parts of a model attnlab's tuned code computes: the questions the kernels and the fused
steps ask of a model, asked here so that `attnlab.nn` and `attnlab.models` need not answer them.

The C++ training kernels and the encoder–decoder's fused step compute the paper's parts as GPT-2
arranges them: full multi-head attention with positions at the input, LayerNorm, a dense
feed-forward layer, each block applied once. Anything else (positions inside attention, a sparse
pattern, grouped-query heads, RMSNorm or ReZero, a gated or mixture feed-forward, shared blocks,
factorized embeddings) runs PyTorch's reference code.

The GPT's fused decoding step also computes today's parts (`decodes_gpt`): RMSNorm, gated
feed-forward layers (SwiGLU, GeGLU, ...), mixtures of experts without a capacity limit
(Mixtral's), rotary positions and grouped-query or multi-query attention: Llama's, Mistral's and
Mixtral's blocks. ALiBi and relative positions, sparse patterns, ReZero, shared blocks and
factorized embeddings still run PyTorch's code.
"""

from torch import nn

from attnlab.models import GPT
from attnlab.nn import (
    DecoderBlock,
    FeedForward,
    GatedFeedForward,
    MixtureOfExperts,
    MultiHeadAttention,
    RMSNorm,
    TransformerBlock,
)
from attnlab.nn.positions import RotaryPositions


def plain_heads(attn: MultiHeadAttention) -> bool:
    """The heads the C++ steps compute: width / heads each, scores scaled by 1/√D, no norm over
    the queries and keys, and biases on all four projections or on none (not Qwen2's q/k/v
    biases alone, Qwen3's q/k norms or Gemma's sizes and scale)."""
    return (
        attn.q_dim == attn.d_model
        and attn.scale is None
        and attn.q_norm is None
        and attn.k_norm is None
        and (getattr(attn.in_proj, "bias", None) is None) == (getattr(attn.out_proj, "bias", None) is None)
    )


def covers_attention(attn: nn.Module) -> bool:
    """Full attention with positions only at the input, one key and value head per query head."""
    return (
        isinstance(attn, MultiHeadAttention)
        and plain_heads(attn)
        and attn.positions is None
        and attn.pattern is None
        and attn.n_kv_heads == attn.n_heads
    )


def covers_block(block: TransformerBlock) -> bool:
    """LayerNorms, attention that `covers_attention` accepts and a dense feed-forward layer (either
    order of the norms: the training kernels take pre-norm blocks, and say so per call)."""
    return (
        isinstance(block, TransformerBlock)  # not the Evolved Transformer's cells
        and block.order != "sandwich"
        and isinstance(block.norm1, nn.LayerNorm)
        and isinstance(block.gate1, nn.Identity)
        and covers_attention(block.attn)
        and isinstance(block.ffn, FeedForward)
    )


def covers_decoder_block(block: DecoderBlock) -> bool:
    """An encoder–decoder block of LayerNorms, covered attention both ways and a dense feed-forward layer."""
    return (
        isinstance(block, DecoderBlock)
        and isinstance(block.norm1, nn.LayerNorm)
        and isinstance(block.gate1, nn.Identity)
        and covers_attention(block.self_attn)
        and covers_attention(block.cross_attn)
        and isinstance(block.ffn, FeedForward)
    )


def shared_blocks(model: nn.Module) -> set[int]:
    """The ids of the modules that a list of `model` holds at more than one position (a block
    applied in several layers: the kernels keep one layer's activations per block)."""
    shared = set()
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            seen: set[int] = set()
            for child in module:
                if id(child) in seen:
                    shared.add(id(child))
                seen.add(id(child))
    return shared


def covers_gpt(model: GPT) -> bool:
    """GPT-2's parts throughout: covered blocks, none shared, no factorized, adaptive or mixture
    embeddings and softmaxes."""
    return (
        all(covers_block(block) for block in model.blocks)
        and not shared_blocks(model)
        and isinstance(model.embedding_proj, nn.Identity)
        and isinstance(model.token_embedding, nn.Embedding)
        and isinstance(model.lm_head, nn.Linear)
        and model.step_signal is None
        and plain_ends(model)
    )


def plain_ends(model: GPT) -> bool:
    """Token embeddings and logits as they are: not scaled by √C nor soft-capped (Gemma's)."""
    return not model.config.scale_embeddings and model.config.logit_softcap is None


def decodes_attention(attn: nn.Module) -> bool:
    """Attention the fused GPT step computes: full, positions at the input or rotary, any number
    of key/value heads (grouped-query and multi-query attention)."""
    return (
        isinstance(attn, MultiHeadAttention)
        and plain_heads(attn)
        and attn.pattern is None
        and (attn.positions is None or plain_rotary(attn.positions))
    )


def plain_rotary(positions: nn.Module) -> bool:
    """Rotary positions over the whole head with one table of angles (not Phi's partial rotary,
    nor LongRoPE's two sets of frequencies and scaled rotations, dynamic NTK's or YaRN's)."""
    return (
        isinstance(positions, RotaryPositions)
        and positions.rotary_dims == positions.head_dim
        and positions.scaling.one_table
    )


def decodes_feedforward(ffn: nn.Module) -> bool:
    """A dense or gated feed-forward layer, or a mixture of experts with no capacity limit (whose
    routing then depends on each token alone, not on the other tokens of its batch) and the step's
    gates (renormalised when k > 1, not otherwise)."""
    if isinstance(ffn, MixtureOfExperts):
        return ffn.capacity_factor == 0 and ffn.renormalize == (ffn.top_k > 1)
    return isinstance(ffn, FeedForward | GatedFeedForward)


def decodes_block(block: TransformerBlock) -> bool:
    """A pre-norm block the fused GPT step computes: LayerNorms or RMSNorms with no ReZero gate,
    attention that `decodes_attention` accepts and a feed-forward layer `decodes_feedforward` does."""
    norms = (nn.LayerNorm, RMSNorm)
    return (
        isinstance(block, TransformerBlock)
        and block.pre_norm
        and isinstance(block.norm1, norms)
        and type(block.norm2) is type(block.norm1)
        and isinstance(block.gate1, nn.Identity)
        and isinstance(block.gate2, nn.Identity)
        and decodes_attention(block.attn)
        and decodes_feedforward(block.ffn)
    )


def decodes_gpt(model: GPT) -> bool:
    """Blocks that `decodes_block` accepts, none shared, one norm throughout (the final one's kind
    too), one rotary base, no factorized embeddings."""
    blocks = list(model.blocks)
    placed = [getattr(getattr(b, "attn", None), "positions", None) for b in blocks]
    rotary = {(getattr(p, "theta", None), getattr(p, "scaling", None)) for p in placed}
    return (
        all(decodes_block(b) for b in blocks)
        and all(type(b.norm1) is type(model.final_norm) for b in blocks)
        and len(rotary) == 1
        and not shared_blocks(model)
        and isinstance(model.embedding_proj, nn.Identity)
        and isinstance(model.head_proj, nn.Identity)
        and model.step_signal is None
        and plain_ends(model)
    )


def _covers(module: nn.Module) -> bool:
    if isinstance(module, MultiHeadAttention):
        return covers_attention(module)
    if isinstance(module, TransformerBlock):
        return covers_block(module)
    if isinstance(module, DecoderBlock):
        return covers_decoder_block(module)
    if isinstance(module, GPT):
        return covers_gpt(module)
    return not isinstance(module, MixtureOfExperts)


def uncovered_parts(model: nn.Module) -> str | None:
    """What in `model` the kernels do not compute (positions inside attention, a pattern other
    than full, grouped-query heads, a norm other than LayerNorm, a gated or mixture feed-forward,
    shared blocks), in words; None when they cover all of it."""
    if all(_covers(m) for m in model.modules()) and not shared_blocks(model):
        return None
    config = getattr(model, "config", None)
    fields = (
        "positions",
        "attention",
        "n_kv_heads",
        "normalization",
        "activation",
        "experts",
        "block_sharing",
        "block",
    )
    chosen = ", ".join(f"{f}={getattr(config, f)}" for f in fields if hasattr(config, f))
    return (
        "the kernels compute full multi-head attention with positions at the input, LayerNorm and a "
        f"dense GELU/ReLU feed-forward in unshared blocks; this model has {chosen}"
    )


def undecoded_parts(model: GPT) -> list[str]:
    """The parts of today's checkpoints in `model` that the fused GPT step does not compute, in
    words (empty: none of them; the step's other conditions are `decodes_gpt`'s)."""
    c = model.config
    found = [
        (c.norm == "sandwich", "norms after each sublayer too (norm='sandwich')"),
        (c.qkv_bias is True and not c.bias, "biases on q, k and v alone (qkv_bias)"),
        (c.qk_norm != "none", f"norms over the queries and keys (qk_norm={c.qk_norm!r})"),
        (c.head_size is not None and c.head_size * c.n_heads != c.d_model, "heads sized apart from the width"),
        (c.attention_scale is not None, "scores scaled by attention_scale"),
        (c.attention != "full" or bool(c.layer_attention), "window or sparse attention"),
        (bool(c.nope_layers), "layers without positions (nope_layers)"),
        (c.rotary_dims is not None, "rotary positions on part of each head (rotary_dims)"),
        (not c.rope_scaling_spec().one_table, f"rotary frequencies or rotations scaled as {c.rope_scaling} does"),
        (c.scale_embeddings, "embeddings scaled by √d"),
        (c.logit_softcap is not None, "soft-capped logits"),
        (
            c.experts > 0 and c.expert_renormalize not in (None, c.expert_top_k > 1),
            f"experts' gates renormalised otherwise (expert_renormalize={c.expert_renormalize})",
        ),
    ]
    return [words for present, words in found if present]
