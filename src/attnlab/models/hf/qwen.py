"""Import Hugging Face Qwen2 / Qwen2.5 and Qwen3 checkpoints from a local folder into attnlab's `GPT`.

Both are Llama's block (see `llama`) with small changes to the attention:
- Qwen2 and Qwen2.5 (Yang et al. 2024, §2.1) add biases to the query, key and value projections,
  not to the output projection: `qkv_bias=True` beside `bias=False`.
- Qwen3 (Yang et al. 2025, §2) drops those biases and normalises each head's queries and keys with
  an RMSNorm of its own before the rotary positions (QK-norm, Dehghani et al. 2023):
  `qk_norm="rmsnorm"`. Its heads are sized apart from the width (`head_dim`, 128 by default):
  `head_size`.
Both may set sliding-window layers (`use_sliding_window`, `layer_types`), read as Mistral's.
- Qwen3-MoE (Yang et al. 2025, §2) is Qwen3's attention with Mixtral's sparse feed-forward layer
  (see `mixtral`): a router over `num_experts` SwiGLU experts of width `moe_intermediate_size`,
  each token sent to its `num_experts_per_tok` most likely. Where it differs from Mixtral: the k
  probabilities of the softmax over all experts are renormalised only when `norm_topk_prob`
  (`expert_renormalize`); a mixture sits in every `decoder_sparse_step`-th block (`expert_every`)
  but the `mlp_only_layers` (`dense_blocks`), which keep a dense SwiGLU of `intermediate_size`
  (`ffn_hidden`, the experts' own width being `expert_hidden`); and `head_dim` defaults to
  hidden_size / num_attention_heads (no 128 of its own).

Source format: as Llama's (`Qwen2ForCausalLM`, `Qwen3ForCausalLM`; config.json a `Qwen2Config` /
`Qwen3Config`, transformers `models/qwen2/configuration_qwen2.py`, `models/qwen3/...`).

Name map, HF -> attnlab (i = block index), beyond Llama's:
    layers.i.self_attn.{q,k,v}_proj.bias -> blocks.i.attn.in_proj.bias (rows [q; k; v])   (Qwen2)
    layers.i.self_attn.{q,k}_norm        -> blocks.i.attn.{q,k}_norm                       (Qwen3)
    layers.i.mlp.gate                    -> blocks.i.ffn.router                           (Qwen3-MoE)
    layers.i.mlp.experts.e.{gate,up}_proj -> blocks.i.ffn.experts.fc1[e] (rows [gate; up])
    layers.i.mlp.experts.e.down_proj     -> blocks.i.ffn.experts.fc2[e]

References:
- Yang et al. 2024, "Qwen2 Technical Report"; Yang et al. 2025, "Qwen3 Technical Report".
- transformers `models/qwen2/modeling_qwen2.py`, `models/qwen3/modeling_qwen3.py`,
  `models/qwen3_moe/modeling_qwen3_moe.py` (`Qwen3MoeTopKRouter`, `Qwen3MoeDecoderLayer`).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import CONFIG_FILE, HFSource, config_value
from attnlab.models.hf.llama import LLAMA_DEFAULTS, LLAMA_FIXED_SWITCHES, llama_ffn, llama_like_config, load_llama_like
from attnlab.models.hf.mixtral import ExpertNames, experts_ffn

# transformers' Qwen2Config / Qwen3Config defaults, for keys a config.json leaves out.
QWEN2_DEFAULTS: dict[str, Any] = {
    **LLAMA_DEFAULTS,
    "vocab_size": 151936,
    "intermediate_size": 22016,
    "max_position_embeddings": 32768,
}
QWEN3_DEFAULTS: dict[str, Any] = {**QWEN2_DEFAULTS, "head_dim": 128}
# transformers' Qwen3MoeConfig defaults (Qwen3-30B-A3B's shape): no head_dim of its own.
QWEN3_MOE_DEFAULTS: dict[str, Any] = {
    **QWEN2_DEFAULTS,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "decoder_sparse_step": 1,
    "norm_topk_prob": False,
}
QWEN3_MOE_EXPERTS = ExpertNames("mlp", "gate_proj", "up_proj", "down_proj")

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


def qwen3_moe_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` of a Qwen3-MoE config.json: Qwen3's, with the experts (see the module docstring)."""
    hf = {"num_key_value_heads": QWEN3_MOE_DEFAULTS["num_key_value_heads"], **hf}  # its default is not one per head

    def get(key: str, kind: type = int) -> Any:
        value = config_value(hf, QWEN3_MOE_DEFAULTS, key, kind, source)
        if kind is int and value < 1:
            raise CheckpointError(f"{source}: {key} must be >= 1, got {value}")
        return value

    experts = qwen3_moe_experts(hf, source)
    n_layers = config_value(hf, QWEN3_MOE_DEFAULTS, "num_hidden_layers", int, source)
    moe = dict(
        experts=experts,
        expert_top_k=get("num_experts_per_tok"),
        expert_renormalize=get("norm_topk_prob", bool),
        expert_every=get("decoder_sparse_step"),
        dense_blocks=mlp_only_layers(hf, n_layers, source),
        expert_hidden=get("moe_intermediate_size"),
        capacity_factor=0.0,
    )
    return llama_like_config(
        hf,
        QWEN3_MOE_DEFAULTS,
        QWEN3_FIXED_SWITCHES,
        "Qwen3-MoE",
        model_type="qwen3_moe",
        dropout=dropout,
        source=source,
        qk_norm="rmsnorm",
        **(moe if experts > 0 else {}),  # no experts: every block dense, as transformers builds it
    )


def qwen3_moe_experts(hf: Mapping[str, Any], source: str) -> int:
    """The number of experts: `num_experts` (the published files' key) or `num_local_experts`
    (what transformers 5 writes, its attribute_map's name for the same field)."""
    values = {key: hf[key] for key in ("num_experts", "num_local_experts") if key in hf}
    if len(set(map(repr, values.values()))) > 1:
        raise CheckpointError(f"{source}: num_experts and num_local_experts disagree: {values}")
    value = next(iter(values.values()), QWEN3_MOE_DEFAULTS["num_experts"])
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointError(f"{source}: num_experts must be an int >= 0, got {value!r}")
    return value


def mlp_only_layers(hf: Mapping[str, Any], n_layers: int, source: str) -> tuple[int, ...]:
    """`mlp_only_layers`: the blocks kept dense, each an index below num_hidden_layers (null: none)."""
    layers = hf.get("mlp_only_layers") or []
    if not isinstance(layers, list) or any(
        not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_layers for i in layers
    ):
        raise CheckpointError(f"{source}: mlp_only_layers must list block indices below {n_layers}, got {layers!r}")
    return tuple(sorted(set(layers)))


def load_qwen2(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Qwen2 / Qwen2.5 checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(folder, "Qwen2", qwen2_config_from_hf, llama_ffn, dtype=dtype, dropout=dropout)


def load_qwen3(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Qwen3 checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`)."""
    return load_llama_like(folder, "Qwen3", qwen3_config_from_hf, llama_ffn, dtype=dtype, dropout=dropout)


def load_qwen3_moe(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Qwen3-MoE checkpoint in `folder` as an attnlab `GPT`, in eval mode (as `load_llama`;
    the experts from either of the layouts `mixtral` reads)."""
    return load_llama_like(
        folder, "Qwen3-MoE", qwen3_moe_config_from_hf, experts_ffn(QWEN3_MOE_EXPERTS), dtype=dtype, dropout=dropout
    )
