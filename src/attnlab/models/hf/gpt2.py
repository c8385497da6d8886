"""Import Hugging Face GPT-2 checkpoints from a local folder into attnlab's `GPT`, and export a
`GPT` with GPT-2's parts back (`gpt2_export`).

GPT-2 source format: a folder as written by `transformers`' `save_pretrained` for `GPT2LMHeadModel` or
`GPT2Model`, the layout of the `openai-community/gpt2*` repositories on the Hugging Face Hub:
- `config.json`: a `GPT2Config` (transformers `models/gpt2/configuration_gpt2.py`);
- `model.safetensors`, or `pytorch_model.bin` (a state dict of tensors; read with
  `torch.load(weights_only=True)`), or either one sharded behind its `*.index.json`.
Names are those of transformers `models/gpt2/modeling_gpt2.py`, with a `transformer.` prefix when
saved from `GPT2LMHeadModel` and none when saved from `GPT2Model`.

Name map, HF -> attnlab (i = block index; `gpt2_plan`, read one way by `load_gpt2`, the other by
`gpt2_export`):
    wte                 -> token_embedding          wpe      -> positions.embedding
    h.i.ln_1 / h.i.ln_2 -> blocks.i.norm1 / norm2   ln_f     -> final_norm
    h.i.attn.c_attn     -> blocks.i.attn.in_proj    h.i.attn.c_proj -> blocks.i.attn.out_proj
    h.i.mlp.c_fc        -> blocks.i.ffn.fc1         h.i.mlp.c_proj  -> blocks.i.ffn.fc2
    lm_head             -> lm_head (tied to wte unless the checkpoint stores a different matrix)

GPT-2's linear layers are `Conv1D` modules, kept from the TensorFlow original: weight `(in, out)`,
y = x W + b. `torch.nn.Linear` stores `(out, in)`, so those weights are transposed. `c_attn` computes
[q | k | v] in that order along its output (the original code's `tf.split(c, 3, axis=2)`), which is
the row order of attnlab's `in_proj` once transposed; heads are then contiguous slices of each, in
both libraries.

References:
- Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2).
- openai/gpt-2 `src/model.py` (`conv1d`, `attn`); transformers `modeling_gpt2.py` (`GPT2Attention`).
"""

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf._common import (
    COMMON_EXPORT_RULES,
    CONFIG_FILE,
    EXPORT_ACTIVATIONS,
    HF_ACTIVATIONS,
    HFCheckpoint,
    HFSource,
    PartRule,
    as_source,
    check_switches,
    checked,
    config_value,
    is_value,
    one_dropout,
    part_problems,
    refuse,
)

# not model: key -> (the value attnlab computes, what the other value would do).
HF_FIXED_SWITCHES: dict[str, tuple[bool, str]] = {
    "scale_attn_weights": (True, "attnlab always divides attention scores by sqrt(head_dim)"),
    "scale_attn_by_inverse_layer_idx": (False, "it divides block i's attention scores by a further i + 1"),
    "reorder_and_upcast_attn": (False, "it computes attention scores in a reordered float32 path"),
    "add_cross_attention": (False, "attnlab's GPT blocks have no cross-attention"),
}

# transformers' GPT2Config defaults, used for keys a config.json leaves out (as transformers does).
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
}

# Per-block tensors: HF name after "h.{i}." -> (attnlab name after "blocks.{i}.", is a Conv1D weight).
BLOCK_TENSORS: dict[str, tuple[str, bool]] = {
    "ln_1.weight": ("norm1.weight", False),
    "ln_1.bias": ("norm1.bias", False),
    "attn.c_attn.weight": ("attn.in_proj.weight", True),
    "attn.c_attn.bias": ("attn.in_proj.bias", False),
    "attn.c_proj.weight": ("attn.out_proj.weight", True),
    "attn.c_proj.bias": ("attn.out_proj.bias", False),
    "ln_2.weight": ("norm2.weight", False),
    "ln_2.bias": ("norm2.bias", False),
    "mlp.c_fc.weight": ("ffn.fc1.weight", True),
    "mlp.c_fc.bias": ("ffn.fc1.bias", False),
    "mlp.c_proj.weight": ("ffn.fc2.weight", True),
    "mlp.c_proj.bias": ("ffn.fc2.bias", False),
}
TOP_TENSORS: dict[str, str] = {
    "wte.weight": "token_embedding.weight",
    "wpe.weight": "positions.embedding.weight",
    "ln_f.weight": "final_norm.weight",
    "ln_f.bias": "final_norm.bias",
}
# Older checkpoints (the Hub's gpt2 files among them) also store the causal mask and a -1e4 constant
# as buffers; attnlab builds its mask itself.
IGNORED_TENSOR = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


def gpt2_config_from_hf(hf: Mapping[str, Any], *, dropout: float | None = None, source: str = CONFIG_FILE) -> GPTConfig:
    """The `GPTConfig` equivalent to a Hugging Face GPT-2 `config.json`, read as a dict.

    Keys left out take transformers' GPT2Config defaults. `dropout` overrides the HF dropouts;
    by default `attn_pdrop`, `resid_pdrop` and `embd_pdrop` must agree, as attnlab has one rate.
    `tie_weights` follows `tie_word_embeddings`. Raises `CheckpointError` (naming `source`) for a
    config attnlab cannot represent exactly.
    """
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise CheckpointError(
            f"{source}: model_type is {model_type!r}, not 'gpt2'; only GPT-2 checkpoints can be imported"
        )
    check_switches(hf, HF_FIXED_SWITCHES, "GPT", source)

    def get(key: str, kind: type | tuple[type, ...]) -> Any:
        return config_value(hf, HF_DEFAULTS, key, kind, source)

    activation = get("activation_function", str)
    if activation not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"{source}: activation_function {activation!r} is not supported; "
            f"attnlab can import {sorted(HF_ACTIVATIONS)}"
        )
    d_model = get("n_embd", int)
    n_inner = hf.get("n_inner")
    if n_inner is None:
        n_inner = 4 * d_model
    elif not isinstance(n_inner, int) or isinstance(n_inner, bool) or n_inner < 1:
        raise CheckpointError(f"{source}: n_inner={n_inner!r} is not a positive integer")
    # A multiple of d_model is attnlab's ffn_mult; any other width is named exactly (ffn_hidden).
    ffn = {"ffn_mult": n_inner // d_model} if n_inner % d_model == 0 else {"ffn_hidden": n_inner}
    if dropout is None:
        keys = ("resid_pdrop", "attn_pdrop", "embd_pdrop")
        dropout = one_dropout({key: get(key, (int, float)) for key in keys}, source)
    try:
        return GPTConfig(
            vocab_size=get("vocab_size", int),
            block_size=get("n_positions", int),
            n_layers=get("n_layer", int),
            n_heads=get("n_head", int),
            d_model=d_model,
            dropout=dropout,
            bias=True,
            positions="learned",
            activation=HF_ACTIVATIONS[activation],
            norm="pre",
            **ffn,
            layer_norm_eps=float(get("layer_norm_epsilon", (int, float))),
            tie_weights=get("tie_word_embeddings", bool),
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def load_gpt2(
    folder: str | Path | HFSource, *, dtype: torch.dtype = torch.float32, dropout: float | None = None
) -> GPT:
    """Load the Hugging Face GPT-2 checkpoint in `folder` as an attnlab `GPT`, in eval mode.

    The folder holds `config.json` and the weights (see the module docstring). Every tensor must be
    used and every parameter filled, with the shape the config implies. The output head is tied
    to the token embedding unless the checkpoint stores an `lm_head.weight` that differs from it.
    Parameters are cast to `dtype`. Raises `CheckpointError` naming the file and key on any mismatch.
    """
    source = as_source(folder, "GPT-2")
    config_path, weights_path, tensors = source.config_path, source.weights_path, source.tensors
    config = gpt2_config_from_hf(source.config, dropout=dropout, source=str(config_path))

    # GPT2LMHeadModel saves "transformer.wte.weight", GPT2Model saves "wte.weight".
    hf_state: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix("transformer.")
        if name in hf_state:
            raise CheckpointError(f"{weights_path}: tensor {name} is stored twice (with and without 'transformer.')")
        if not IGNORED_TENSOR.fullmatch(name):
            hf_state[name] = tensor

    head = hf_state.pop("lm_head.weight", None)
    wte = hf_state.get("wte.weight")
    if head is not None and wte is not None and not torch.equal(head, wte):
        config = dataclasses.replace(config, tie_weights=False)
    elif head is None and not config.tie_weights:
        raise CheckpointError(
            f"{weights_path}: {config_path.name} says tie_word_embeddings=false but there is no lm_head.weight; "
            "save the GPT2LMHeadModel, not its GPT2Model"
        )
    else:
        config = dataclasses.replace(config, tie_weights=True)

    with torch.device("meta"):
        model = GPT(config)  # shapes only; the checkpoint provides every value
    expected = model.state_dict()
    state = _convert(hf_state, config, expected, weights_path)
    if not config.tie_weights:
        state["lm_head.weight"] = checked("lm_head.weight", head, expected["lm_head.weight"], False, weights_path)
    else:
        state["lm_head.weight"] = state["token_embedding.weight"]
    state = {name: t.to(dtype).contiguous() for name, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_weights:
        # assign=True installs two separate Parameters; share the one matrix again (Press & Wolf 2017).
        model.lm_head.weight = model.token_embedding.weight
    return model.eval()


def gpt2_plan(n_layers: int) -> dict[str, tuple[str, bool]]:
    """Every GPT2Model tensor of an `n_layers`-block model: HF name -> (attnlab name, is a Conv1D weight)."""
    plan = {hf: (ours, False) for hf, ours in TOP_TENSORS.items()}
    for i in range(n_layers):
        for hf, (ours, conv) in BLOCK_TENSORS.items():
            plan[f"h.{i}.{hf}"] = (f"blocks.{i}.{ours}", conv)
    return plan


def _convert(
    hf_state: dict[str, torch.Tensor], config: GPTConfig, expected: Mapping[str, torch.Tensor], source: Path
) -> dict[str, torch.Tensor]:
    """Rename HF GPT-2 tensors to attnlab's names, transposing Conv1D weights; check keys and shapes."""
    plan = gpt2_plan(config.n_layers)
    for name in hf_state:
        if name not in plan:
            raise CheckpointError(
                f"{source}: unexpected tensor {name} for a GPT-2 with n_layers={config.n_layers}; "
                "only GPT2Model / GPT2LMHeadModel checkpoints matching config.json can be imported"
            )
    state = {}
    for hf, (ours, conv) in plan.items():
        if hf not in hf_state:
            raise CheckpointError(
                f"{source}: missing tensor {hf} (or transformer.{hf}); the weights file is incomplete or "
                "belongs to another config.json, re-save it with save_pretrained"
            )
        state[ours] = checked(hf, hf_state[hf], expected[ours], conv, source)
    return state


# -- export: attnlab GPT -> transformers GPT2LMHeadModel -------------------------------------------

# What a GPT needs to be a GPT-2 (besides COMMON_EXPORT_RULES).
GPT2_EXPORT_RULES: dict[str, PartRule] = {
    **COMMON_EXPORT_RULES,
    "positions": (is_value("positions", "learned"), "learned position embeddings"),
    "norm": (is_value("norm", "pre"), "LayerNorm before each sublayer (pre-norm)"),
    "normalization": (is_value("normalization", "layernorm"), "LayerNorm"),
    "activation": (is_value("activation", *EXPORT_ACTIVATIONS), f"one of {sorted(EXPORT_ACTIVATIONS)}"),
    "n_kv_heads": (lambda c: c.kv_heads == c.n_heads, "one key/value head per query head"),
}


def gpt2_export_problems(config: GPTConfig) -> list[str]:
    """What keeps `config` from being a transformers GPT-2, one entry per part (empty: nothing)."""
    return part_problems(config, GPT2_EXPORT_RULES, "GPT-2")


def gpt2_config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """The GPT-2 config.json of `config` (the inverse of `gpt2_config_from_hf`). Raises
    `ExportError` naming every part GPT-2 does not have."""
    refuse(gpt2_export_problems(config), "GPT-2")
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        # None is GPT-2's 4 * d_model; anything else is written out (transformers takes any width).
        "n_inner": None if config.d_ff == 4 * config.d_model else config.d_ff,
        "activation_function": EXPORT_ACTIVATIONS[config.activation],
        **{key: config.dropout for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop")},
        "layer_norm_epsilon": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_weights,
    }


def gpt2_export(model: GPT) -> HFCheckpoint:
    """`model` as a transformers `GPT2LMHeadModel` checkpoint: `gpt2_plan` read backwards, Conv1D
    weights transposed back to `(in, out)`; `lm_head.weight` only when untied. A model without
    biases (`bias=False`, nanoGPT's choice) gets zero biases, which compute the same function.
    Raises `ExportError` naming every part GPT-2 does not have."""
    config = gpt2_config_to_hf(model.config)
    state = model.state_dict()
    tensors = {}
    for hf, (ours, conv) in gpt2_plan(model.config.n_layers).items():
        if ours not in state:  # a bias of a bias-free model: as wide as its weight's output
            weight = state[ours.removesuffix(".bias") + ".weight"]
            tensors[f"transformer.{hf}"] = weight.new_zeros(weight.size(0))
        else:
            tensors[f"transformer.{hf}"] = state[ours].t() if conv else state[ours]
    if not model.config.tie_weights:
        tensors["lm_head.weight"] = state["lm_head.weight"]
    return HFCheckpoint(config, tensors)
