"""Import Hugging Face Qwen2 / Qwen2.5 and Qwen3 checkpoints from a local folder into attnlab's `GPT`.

Both are Llama's block (see `llama`) with small changes to the attention:
- Qwen2 and Qwen2.5 (Yang et al. 2024, §2.1) add biases to the query, key and value projections,
  not to the output projection: `qkv_bias=True` beside `bias=False`.
- Qwen3 (Yang et al. 2025, §2) drops those biases and normalises each head's queries and keys with
  an RMSNorm of its own before the rotary positions (QK-norm, Dehghani et al. 2023):
  `qk_norm="rmsnorm"`. Its heads are sized apart from the width (`head_dim`, 128 by default):
  `head_size`.
Both may set sliding-window layers (`use_sliding_window`, `layer_types`), read as Mistral's.

Source format: as Llama's (`Qwen2ForCausalLM`, `Qwen3ForCausalLM`; config.json a `Qwen2Config` /
`Qwen3Config`, transformers `models/qwen2/configuration_qwen2.py`, `models/qwen3/...`).

Name map, HF -> attnlab (i = block index), beyond Llama's:
    layers.i.self_attn.{q,k,v}_proj.bias -> blocks.i.attn.in_proj.bias (rows [q; k; v])   (Qwen2)
    layers.i.self_attn.{q,k}_norm        -> blocks.i.attn.{q,k}_norm                       (Qwen3)

References:
- Yang et al. 2024, "Qwen2 Technical Report"; Yang et al. 2025, "Qwen3 Technical Report".
- transformers `models/qwen2/modeling_qwen2.py`, `models/qwen3/modeling_qwen3.py`.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import CONFIG_FILE, HFSource
from attnlab.models.hf.llama import LLAMA_DEFAULTS, LLAMA_FIXED_SWITCHES, llama_ffn, llama_like_config, load_llama_like

# transformers' Qwen2Config / Qwen3Config defaults, for keys a config.json leaves out.
QWEN2_DEFAULTS: dict[str, Any] = {
    **LLAMA_DEFAULTS,
    "vocab_size": 151936,
    "intermediate_size": 22016,
    "max_position_embeddings": 32768,
}
QWEN3_DEFAULTS: dict[str, Any] = {**QWEN2_DEFAULTS, "head_dim": 128}

# Qwen2's q, k, v biases are always there (no switch); Qwen3's attention_bias would add them to the
# output projection too.
QWEN2_FIXED_SWITCHES: dict[str, tuple[Any, str]] = {}
QWEN3_FIXED_SWITCHES: dict[str, tuple[Any, str]] = {"attention_bias": LLAMA_FIXED_SWITCHES["attention_bias"]}


def qwen2_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` of a Qwen2 / Qwen2.5 config.json: Llama's, with biases on q, k and v."""
    return llama_like_config(
        hf, QWEN2_DEFAULTS, QWEN2_FIXED_SWITCHES, "Qwen2", dropout=dropout, source=source, qkv_bias=True
    )


def qwen3_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` of a Qwen3 config.json: Llama's, with per-head RMSNorms on q and k."""
    return llama_like_config(
        hf, QWEN3_DEFAULTS, QWEN3_FIXED_SWITCHES, "Qwen3", dropout=dropout, source=source, qk_norm="rmsnorm"
    )


def load_qwen2(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Qwen2 / Qwen2.5 checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(folder, "Qwen2", qwen2_config_from_hf, llama_ffn, dtype=dtype, dropout=dropout)


def load_qwen3(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Qwen3 checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(folder, "Qwen3", qwen3_config_from_hf, llama_ffn, dtype=dtype, dropout=dropout)
