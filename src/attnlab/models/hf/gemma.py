"""Import Hugging Face Gemma 3 text checkpoints from a local folder into attnlab's `GPT`.

Gemma 3 (Gemma Team 2025, §2) is a decoder-only Transformer built from named attnlab parts:
- RMSNorm whose gain is stored as its offset from 1, x̂ · (1 + w), all in fp32: `offset-rmsnorm`;
- four norms a block, before and after each sublayer (`norm="sandwich"`);
- the token embeddings multiplied by √d_model (`scale_embeddings`);
- grouped-query attention with heads sized apart from the width (`head_size`), per-head norms on
  the queries and keys (QK-norm, `qk_norm`), scores scaled by query_pre_attn_scalar^−1/2
  (`attention_scale`);
- a GELU-gated feed-forward layer with GELU's tanh approximation (`geglu_tanh`);
- five local sliding-window layers for each global one (`layer_attention`), the local layers with
  a RoPE base of their own (`window_rope_theta`, 10,000; the global layers' is 1,000,000, and is
  the one a `rope_scaling` stretches);
- soft-capped logits where the config sets `final_logit_softcapping` (Gemma 2's; null in Gemma 3).

Source format: `Gemma3ForCausalLM` saved by transformers (config.json a `Gemma3TextConfig`,
model_type "gemma3_text", transformers `models/gemma3/configuration_gemma3.py`). The multimodal
`gemma3` folders (a vision tower beside the text model) are not read.

Name map, HF -> attnlab (i = block index), beyond Llama's q/k/v, o and gate/up/down:
    layers.i.input_layernorm            -> blocks.i.norm1
    layers.i.post_attention_layernorm   -> blocks.i.post_norm1
    layers.i.pre_feedforward_layernorm  -> blocks.i.norm2
    layers.i.post_feedforward_layernorm -> blocks.i.post_norm2
    layers.i.self_attn.{q,k}_norm       -> blocks.i.attn.{q,k}_norm

References:
- Gemma Team 2025, "Gemma 3 Technical Report"; Gemma Team 2024, "Gemma 2" (sandwich norms, soft-capping).
- transformers `models/gemma3/modeling_gemma3.py`.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import CONFIG_FILE, HFSource, config_value
from attnlab.models.hf.llama import llama_ffn, llama_like_config, load_llama_like, rope_fields_from_hf

# transformers' Gemma3TextConfig defaults (Gemma 3 1B-like), for keys a config.json leaves out.
GEMMA3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}

GEMMA3_FIXED_SWITCHES: dict[str, tuple[Any, str]] = {
    "attention_bias": (False, "it adds biases to the q, k, v and output projections"),
    "attn_logit_softcapping": (None, "it soft-caps every attention score (Gemma 2's)"),
    "use_bidirectional_attention": (False, "it lets every query see the keys after it too (EmbeddingGemma)"),
}

GEMMA3_LAYER_TENSORS = {
    "input_layernorm.weight": "norm1.weight",
    "post_attention_layernorm.weight": "post_norm1.weight",
    "pre_feedforward_layernorm.weight": "norm2.weight",
    "post_feedforward_layernorm.weight": "post_norm2.weight",
    "self_attn.o_proj.weight": "attn.out_proj.weight",
}
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")


def gemma3_rope_fields(hf: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The global layers' RoPE (base and scaling) and the local layers' base: transformers 5's
    `rope_parameters` by layer type, or the `rope_theta` / `rope_local_base_freq` / `rope_scaling`
    of older files."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        full = rope_fields_from_hf({"rope_parameters": params["full_attention"]}, GEMMA3_DEFAULTS["rope_theta"], source)
        local = params.get("sliding_attention") or {}
        local_fields = rope_fields_from_hf({"rope_parameters": local}, GEMMA3_DEFAULTS["rope_local_base_freq"], source)
    else:
        full = rope_fields_from_hf(hf, GEMMA3_DEFAULTS["rope_theta"], source)
        base = hf.get("rope_local_base_freq", GEMMA3_DEFAULTS["rope_local_base_freq"])
        local_fields = rope_fields_from_hf({"rope_theta": base}, base, source)
    if local_fields["rope_scaling"] != "none":
        raise CheckpointError(f"{source}: the sliding layers' RoPE must be unscaled (rope_type 'default')")
    return {**full, "window_rope_theta": local_fields["rope_theta"]}


def gemma3_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` equivalent to a Gemma 3 text config.json, read as a dict (keys left out take
    transformers' defaults): Llama's shape with Gemma's parts in place of Llama's. Raises
    `CheckpointError` naming the key for what attnlab cannot build."""
    scalar = config_value(hf, GEMMA3_DEFAULTS, "query_pre_attn_scalar", (int, float), source)
    softcap = hf.get("final_logit_softcapping")
    return llama_like_config(
        hf,
        GEMMA3_DEFAULTS,
        GEMMA3_FIXED_SWITCHES,
        "Gemma 3",
        dropout=dropout,
        source=source,
        model_type="gemma3_text",
        activation_key="hidden_activation",
        activations=GELU_TANH,
        normalization="offset-rmsnorm",
        qk_norm="offset-rmsnorm",
        activation="geglu_tanh",
        norm="sandwich",
        attention_scale=float(scalar) ** -0.5,
        scale_embeddings=True,
        logit_softcap=None if softcap is None else float(softcap),
        **gemma3_rope_fields(hf, source),
    )


def load_gemma3(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Gemma 3 text checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(
        folder,
        "Gemma 3",
        gemma3_config_from_hf,
        llama_ffn,
        dtype=dtype,
        dropout=dropout,
        layer_tensors=GEMMA3_LAYER_TENSORS,
    )
