"""Import Hugging Face Mistral and SmolLM3 checkpoints from a local folder into attnlab's `GPT`:
Llama's block (see `llama`) with a different choice of which keys and positions attention sees.

- Mistral 7B (Jiang et al. 2023, §2) limits each query to the last `sliding_window` keys
  (sliding-window attention), which attnlab's "window" attention computes, decoding with a rolling
  cache of that many slots. A window at least as long as the context is full attention.
- SmolLM3 (Hugging Face 2025) leaves rotary positions out of every fourth layer (NoPE layers, after
  Kazemnejad et al. 2023 and Yang et al. 2025's RNoPE): `no_rope_layers[i]` is 1 where layer i
  rotates, 0 where it has no positions at all. attnlab lists the 0s as `nope_layers`.

Source format and names: as Llama's (`MistralForCausalLM`, `SmolLM3ForCausalLM`).

References:
- Jiang et al. 2023, "Mistral 7B"; transformers `models/mistral/modeling_mistral.py`.
- Hugging Face 2025, "SmolLM3: smol, multilingual, long-context reasoner"; transformers
  `models/smollm3/modeling_smollm3.py`.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import CONFIG_FILE, HFSource, config_value
from attnlab.models.hf.llama import LLAMA_DEFAULTS, LLAMA_FIXED_SWITCHES, llama_ffn, llama_like_config, load_llama_like

# transformers' MistralConfig / SmolLM3Config defaults, for keys a config.json leaves out.
MISTRAL_DEFAULTS: dict[str, Any] = {
    **LLAMA_DEFAULTS,
    "intermediate_size": 14336,
    "max_position_embeddings": 4096 * 32,
}
SMOLLM3_DEFAULTS: dict[str, Any] = {
    **LLAMA_DEFAULTS,
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "max_position_embeddings": 32768,
    "rope_theta": 2000000.0,
    "tie_word_embeddings": True,
}
SMOLLM3_FIXED_SWITCHES = {key: LLAMA_FIXED_SWITCHES[key] for key in ("attention_bias", "mlp_bias")}


def mistral_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` of a Mistral config.json: Llama's, with its sliding window."""
    return llama_like_config(hf, MISTRAL_DEFAULTS, {}, "Mistral", dropout=dropout, source=source)


def smollm3_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` of a SmolLM3 config.json: Llama's, with the layers of `no_rope_layers` = 0 unrotated."""
    n_layers = config_value(hf, SMOLLM3_DEFAULTS, "num_hidden_layers", int, source)
    flags = hf.get("no_rope_layers")
    if flags is None:  # transformers' default: every no_rope_layer_interval-th layer has no positions
        interval = hf.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(n_layers)]
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) for f in flags):
        raise CheckpointError(f"{source}: no_rope_layers must list {n_layers} flags of 0 or 1, got {flags!r}")
    nope = tuple(i for i, rotates in enumerate(flags) if not rotates)
    return llama_like_config(
        hf, SMOLLM3_DEFAULTS, SMOLLM3_FIXED_SWITCHES, "SmolLM3", dropout=dropout, source=source, nope_layers=nope
    )


def load_mistral(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Mistral checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(folder, "Mistral", mistral_config_from_hf, llama_ffn, dtype=dtype, dropout=dropout)


def load_smollm3(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the SmolLM3 checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(folder, "SmolLM3", smollm3_config_from_hf, llama_ffn, dtype=dtype, dropout=dropout)
