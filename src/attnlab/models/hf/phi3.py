"""Import Hugging Face Phi-3 and Phi-4-mini checkpoints from a local folder into attnlab's `GPT`.

Phi-3 (Abdin et al. 2024, §2) is Llama's block (see `llama`) stored and positioned its own way:
- q, k and v in one projection `qkv_proj` (rows [q; k; v], attnlab's `in_proj` as it is), and the
  gated feed-forward layer's two inputs in one `gate_up_proj` (rows [gate; up], attnlab's `fc1`);
- Phi-4-mini rotates only the first `partial_rotary_factor` of each head (`rotary_dims`);
- the long-context models scale RoPE with LongRoPE (Ding et al. 2024): each frequency divided by
  a factor of its own, one set (`short_factor`) while the sequence fits the pre-training context
  and another (`long_factor`) past it, and the rotations scaled by
  √(1 + ln(s) / ln(original context)), s the context's stretch (`rope_scaling="longrope"`).

Source format: `Phi3ForCausalLM` saved by transformers (config.json a `Phi3Config`, transformers
`models/phi3/configuration_phi3.py`).

Name map, HF -> attnlab (i = block index), where it differs from Llama's:
    layers.i.self_attn.qkv_proj -> blocks.i.attn.in_proj
    layers.i.mlp.gate_up_proj   -> blocks.i.ffn.fc1

References:
- Abdin et al. 2024, "Phi-3 Technical Report"; Microsoft 2025, "Phi-4-Mini Technical Report".
- Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens".
- transformers `models/phi3/modeling_phi3.py`, `modeling_rope_utils.py` (`_compute_longrope_parameters`).
"""

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import CONFIG_FILE, CheckpointTensors, HFSource
from attnlab.models.hf.llama import (
    LLAMA_DEFAULTS,
    LLAMA_DOWN,
    llama_like_config,
    load_llama_like,
    rope_fields_from_hf,
    rope_parameters,
)

# transformers' Phi3Config defaults (Phi-3-mini), for keys a config.json leaves out.
PHI3_DEFAULTS: dict[str, Any] = {
    **LLAMA_DEFAULTS,
    "vocab_size": 32064,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
}
PHI_GATE_UP = "mlp.gate_up_proj.weight"


def phi3_rope_fields(hf: Mapping[str, Any], head_dim: int, source: str) -> dict[str, Any]:
    """RoPE's fields of a Phi-3 config.json: partial rotary (`rotary_dims`) and LongRoPE's factors
    beside what `llama.rope_fields_from_hf` reads."""
    params = rope_parameters(hf, source)
    fraction = params.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    fields: dict[str, Any] = {} if fraction == 1.0 else {"rotary_dims": int(head_dim * fraction)}
    if params.get("rope_type", params.get("type")) != "longrope":
        return {**rope_fields_from_hf({"rope_parameters": params}, PHI3_DEFAULTS["rope_theta"], source), **fields}
    context = params.get("original_max_position_embeddings", hf.get("original_max_position_embeddings"))
    short, long = params.get("short_factor"), params.get("long_factor")
    if not isinstance(context, int) or not isinstance(short, list) or not isinstance(long, list):
        raise CheckpointError(
            f"{source}: rope_type 'longrope' needs original_max_position_embeddings and the short_factor and "
            "long_factor lists"
        )
    stretch = (
        params.get("factor") or hf.get("max_position_embeddings", PHI3_DEFAULTS["max_position_embeddings"]) / context
    )
    attention = params.get("attention_factor")
    if attention is None:  # LongRoPE's suggested temperature (transformers' default too)
        attention = 1.0 if stretch <= 1.0 else math.sqrt(1 + math.log(stretch) / math.log(context))
    return {
        "rope_theta": float(params.get("rope_theta", PHI3_DEFAULTS["rope_theta"])),
        "rope_scaling": "longrope",
        "rope_original_context": context,
        "rope_short_factor": tuple(float(f) for f in short),
        "rope_long_factor": tuple(float(f) for f in long),
        "rope_attention_factor": float(attention),
        **fields,
    }


def phi3_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` of a Phi-3 / Phi-4-mini config.json: Llama's, with partial rotary and LongRoPE."""
    heads = hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim") or hf.get("hidden_size", PHI3_DEFAULTS["hidden_size"]) // heads
    rope = phi3_rope_fields(hf, head_dim, source)  # llama_like_config reads no RoPE fields given it
    return llama_like_config(hf, PHI3_DEFAULTS, {}, "Phi3", dropout=dropout, source=source, **rope)


def phi3_ffn(tensors: CheckpointTensors, i: int, expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Block i's gated layer: gate_up_proj as fc1 (rows [gate; up] already), down_proj as fc2."""
    down, fc2 = LLAMA_DOWN
    return {
        f"blocks.{i}.ffn.fc1.weight": tensors.take(f"layers.{i}.{PHI_GATE_UP}", expected[f"blocks.{i}.ffn.fc1.weight"]),
        f"blocks.{i}.{fc2}": tensors.take(f"layers.{i}.{down}", expected[f"blocks.{i}.{fc2}"]),
    }


def load_phi3(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Phi-3 / Phi-4-mini checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(folder, "Phi3", phi3_config_from_hf, phi3_ffn, dtype=dtype, dropout=dropout)
