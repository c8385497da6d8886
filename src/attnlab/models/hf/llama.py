"""Import Hugging Face Llama checkpoints from a local folder into attnlab's `GPT`, and export a
`GPT` with Llama's parts back (`llama_export`).

Llama is a GPT built from other parts (Touvron et al. 2023, §2.2): RMSNorm (Zhang & Sennrich 2019)
before attention, before the feed-forward layer and at the end; a SwiGLU feed-forward layer
(Shazeer 2020); rotary positions (Su et al. 2021) instead of learned ones; no biases; and, from
Llama 2 on, grouped-query attention (Ainslie et al. 2023): `num_key_value_heads` key/value heads
shared by groups of query heads. attnlab's `GPTConfig` names each of them, so a Llama checkpoint
becomes a `GPT` with `normalization="rmsnorm"`, `activation="swiglu"`, `positions="rope"`,
`bias=False` and `n_kv_heads`.

Source format: a folder as written by `transformers`' `save_pretrained` for `LlamaForCausalLM` or
`LlamaModel` (the layout of the `meta-llama/*` repositories on the Hugging Face Hub): `config.json`
(a `LlamaConfig`, transformers `models/llama/configuration_llama.py`), the weights (see `_common`),
and for `attnlab sample` a `tokenizer.json`. Tensor names are those of transformers
`models/llama/modeling_llama.py`, with a `model.` prefix when saved from `LlamaForCausalLM`.

Name map, HF -> attnlab (i = block index; `LLAMA_TOP_TENSORS`, `LLAMA_LAYER_TENSORS` and the
stacked `LLAMA_QKV` / `LLAMA_GATE_UP`, read one way by `load_llama`, the other by `llama_export`):
    embed_tokens                      -> token_embedding
    layers.i.input_layernorm          -> blocks.i.norm1
    layers.i.self_attn.{q,k,v}_proj   -> blocks.i.attn.in_proj (rows [q; k; v])
    layers.i.self_attn.o_proj         -> blocks.i.attn.out_proj
    layers.i.post_attention_layernorm -> blocks.i.norm2
    layers.i.mlp.{gate,up}_proj       -> blocks.i.ffn.fc1 (rows [gate; up]: gate is the one activated)
    layers.i.mlp.down_proj            -> blocks.i.ffn.fc2
    norm                              -> final_norm
    lm_head                           -> lm_head (the token embedding when tie_word_embeddings)
Both libraries' linear weights are `(out, in)`, so nothing is transposed. Nothing is permuted either:
transformers' `rotate_half` pairs dimension j of a head with j + D/2, the layout attnlab's rotary
positions use, and the q / k rows are stored in that layout (the conversion from Meta's own files,
which pair adjacent dimensions, permuted them once, in transformers `convert_llama_weights_to_hf.py`).

References:
- Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models"; "Llama 2".
- Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models".
- transformers `models/llama/modeling_llama.py` (`LlamaAttention`, `LlamaMLP`, `LlamaRMSNorm`).
"""

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import (
    CONFIG_FILE,
    CheckpointTensors,
    HFCheckpoint,
    HFSource,
    as_source,
    check_switches,
    config_value,
)
from attnlab.nn import build_positions

# transformers' LlamaConfig defaults, used for keys a config.json leaves out (as transformers does).
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}

# config.json switches whose other values change the forward pass in a way attnlab's GPT does not
# model: key -> (the value attnlab computes, what another value would do).
LLAMA_FIXED_SWITCHES: dict[str, tuple[Any, str]] = {
    "attention_bias": (False, "it adds biases to the q, k, v and output projections"),
    "mlp_bias": (False, "it adds biases to the feed-forward projections"),
    "partial_rotary_factor": (None, "it rotates only part of each head"),
}

# rope_parameters' rope_type -> attnlab's rope_scaling, and the keys each reads (HF key -> GPTConfig field).
ROPE_TYPES: dict[str, tuple[str, dict[str, str]]] = {
    "default": ("none", {}),
    "linear": ("linear", {"factor": "rope_factor"}),
    "llama3": (
        "llama3",
        {
            "factor": "rope_factor",
            "low_freq_factor": "rope_low_freq_factor",
            "high_freq_factor": "rope_high_freq_factor",
            "original_max_position_embeddings": "rope_original_context",
        },
    ),
    "yarn": (
        "yarn",
        {
            "factor": "rope_factor",
            "original_max_position_embeddings": "rope_original_context",
            "beta_fast": "rope_beta_fast",
            "beta_slow": "rope_beta_slow",
            "attention_factor": "rope_attention_factor",
        },
    ),
    # Dynamic NTK's pre-training context is max_position_embeddings (`rope_fields_from_hf`).
    "dynamic": ("dynamic", {"factor": "rope_factor"}),
}
# YaRN keys that are read into the fields above rather than stored: attention_factor's default
# comes from mscale and mscale_all_dim (`yarn_attention_factor`); truncate=false is refused.
YARN_EXTRA_KEYS = ("mscale", "mscale_all_dim", "truncate")

# hidden_act values that are SiLU (transformers' ACT2FN maps both to nn.SiLU), making the gated
# feed-forward SwiGLU.
SILU = ("silu", "swish")

# HF name (after "model.") -> attnlab name; per layer, after "layers.{i}." and "blocks.{i}.".
LLAMA_TOP_TENSORS = {"embed_tokens.weight": "token_embedding.weight", "norm.weight": "final_norm.weight"}
LLAMA_LAYER_TENSORS = {
    "input_layernorm.weight": "norm1.weight",
    "self_attn.o_proj.weight": "attn.out_proj.weight",
    "post_attention_layernorm.weight": "norm2.weight",
}
# Stacked along rows in one attnlab tensor, in this order: attn.in_proj ([q; k; v]) and the
# dense SwiGLU's ffn.fc1 ([gate; up]: gate is the one activated).
LLAMA_QKV = tuple(f"self_attn.{p}_proj.weight" for p in "qkv")
PHI_QKV = "self_attn.qkv_proj.weight"
LLAMA_GATE_UP = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
LLAMA_DOWN = ("mlp.down_proj.weight", "ffn.fc2.weight")

# Older conversions store each layer's rotary frequencies as a buffer; attnlab computes them itself.
LLAMA_IGNORED_TENSOR = re.compile(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq")

# The feed-forward part of one block: (checkpoint tensors, block index, attnlab's expected state) ->
# attnlab tensors. Llama's is dense (`llama_ffn`); Mixtral's a mixture of experts.
FFNReader = Callable[[CheckpointTensors, int, Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]


def rope_parameters(hf: Mapping[str, Any], source: str) -> dict[str, Any]:
    """RoPE's settings from a config.json: transformers 5's `rope_parameters`, or the top-level
    `rope_theta` and `rope_scaling` of older files (a `rope_scaling` of null: none)."""
    params = hf.get("rope_parameters")
    if params is None:
        params = {"rope_theta": hf["rope_theta"]} if "rope_theta" in hf else {}
    legacy = hf.get("rope_scaling")
    for name, value in (("rope_parameters", params), ("rope_scaling", legacy)):
        if value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{source}: {name} must be an object, got {value!r}")
    # An older file's rope_scaling says how the base is stretched, wherever the base is written.
    legacy = {("rope_type" if key == "type" else key): value for key, value in (legacy or {}).items()}
    return {**params, **legacy}


def rope_fields_from_hf(
    hf: Mapping[str, Any], default: float, source: str, *, context: int | None = None
) -> dict[str, Any]:
    """The `GPTConfig` fields of RoPE (rope_theta, rope_scaling and its settings) from a config.json;
    `default` is the family's base where the file gives none, `context` its max_position_embeddings
    (YaRN's pre-training context where the file names none, as transformers has it; dynamic NTK's
    always). A rope_type attnlab does not compute (longrope outside Phi-3) is refused by name."""
    params = rope_parameters(hf, source)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{source}: rope_parameters.rope_type={rope_type!r} cannot be imported (it rescales the rotary angles "
            f"its own way); attnlab computes rope_type {', '.join(map(repr, ROPE_TYPES))}"
        )
    scaling, keys = ROPE_TYPES[rope_type]
    fields: dict[str, Any] = {"rope_scaling": scaling}
    extra = YARN_EXTRA_KEYS if rope_type == "yarn" else ()
    for key, value in params.items():
        if key in keys and value is not None:  # a null takes the default, as in transformers
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise CheckpointError(f"{source}: rope_parameters.{key} must be a number, got {value!r}")
            fields[keys[key]] = int(value) if keys[key] == "rope_original_context" else float(value)
        elif key not in ("rope_type", "type", "rope_theta", *extra, *keys):
            raise CheckpointError(
                f"{source}: rope_parameters.{key} cannot be imported; attnlab's {rope_type!r} rotary positions "
                f"take only {['rope_theta', *keys, *extra]}"
            )
    if rope_type in ("yarn", "dynamic"):
        fields |= context_scaling_fields(hf, params, rope_type, fields, context, source)
    theta = params.get("rope_theta", default)
    if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0:
        raise CheckpointError(f"{source}: rope_theta must be a positive number, got {theta!r}")
    return {"rope_theta": float(theta), **fields}


def context_scaling_fields(
    hf: Mapping[str, Any],
    params: Mapping[str, Any],
    rope_type: str,
    fields: Mapping[str, Any],
    context: int | None,
    source: str,
) -> dict[str, Any]:
    """The settings YaRN and dynamic NTK take from beside their keys (transformers'
    `_compute_yarn_parameters`, `_compute_dynamic_ntk_parameters`): the pre-training context,
    YaRN's stretch where the file gives none and its attention factor where the file gives none."""
    if rope_type == "dynamic":
        if context is None:
            raise CheckpointError(
                f"{source}: rope_type 'dynamic' needs max_position_embeddings, its pre-training context"
            )
        return {"rope_original_context": context}
    if params.get("truncate", True) is not True:
        raise CheckpointError(
            f"{source}: rope_parameters.truncate={params['truncate']!r} cannot be imported (it leaves YaRN's "
            "ramp ends unrounded); attnlab's yarn rounds them, as truncate=true does"
        )
    original = hf.get("original_max_position_embeddings") or fields.get("rope_original_context") or context
    if original is None:
        raise CheckpointError(f"{source}: rope_type 'yarn' needs original_max_position_embeddings")
    factor = fields.get("rope_factor") or (context or original) / original
    out = {"rope_original_context": int(original), "rope_factor": float(factor)}
    if "rope_attention_factor" not in fields:
        out["rope_attention_factor"] = yarn_attention_factor(factor, params.get("mscale"), params.get("mscale_all_dim"))
    return out


def yarn_attention_factor(factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    """YaRN's factor of the cosines and sines (Peng et al. 2023, §3.4: √(1/t) = 0.1 ln(s) + 1), or
    DeepSeek's ratio of two such with mscale and mscale_all_dim; 1 where nothing is stretched."""

    def m(scale: float, k: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

    return m(factor, mscale) / m(factor, mscale_all_dim) if mscale and mscale_all_dim else m(factor)


def window_fields_from_hf(hf: Mapping[str, Any], n_layers: int, context: int, source: str) -> dict[str, Any]:
    """Sliding-window attention from a config.json (Mistral's `sliding_window`; Qwen's and Gemma's
    `layer_types`): every layer's window, or each layer's pattern. A window at least as long as the
    context is full attention."""
    window = hf.get("sliding_window")
    types = hf.get("layer_types")
    if window is None or (hf.get("use_sliding_window") is False):
        return {}
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise CheckpointError(f"{source}: sliding_window must be a positive int or null, got {window!r}")
    if types is None:
        types = ["sliding_attention"] * n_layers
    known = {"full_attention": "full", "sliding_attention": "window"}
    if not isinstance(types, list) or len(types) != n_layers or any(t not in known for t in types):
        raise CheckpointError(f"{source}: layer_types must list {n_layers} of {list(known)}, got {types!r}")
    patterns = tuple(known[t] for t in types)
    if set(patterns) == {"full"} or (set(patterns) == {"window"} and window >= context):
        return {}
    if set(patterns) == {"window"}:
        return {"attention": "window", "attention_window": window}
    # Interleaved layers stay apart even with a window past the context: their RoPE bases may differ.
    return {"layer_attention": patterns, "attention_window": window}


def llama_like_config(
    hf: Mapping[str, Any],
    defaults: Mapping[str, Any],
    switches: Mapping[str, tuple[Any, str]],
    family: str,
    *,
    dropout: float,
    source: str,
    model_type: str | None = None,
    activation_key: str = "hidden_act",
    activations: tuple[str, ...] = SILU,
    **fields: Any,
) -> GPTConfig:
    """The `GPTConfig` of a Llama-shaped config.json (Llama, Mixtral, Qwen, Gemma 3, ...): checks what
    every such family shares (its `model_type`, by default the family's name in lower case, and its
    activation, `activation_key` one of `activations`), then builds Llama's parts with `fields`
    added or put in their place (Mixtral's experts, Gemma's norms; RoPE fields given are not read again)."""
    model_type = model_type or family.lower()
    if hf.get("model_type") != model_type:
        raise CheckpointError(
            f"{source}: model_type is {hf.get('model_type')!r}, not {model_type!r}; "
            f"load_{family.lower().replace(' ', '')} imports {family} checkpoints only"
        )
    check_switches(hf, switches, family, source)

    def get(key: str, kind: type | tuple[type, ...]) -> Any:
        return config_value(hf, defaults, key, kind, source)

    activation = get(activation_key, str)
    if activation not in activations:
        raise CheckpointError(
            f"{source}: {activation_key} {activation!r} cannot be imported; attnlab's {family} feed-forward "
            f"takes {activation_key} one of {list(activations)}"
        )
    head_dim = hf.get("head_dim", defaults.get("head_dim"))  # Qwen3's default is its own, not the width / heads
    d_model, n_heads, n_kv_heads, head_size = llama_heads(
        hf, get("hidden_size", int), get("num_attention_heads", int), head_dim, source
    )
    n_layers, context = get("num_hidden_layers", int), get("max_position_embeddings", int)
    rope = {} if "rope_theta" in fields else rope_fields_from_hf(hf, defaults["rope_theta"], source, context=context)
    llama_parts = dict(bias=False, positions="rope", normalization="rmsnorm", activation="swiglu", norm="pre")
    shape = dict(
        vocab_size=get("vocab_size", int),
        block_size=context,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_model=d_model,
        head_size=head_size,
        dropout=dropout,
        ffn_hidden=get("intermediate_size", int),
        layer_norm_eps=float(get("rms_norm_eps", (int, float))),
        tie_weights=get("tie_word_embeddings", bool),
    )
    try:
        return GPTConfig(
            **shape, **{**llama_parts, **rope, **window_fields_from_hf(hf, n_layers, context, source), **fields}
        )
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from e


def llama_heads(
    hf: Mapping[str, Any], d_model: int, n_heads: int, head_dim: Any, source: str
) -> tuple[int, int, int, int | None]:
    """(d_model, n_heads, n_kv_heads, head_size) of a Llama-shaped config.json, checked: key/value
    heads default to one per query head; head_size is None where head_dim is the width / the heads."""
    n_kv_heads = hf.get("num_key_value_heads")
    if n_kv_heads is None:
        n_kv_heads = n_heads  # transformers' default: one key/value head per query head
    elif not isinstance(n_kv_heads, int) or isinstance(n_kv_heads, bool):
        raise CheckpointError(f"{source}: num_key_value_heads must be int, got {n_kv_heads!r}")
    if head_dim is None or head_dim * n_heads == d_model:
        return d_model, n_heads, n_kv_heads, None
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 1:
        raise CheckpointError(f"{source}: head_dim must be a positive int, got {head_dim!r}")
    return d_model, n_heads, n_kv_heads, head_dim


def llama_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` equivalent to a Hugging Face Llama `config.json`, read as a dict.

    Keys left out take transformers' LlamaConfig defaults. Llama's `attention_dropout` is not read:
    attnlab's one `dropout` also drops residual branches and embeddings, so it is chosen here (0.0,
    what inference needs). Raises `CheckpointError` (naming `source` and the key) for a config
    attnlab cannot represent exactly: biases, scaled or partial RoPE, an activation other than SiLU,
    a head_dim other than hidden_size / num_attention_heads.
    """
    return llama_like_config(hf, LLAMA_DEFAULTS, LLAMA_FIXED_SWITCHES, "Llama", dropout=dropout, source=source)


def qkv_rows(config: GPTConfig) -> tuple[int, int, int]:
    """The rows of q, k and v in attnlab's in_proj: H·D, Hkv·D, Hkv·D."""
    q, kv = config.n_heads * config.head_dim, config.kv_heads * config.head_dim
    return q, kv, kv


def llama_ffn(tensors: CheckpointTensors, i: int, expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Block i's SwiGLU layer: gate_proj and up_proj stacked into fc1 (rows [gate; up]), down_proj as fc2."""
    fc1 = expected[f"blocks.{i}.ffn.fc1.weight"]  # (2F, C)
    f = fc1.size(0) // 2
    names = [f"layers.{i}.{name}" for name in LLAMA_GATE_UP]
    down, fc2 = LLAMA_DOWN
    return {
        f"blocks.{i}.ffn.fc1.weight": tensors.rows(names, fc1, (f, f)),
        f"blocks.{i}.{fc2}": tensors.take(f"layers.{i}.{down}", expected[f"blocks.{i}.{fc2}"]),
    }


def load_llama(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Hugging Face Llama checkpoint in `folder` as an attnlab `GPT`, in eval mode.

    The folder holds `config.json` and the weights (see the module docstring). Every tensor must be
    used and every parameter filled, with the shape config.json implies. Parameters are cast to
    `dtype`. Raises `CheckpointError` naming the file and the key or tensor on any mismatch.
    """
    return load_llama_like(folder, "Llama", llama_config_from_hf, llama_ffn, dtype=dtype, dropout=dropout)


def load_llama_like(
    folder: str | Path | HFSource,
    family: str,
    config_from_hf: Callable[..., GPTConfig],
    ffn: FFNReader,
    *,
    dtype: torch.dtype,
    dropout: float,
    layer_tensors: Mapping[str, str] = LLAMA_LAYER_TENSORS,
) -> GPT:
    """What the Llama-shaped importers share: everything but the feed-forward layer `ffn` and the
    names of each layer's norms (`layer_tensors`, Llama's by default)."""
    source = as_source(folder, family)
    config = config_from_hf(source.config, dropout=dropout, source=str(source.config_path))
    # LlamaForCausalLM saves "model.layers.0...." and "lm_head.weight"; LlamaModel "layers.0....".
    tensors = CheckpointTensors(source.tensors, source.weights_path, prefix="model.", ignored=LLAMA_IGNORED_TENSOR)

    with torch.device("meta"):
        model = GPT(config)  # shapes only; the checkpoint provides every value
    expected = model.state_dict()
    state = llama_body_state(tensors, config, expected, ffn, layer_tensors)
    state["lm_head.weight"] = llama_head(tensors, config, expected, state["token_embedding.weight"], family)
    tensors.check_all_taken(family)

    state = {name: t.to(dtype).contiguous() for name, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_weights:
        # assign=True installs two separate Parameters; share the one matrix again (Press & Wolf 2017).
        model.lm_head.weight = model.token_embedding.weight
    # Rotary positions act inside attention and hold nothing; the input's position module holds a
    # constant zero vector, a buffer outside the state dict that the meta device left without
    # values: build that module for real.
    model.positions = build_positions(config.positions, config.block_size, config.d_model).to(dtype)
    unset = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:
        raise RuntimeError(f"{family} import left {unset} on the meta device: the name map is out of step with GPT")
    return model.eval()


def llama_body_state(
    tensors: CheckpointTensors,
    config: GPTConfig,
    expected: Mapping[str, torch.Tensor],
    ffn: FFNReader,
    layer_tensors: Mapping[str, str] = LLAMA_LAYER_TENSORS,
) -> dict[str, torch.Tensor]:
    """Every parameter but the head, from the checkpoint: the embeddings, the final norm, and each
    block's norms, attention (q, k, v stacked into in_proj) and feed-forward layer (`ffn`)."""
    state = {ours: tensors.take(hf, expected[ours]) for hf, ours in LLAMA_TOP_TENSORS.items()}
    for i in range(config.n_layers):
        hf, ours = f"layers.{i}.", f"blocks.{i}."
        for hf_name, our_name in layer_tensors.items():
            state[ours + our_name] = tensors.take(hf + hf_name, expected[ours + our_name])
        in_proj = expected[f"{ours}attn.in_proj.weight"]
        if tensors.has(f"{hf}{PHI_QKV}"):  # Phi-3 stores q, k, v stacked already, in attnlab's order
            state[f"{ours}attn.in_proj.weight"] = tensors.take(f"{hf}{PHI_QKV}", in_proj)
        else:
            state[f"{ours}attn.in_proj.weight"] = tensors.rows([hf + n for n in LLAMA_QKV], in_proj, qkv_rows(config))
        state.update(attention_extras(tensors, hf, ours, config, expected))
        state.update(ffn(tensors, i, expected))
    return state


def attention_extras(
    tensors: CheckpointTensors, hf: str, ours: str, config: GPTConfig, expected: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The attention parts beyond Llama's that the config asks for: Qwen2's q, k, v biases
    (stacked as the weights are) and Qwen3's per-head q and k norms."""
    state = {}
    if f"{ours}attn.in_proj.bias" in expected:
        biases = [hf + name.replace(".weight", ".bias") for name in LLAMA_QKV]
        state[f"{ours}attn.in_proj.bias"] = tensors.rows(biases, expected[f"{ours}attn.in_proj.bias"], qkv_rows(config))
    for part in ("q_norm", "k_norm"):
        if f"{ours}attn.{part}.weight" in expected:
            state[f"{ours}attn.{part}.weight"] = tensors.take(
                f"{hf}self_attn.{part}.weight", expected[f"{ours}attn.{part}.weight"]
            )
    return state


def llama_head(
    tensors: CheckpointTensors,
    config: GPTConfig,
    expected: Mapping[str, torch.Tensor],
    embedding: torch.Tensor,
    family: str,
) -> torch.Tensor:
    """lm_head.weight: the token embedding when config.json ties them, else the checkpoint's own."""
    weights_path, config_name = tensors.source, CONFIG_FILE
    if config.tie_weights:
        # A tied checkpoint usually stores no head; one that does must store the embedding again.
        if tensors.has("lm_head.weight") and not torch.equal(tensors.take("lm_head.weight", embedding), embedding):
            raise CheckpointError(
                f"{weights_path}: lm_head.weight differs from {tensors.stored_name('embed_tokens.weight')} but "
                f"{config_name} says tie_word_embeddings=true; the weights and config.json disagree"
            )
        return embedding
    if not tensors.has("lm_head.weight"):
        raise CheckpointError(
            f"{weights_path}: missing tensor lm_head.weight ({config_name} says tie_word_embeddings=false); "
            f"save the {family}ForCausalLM, not its {family}Model"
        )
    return tensors.take("lm_head.weight", expected["lm_head.weight"])


# -- export: attnlab GPT -> transformers LlamaForCausalLM (the shared exporter in `decoders`) -------


def llama_export_problems(config: GPTConfig) -> list[str]:
    """What keeps `config` from being a transformers Llama, one entry per part (empty: nothing)."""
    from attnlab.models.hf.decoders import LLAMA  # decoders reads this module's name maps

    return LLAMA.problems(config)


def llama_config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """The Llama config.json of `config` (the inverse of `llama_config_from_hf`). Raises
    `ExportError` naming every part Llama does not have."""
    from attnlab.models.hf.decoders import LLAMA, decoder_config

    return decoder_config(config, LLAMA)


def llama_export(model: GPT) -> HFCheckpoint:
    """`model` as a transformers `LlamaForCausalLM` checkpoint (`decoders.export_decoder`). Raises
    `ExportError` naming every part Llama does not have."""
    from attnlab.models.hf.decoders import LLAMA, export_decoder

    return export_decoder(model, LLAMA)
