"""Import Hugging Face Mixtral checkpoints from a local folder into attnlab's `GPT`.

Mixtral (Jiang et al. 2024) is Llama's block (see `llama`) with the feed-forward layer replaced by a
sparse mixture of experts: a router scores each token against `num_local_experts` SwiGLU experts,
the token goes to the `num_experts_per_tok` best (top-k of a softmax over all experts, the k weights
renormalised to sum to 1, §2.1 Eq. 1), and their outputs are summed with those weights. No expert
is ever full: every token reaches its k experts. That is attnlab's `GPTConfig` with `experts`,
`expert_top_k` and `capacity_factor=0.0` (no capacity limit) on top of Llama's parts.

Source format: as Llama's (`MixtralForCausalLM` / `MixtralModel`, config.json a `MixtralConfig`,
transformers `models/mixtral/configuration_mixtral.py`). The experts are stored in one of two ways:
- per expert, as in Mistral's published files and what transformers 5 still writes:
  `layers.i.block_sparse_moe.gate` (the router) and `layers.i.block_sparse_moe.experts.e.w{1,2,3}`
  with w1 the gate projection, w3 the up projection, w2 the down projection;
- fused, as transformers 5's `MixtralExperts` holds them in memory: `layers.i.mlp.gate`,
  `layers.i.mlp.experts.gate_up_proj` (E, 2F, C) rows [gate; up] per expert, and
  `layers.i.mlp.experts.down_proj` (E, C, F).

Name map, HF -> attnlab (i = block index, e = expert; everything else as in `llama`):
    layers.i.block_sparse_moe.gate / layers.i.mlp.gate  -> blocks.i.ffn.router
    layers.i.block_sparse_moe.experts.e.{w1,w3}         -> blocks.i.ffn.experts.fc1[e] (rows [w1; w3])
    layers.i.block_sparse_moe.experts.e.w2              -> blocks.i.ffn.experts.fc2[e]
    layers.i.mlp.experts.gate_up_proj / down_proj       -> blocks.i.ffn.experts.fc1 / fc2

References:
- Jiang et al. 2024, "Mixtral of Experts"; Shazeer et al. 2017 (sparsely-gated mixture of experts).
- transformers `models/mixtral/modeling_mixtral.py` (`MixtralTopKRouter`, `MixtralExperts`) and
  `conversion_mapping.py` (the per-expert <-> fused renaming).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import CONFIG_FILE, CheckpointTensors, HFSource, config_value
from attnlab.models.hf.llama import (
    LLAMA_FIXED_SWITCHES,
    FFNReader,
    llama_ffn,
    llama_like_config,
    load_llama_like,
)

# transformers' MixtralConfig defaults (Mixtral-8x7B), used for keys a config.json leaves out.
MIXTRAL_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 1e6,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}

# As LLAMA_FIXED_SWITCHES. Mixtral's attention has no biases (no attention_bias key), and its
# feed-forward experts none either.
MIXTRAL_FIXED_SWITCHES: dict[str, tuple[Any, str]] = {
    "partial_rotary_factor": LLAMA_FIXED_SWITCHES["partial_rotary_factor"],
    "sliding_window": (None, "each query then sees only the last sliding_window keys (Mistral's window)"),
}


def mixtral_config_from_hf(hf: Mapping[str, Any], *, dropout: float = 0.0, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` equivalent to a Hugging Face Mixtral `config.json`, read as a dict.

    As `llama_config_from_hf`, plus the experts. The router's training-time settings
    (`router_jitter_noise`, `router_aux_loss_coef`, `output_router_logits`) do not change the
    forward pass in eval mode and are not read: fine-tuning uses attnlab's `router_aux_weight`.
    Raises `CheckpointError` naming the key for a config attnlab cannot represent:
    `sliding_window`, `num_experts_per_tok=1` (see below), and Llama's list.
    """

    def get(key: str) -> int:
        return config_value(hf, MIXTRAL_DEFAULTS, key, int, source)

    if get("num_experts_per_tok") == 1:
        # Mixtral renormalises the top-k probabilities for any k, so its one expert gets weight 1;
        # attnlab's k = 1 is the Switch Transformer's, whose gate is the router probability itself.
        raise CheckpointError(
            f"{source}: num_experts_per_tok=1 cannot be imported (Mixtral gives the one expert weight 1); "
            "attnlab's top-1 router weighs it by its probability, as the Switch Transformer does"
        )
    return llama_like_config(
        hf,
        MIXTRAL_DEFAULTS,
        MIXTRAL_FIXED_SWITCHES,
        "Mixtral",
        dropout=dropout,
        source=source,
        experts=get("num_local_experts"),
        expert_top_k=get("num_experts_per_tok"),
        capacity_factor=0.0,
    )


@dataclass(frozen=True)
class ExpertNames:
    """Where a family stores a mixture's router and its experts, one tensor per expert and
    projection: `layers.i.{block}.gate` and `layers.i.{block}.experts.e.{gate, up, down}.weight`."""

    block: str
    gate: str
    up: str
    down: str


MIXTRAL_EXPERTS = ExpertNames("block_sparse_moe", "w1", "w3", "w2")


def experts_ffn(names: ExpertNames) -> FFNReader:
    """The reader of block i's experts and router, from either storage layout (see the module
    docstring); a block that `expected` holds dense (no router) reads Llama's SwiGLU layer."""

    def read(tensors: CheckpointTensors, i: int, expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ours = f"blocks.{i}.ffn."
        if ours + "router.weight" not in expected:
            return llama_ffn(tensors, i, expected)
        fc1, fc2 = expected[ours + "experts.fc1"], expected[ours + "experts.fc2"]  # (E, 2F, C), (E, C, F)
        fused = f"layers.{i}.mlp.experts.gate_up_proj"
        if tensors.has(fused):
            return {
                ours + "router.weight": tensors.take(f"layers.{i}.mlp.gate.weight", expected[ours + "router.weight"]),
                ours + "experts.fc1": tensors.take(fused, fc1),
                ours + "experts.fc2": tensors.take(f"layers.{i}.mlp.experts.down_proj", fc2),
            }
        return per_expert(tensors, f"layers.{i}.{names.block}.", names, ours, expected)

    return read


def per_expert(
    tensors: CheckpointTensors, moe: str, names: ExpertNames, ours: str, expected: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """One block's router and experts stored one tensor per expert and projection under `moe`:
    each expert's gate and up rows stacked into fc1 `(2F, C)`, the experts stacked `(E, ...)`."""
    fc1, fc2 = expected[ours + "experts.fc1"], expected[ours + "experts.fc2"]  # (E, 2F, C), (E, C, F)
    f = fc2.size(-1)
    each = [f"{moe}experts.{e}." for e in range(fc1.size(0))]
    gate_up = [(f"{e}{names.gate}.weight", f"{e}{names.up}.weight") for e in each]
    return {
        ours + "router.weight": tensors.take(moe + "gate.weight", expected[ours + "router.weight"]),
        ours + "experts.fc1": torch.stack([tensors.rows(n, w, (f, f)) for n, w in zip(gate_up, fc1, strict=True)]),
        ours + "experts.fc2": torch.stack(
            [tensors.take(f"{e}{names.down}.weight", w) for e, w in zip(each, fc2, strict=True)]
        ),
    }


mixtral_ffn = experts_ffn(MIXTRAL_EXPERTS)
"""Block i's experts and router, from either storage layout (see the module docstring)."""


def load_mixtral(folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> GPT:
    """Load the Hugging Face Mixtral checkpoint in `folder` as an attnlab `GPT`, in eval mode.

    As `load_llama`, with the experts read from either layout. Raises `CheckpointError` naming the
    file and the key or tensor on any mismatch.
    """
    return load_llama_like(folder, "Mixtral", mixtral_config_from_hf, mixtral_ffn, dtype=dtype, dropout=dropout)
