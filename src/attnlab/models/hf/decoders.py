"""Export a `GPT` as the Llama-shaped family whose parts it has: Llama, Qwen2, Qwen3, Qwen3-MoE,
Mistral, SmolLM3 or Gemma 3 (the importers' name maps read backwards).

Each family is a `DecoderShape`: what values of the parts it takes (its rules: the parts of
today's checkpoints are off unless the family names them), the config.json keys of its own, and
the names of each layer's norms. `export_decoder(model, shape)` writes one; `auto.causal_lm_export`
picks the first family in its order that has all of the model's parts.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import COMMON_EXPORT_RULES, HFCheckpoint, PartRule, is_value, part_problems, refuse
from attnlab.models.hf.gemma import GEMMA3_LAYER_TENSORS
from attnlab.models.hf.llama import (
    LLAMA_DOWN,
    LLAMA_GATE_UP,
    LLAMA_LAYER_TENSORS,
    LLAMA_QKV,
    LLAMA_TOP_TENSORS,
    PHI_QKV,
    ROPE_TYPES,
    qkv_rows,
)
from attnlab.models.hf.mixtral import ExpertNames
from attnlab.models.hf.phi3 import PHI_GATE_UP
from attnlab.models.hf.qwen import QWEN3_MOE_EXPERTS

ANY: Any = None
"""In a family's `takes`: the part may have any value (the family writes it in its config.json)."""
# A family's `takes` entry: the values the part may have (or ANY, or a test of the whole config), in words.
Takes = tuple[tuple[Any, ...] | Callable[[GPTConfig], bool], str]

# The parts Llama has, field -> (its values, in words). A family's `takes` widens some of them.
LLAMA_PARTS: dict[str, tuple[tuple[Any, ...], str]] = {
    "positions": (("rope",), "rotary positions"),
    "norm": (("pre",), "a norm before each sublayer (pre-norm)"),
    "normalization": (("rmsnorm",), "RMSNorm"),
    "bias": ((False,), "no biases"),
    "activation": (("swiglu",), "a SwiGLU feed-forward layer"),
    "rope_scaling": (("none", "linear", "llama3"), "RoPE unscaled or scaled linearly or as Llama 3 does"),
    "rotary_dims": ((None,), "RoPE over the whole head"),
    "qkv_bias": ((None, False), "no biases on q, k and v"),
    "qk_norm": (("none",), "no norm over the queries and keys"),
    "attention": (("full",), "full attention"),
    "layer_attention": (((),), "one pattern in every layer"),
    "nope_layers": (((),), "rotary positions in every layer"),
    "window_rope_theta": ((None,), "one RoPE base"),
    "attention_scale": ((None,), "scores scaled by 1/√D"),
    "scale_embeddings": ((False,), "unscaled token embeddings"),
    "logit_softcap": ((None,), "logits without soft-capping"),
}


@dataclass(frozen=True)
class DecoderShape:
    """One Llama-shaped family as an export target."""

    name: str
    model_type: str
    architecture: str
    takes: Mapping[str, Takes] = field(default_factory=dict)
    """The parts whose values differ from Llama's (`LLAMA_PARTS`)."""
    extras: Callable[[GPTConfig], dict[str, Any]] = lambda c: {}
    """config.json keys of the family's own."""
    layer_tensors: Mapping[str, str] = field(default_factory=lambda: LLAMA_LAYER_TENSORS)
    fused: bool = False
    """q, k, v stored as one `qkv_proj` and gate, up as one `gate_up_proj` (Phi-3)."""
    experts: ExpertNames | None = None
    """Where a mixture's router and experts go (Qwen3-MoE); None: the family has none."""

    @property
    def rules(self) -> dict[str, PartRule]:
        parts = {**LLAMA_PARTS, **self.takes}
        own = {name: (_fits(name, values), words) for name, (values, words) in parts.items()}
        return {**COMMON_EXPORT_RULES, **own}

    def problems(self, config: GPTConfig) -> list[str]:
        """What keeps `config` from being this family, one entry per part (empty: nothing)."""
        return part_problems(config, self.rules, self.name)


def _fits(name: str, values: Any) -> Callable[[GPTConfig], bool]:
    """The test of one `takes` entry: any value (ANY), a test of its own, or one of the values."""
    if values is ANY:
        return lambda config: True
    return values if callable(values) else is_value(name, *values)


def rope_to_hf(c: GPTConfig) -> dict[str, Any]:
    """`rope_parameters` as transformers 5 writes them (the inverse of `llama.rope_fields_from_hf`
    and `phi3.phi3_rope_fields`)."""
    partial = {} if c.rotary_dims is None else {"partial_rotary_factor": c.rotary_dims / c.head_dim}
    if c.rope_scaling == "longrope":
        return {
            "rope_type": "longrope",
            "rope_theta": c.rope_theta,
            "short_factor": list(c.rope_short_factor),
            "long_factor": list(c.rope_long_factor),
            "original_max_position_embeddings": c.rope_original_context,
            "attention_factor": c.rope_attention_factor,
            **partial,
        }
    rope_type = next(hf for hf, (ours, _) in ROPE_TYPES.items() if ours == c.rope_scaling)
    keys = ROPE_TYPES[rope_type][1]
    return {
        "rope_type": rope_type,
        "rope_theta": c.rope_theta,
        **{hf: getattr(c, ours) for hf, ours in keys.items()},
        **partial,
    }


def decoder_config(c: GPTConfig, shape: DecoderShape) -> dict[str, Any]:
    """The config.json of `c` as `shape`. Raises `ExportError` naming every part the family lacks."""
    refuse(shape.problems(c), shape.name)
    config = {
        "model_type": shape.model_type,
        "architectures": [shape.architecture],
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.layer_norm_eps,
        "rope_parameters": rope_to_hf(c),
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": c.dropout,
        "tie_word_embeddings": c.tie_weights,
        # The tokenizer's ids, where a run has one, are added by the caller (tokenizer_export);
        # a family's defaults (SmolLM3's pad id 128004) may lie outside this vocabulary.
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    return {**config, **shape.extras(c)}


def export_decoder(model: GPT, shape: DecoderShape) -> HFCheckpoint:
    """`model` as a `shape` checkpoint: the stacked q / k / v (and their biases) and gate / up rows
    split apart, the q / k norms, each layer's norms by the family's names; `lm_head.weight` only
    when untied. Raises `ExportError` naming every part the family does not have."""
    c = model.config
    config = decoder_config(c, shape)
    state = model.state_dict()
    tensors = {f"model.{hf}": state[ours] for hf, ours in LLAMA_TOP_TENSORS.items()}
    for i in range(c.n_layers):
        hf, ours = f"model.layers.{i}.", f"blocks.{i}."
        tensors.update({hf + name: state[ours + our_name] for name, our_name in shape.layer_tensors.items()})
        if shape.fused:
            tensors[f"{hf}{PHI_QKV}"] = state[f"{ours}attn.in_proj.weight"]
            tensors[f"{hf}{PHI_GATE_UP}"] = state[f"{ours}ffn.fc1.weight"]
            tensors[hf + LLAMA_DOWN[0]] = state[ours + LLAMA_DOWN[1]]
            continue
        for suffix in ("weight", "bias"):
            if f"{ours}attn.in_proj.{suffix}" in state:
                q_k_v = state[f"{ours}attn.in_proj.{suffix}"].split(list(qkv_rows(c)))
                names = [name.replace(".weight", f".{suffix}") for name in LLAMA_QKV]
                tensors.update({hf + name: t for name, t in zip(names, q_k_v, strict=True)})
        for part in ("q_norm", "k_norm"):
            if f"{ours}attn.{part}.weight" in state:
                tensors[f"{hf}self_attn.{part}.weight"] = state[f"{ours}attn.{part}.weight"]
        tensors.update(ffn_tensors(state, hf, ours, shape.experts))
    if not c.tie_weights:
        tensors["lm_head.weight"] = state["lm_head.weight"]
    return HFCheckpoint(config, tensors)


def ffn_tensors(state: Mapping[str, Any], hf: str, ours: str, experts: ExpertNames | None) -> dict[str, Any]:
    """One block's feed-forward tensors under the family's names: a dense SwiGLU's gate / up rows
    split apart, or a mixture's router and each expert's gate, up and down projections."""
    if f"{ours}ffn.router.weight" not in state:
        gate_up = state[f"{ours}ffn.fc1.weight"].chunk(2)
        down, fc2 = LLAMA_DOWN
        return {**{hf + n: t for n, t in zip(LLAMA_GATE_UP, gate_up, strict=True)}, hf + down: state[ours + fc2]}
    assert experts is not None, "the shape's rules let a mixture through without its names"
    moe = f"{hf}{experts.block}."
    tensors = {moe + "gate.weight": state[f"{ours}ffn.router.weight"]}
    fc1, fc2 = state[f"{ours}ffn.experts.fc1"], state[f"{ours}ffn.experts.fc2"]  # (E, 2F, C), (E, C, F)
    for e in range(fc1.size(0)):
        gate, up = fc1[e].chunk(2)
        names = (experts.gate, experts.up, experts.down)
        tensors.update({f"{moe}experts.{e}.{n}.weight": t for n, t in zip(names, (gate, up, fc2[e]), strict=True)})
    return tensors


def qwen3_moe_extras(c: GPTConfig) -> dict[str, Any]:
    """Qwen3-MoE's own keys: its experts (the inverse of `qwen.qwen3_moe_config_from_hf`) and window."""
    renormalize = c.expert_top_k > 1 if c.expert_renormalize is None else c.expert_renormalize
    windowed = c.attention == "window"
    return {
        "num_experts": c.experts,
        "num_experts_per_tok": c.expert_top_k,
        "norm_topk_prob": renormalize,
        "decoder_sparse_step": c.expert_every,
        "mlp_only_layers": list(c.dense_blocks),
        "moe_intermediate_size": c.expert_hidden or c.d_ff,
        "use_sliding_window": windowed,
        "sliding_window": c.attention_window if windowed else None,
    }


def layer_types(c: GPTConfig) -> list[str]:
    """transformers' `layer_types` of `c`: each layer "sliding_attention" or "full_attention"."""
    patterns = c.layer_attention or (c.attention,) * c.n_layers
    return ["sliding_attention" if p == "window" else "full_attention" for p in patterns]


def query_pre_attn_scalar(c: GPTConfig) -> int | float:
    """Gemma's s of the score scale s^−1/2: an int where it is one (transformers' field is typed int)."""
    if c.attention_scale is None:
        return c.head_dim
    s = c.attention_scale**-2
    return round(s) if abs(s - round(s)) < 1e-6 * s else s


def window_layers(c: GPTConfig) -> dict[str, Any]:
    """Qwen's keys for sliding-window layers: on, the window, and each layer's type."""
    windowed = c.attention == "window" or bool(c.layer_attention)
    return {
        "use_sliding_window": windowed,
        "sliding_window": c.attention_window if windowed else None,
        "layer_types": layer_types(c),
    }


def gemma3_extras(c: GPTConfig) -> dict[str, Any]:
    """Gemma 3's own keys: its activation, score scale, layer types, RoPE by layer type, soft-cap."""
    local_theta = c.window_rope_theta if c.window_rope_theta is not None else c.rope_theta
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": query_pre_attn_scalar(c),
        "layer_types": layer_types(c),
        "sliding_window": c.attention_window,
        "rope_parameters": {
            "full_attention": rope_to_hf(c),
            "sliding_attention": {"rope_type": "default", "rope_theta": local_theta},
        },
        "final_logit_softcapping": c.logit_softcap,
        "attn_logit_softcapping": None,
    }


WINDOW = (("full", "window"), "full or sliding-window attention")

LLAMA = DecoderShape("Llama", "llama", "LlamaForCausalLM")
QWEN_WINDOWS = {"attention": WINDOW, "layer_attention": (ANY, "window layers among full ones")}
QWEN2 = DecoderShape(
    "Qwen2",
    "qwen2",
    "Qwen2ForCausalLM",
    takes={"qkv_bias": ((True,), "biases on q, k and v"), **QWEN_WINDOWS},
    extras=window_layers,
)
QWEN3 = DecoderShape(
    "Qwen3",
    "qwen3",
    "Qwen3ForCausalLM",
    takes={"qk_norm": (("rmsnorm",), "RMSNorm on q and k"), **QWEN_WINDOWS},
    extras=window_layers,
)
QWEN3_MOE = DecoderShape(
    "Qwen3-MoE",
    "qwen3_moe",
    "Qwen3MoeForCausalLM",
    takes={
        "qk_norm": (("rmsnorm",), "RMSNorm on q and k"),
        "attention": WINDOW,
        "experts": (lambda c: c.experts > 0, "a mixture of SwiGLU experts"),
        "capacity_factor": ((0.0,), "no capacity limit (every token reaches its k experts)"),
    },
    extras=qwen3_moe_extras,
    experts=QWEN3_MOE_EXPERTS,
)
MISTRAL = DecoderShape(
    "Mistral",
    "mistral",
    "MistralForCausalLM",
    takes={"attention": WINDOW},
    extras=lambda c: {"sliding_window": c.attention_window if c.attention == "window" else None},
)
SMOLLM3 = DecoderShape(
    "SmolLM3",
    "smollm3",
    "SmolLM3ForCausalLM",
    takes={"nope_layers": (ANY, "layers without positions (no_rope_layers)")},
    extras=lambda c: {"no_rope_layers": [int(i not in c.nope_layers) for i in range(c.n_layers)]},
)
GEMMA3 = DecoderShape(
    "Gemma 3",
    "gemma3_text",
    "Gemma3ForCausalLM",
    takes={
        "norm": (("sandwich",), "a norm before and after each sublayer"),
        "normalization": (("offset-rmsnorm",), "RMSNorm with gains stored as 1 + w"),
        "activation": (("geglu_tanh",), "a GELU-tanh-gated feed-forward layer"),
        "qk_norm": (("offset-rmsnorm",), "Gemma's RMSNorm on q and k"),
        "scale_embeddings": ((True,), "token embeddings scaled by √d"),
        "rope_scaling": (("none", "linear"), "RoPE unscaled or scaled linearly"),
        "attention": WINDOW,
        "layer_attention": (ANY, "window layers interleaved with full ones"),
        "window_rope_theta": (ANY, "a RoPE base of the window layers' own"),
        "attention_scale": (ANY, "scores scaled by query_pre_attn_scalar^-1/2"),
        "logit_softcap": (ANY, "soft-capped logits"),
    },
    extras=gemma3_extras,
    layer_tensors=GEMMA3_LAYER_TENSORS,
)
PHI3 = DecoderShape(
    "Phi-3",
    "phi3",
    "Phi3ForCausalLM",
    takes={
        "rope_scaling": (("none", "linear", "longrope"), "RoPE unscaled, scaled linearly or LongRoPE"),
        "rotary_dims": (ANY, "RoPE over the first dimensions of each head (partial_rotary_factor)"),
        "attention": WINDOW,
    },
    extras=lambda c: {
        "sliding_window": c.attention_window if c.attention == "window" else None,
        "original_max_position_embeddings": c.rope_original_context if c.rope_scaling == "longrope" else c.block_size,
    },
    fused=True,
)
