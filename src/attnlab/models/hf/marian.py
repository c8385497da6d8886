"""Export attnlab's encoder–decoder as a transformers `MarianMTModel`, and import one back.

MarianMT (Junczys-Dowmunt et al. 2018; transformers `models/marian/modeling_marian.py`) is the
paper's base architecture exactly as attnlab's `Seq2SeqTransformer` builds it with post-norm,
sinusoidal positions and one shared vocabulary: embeddings × √d_model plus a fixed sinusoid table,
LayerNorm after each residual sum, no final LayerNorm, tied output projection. Exporting a trained
attnlab model therefore gives a transformers model that computes the same function, which lets a
benchmark compare the two libraries' decoders on the same trained weights and the same outputs.

One layout differs: Marian's table holds all the sines first and then all the cosines
(`out[:, :d/2] = sin`, `out[:, d/2:] = cos`), attnlab's interleaves them (sin at 2i, cos at 2i+1).
Marian feature m is attnlab feature `marian_feature_order(d_model)[m]`. Re-ordering the d_model
features of every tensor consistently (embedding columns, the inputs of every projection that reads the residual
stream, the outputs of every projection that writes it, LayerNorm gains and biases) changes
nothing else: LayerNorm's mean and variance do not depend on the order of the features.

Name map, attnlab -> Marian (i = layer index; in_proj rows [q; k; v] -> q_proj, k_proj, v_proj;
`marian_links`, read one way by `marian_export` / `to_marian`, the other by `load_marian`):
  src_embedding / output          -> model.shared / lm_head (all tied)
  encoder.i.attn                  -> model.encoder.layers.i.self_attn
  encoder.i.norm1 / norm2         -> ...self_attn_layer_norm / final_layer_norm
  decoder.i.self_attn / cross_attn -> model.decoder.layers.i.self_attn / encoder_attn
  decoder.i.norm1 / norm2 / norm3 -> ...self_attn_layer_norm / encoder_attn_layer_norm / final_layer_norm
  *.ffn.fc1 / fc2                 -> *.fc1 / fc2
"""

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import CheckpointError
from attnlab.models.hf._common import (
    COMMON_EXPORT_RULES,
    CONFIG_FILE,
    HFCheckpoint,
    PartRule,
    check_switches,
    config_value,
    is_value,
    one_dropout,
    part_problems,
    read_hf_config,
    read_weights,
    refuse,
)
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

MARIAN_LAYER_NORM_EPS = 1e-5  # Marian's nn.LayerNorm(embed_dim) keeps torch's default
MARIAN_ACTIVATIONS = ("relu", "gelu")  # the activations exported and imported here, same name in both

# One layer's sublayers: attnlab module (after "encoder.{i}." / "decoder.{i}.") -> (Marian module
# after "model.encoder.layers.{i}." / "model.decoder.layers.{i}.", what it is).
MARIAN_ENCODER_LAYER: dict[str, tuple[str, str]] = {
    "attn": ("self_attn", "attention"),
    "norm1": ("self_attn_layer_norm", "norm"),
    "ffn": ("", "ffn"),
    "norm2": ("final_layer_norm", "norm"),
}
MARIAN_DECODER_LAYER: dict[str, tuple[str, str]] = {
    "self_attn": ("self_attn", "attention"),
    "norm1": ("self_attn_layer_norm", "norm"),
    "cross_attn": ("encoder_attn", "attention"),
    "norm2": ("encoder_attn_layer_norm", "norm"),
    "ffn": ("", "ffn"),
    "norm3": ("final_layer_norm", "norm"),
}
# The one embedding matrix: attnlab's src_embedding (= tgt_embedding = output), Marian's model.shared
# (= both embed_tokens = lm_head, which transformers ties on loading).
MARIAN_EMBEDDING = ("src_embedding.weight", "model.shared.weight")
MARIAN_TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
# Marian's sinusoid tables are buffers it computes itself; attnlab builds its own.
MARIAN_IGNORED_TENSOR = re.compile(r"model\.(encoder|decoder)\.embed_positions\.weight")


@dataclasses.dataclass(frozen=True)
class MarianLink:
    """One Marian tensor and where it lives in attnlab's state."""

    ours: str
    hf: str
    part: int | None = None
    """Which third of attnlab's in_proj rows ([q; k; v]) this is; None: the whole tensor."""
    role: str = "plain"
    """How its features are laid out (see the module docstring): "reads" (columns are model
    features), "writes" (rows are), or "plain" (neither)."""


def _sublayer_links(ours: str, hf: str, kind: str) -> list[MarianLink]:
    if kind == "attention":
        links = []
        for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            links.append(MarianLink(f"{ours}.in_proj.weight", f"{hf}.{proj}.weight", j, "reads"))
            links.append(MarianLink(f"{ours}.in_proj.bias", f"{hf}.{proj}.bias", j))
        return [
            *links,
            *(MarianLink(f"{ours}.out_proj.{k}", f"{hf}.out_proj.{k}", None, "writes") for k in ("weight", "bias")),
        ]
    if kind == "norm":
        return [MarianLink(f"{ours}.{k}", f"{hf}.{k}", None, "writes") for k in ("weight", "bias")]
    # Marian's fc1 / fc2 sit on the layer itself (its module name is "")
    return [
        MarianLink(f"{ours}.fc1.weight", f"{hf}.fc1.weight", None, "reads"),
        MarianLink(f"{ours}.fc1.bias", f"{hf}.fc1.bias"),
        MarianLink(f"{ours}.fc2.weight", f"{hf}.fc2.weight", None, "writes"),
        MarianLink(f"{ours}.fc2.bias", f"{hf}.fc2.bias", None, "writes"),
    ]


def marian_links(config: Seq2SeqConfig) -> list[MarianLink]:
    """Every stored tensor of the MarianMTModel of `config` but the final logits bias."""
    links = [MarianLink(*MARIAN_EMBEDDING, None, "reads")]
    for stack, layers, table in (
        ("encoder", config.n_encoder_layers, MARIAN_ENCODER_LAYER),
        ("decoder", config.n_decoder_layers, MARIAN_DECODER_LAYER),
    ):
        for i in range(layers):
            for ours, (hf, kind) in table.items():
                links += _sublayer_links(f"{stack}.{i}.{ours}", f"model.{stack}.layers.{i}.{hf}".rstrip("."), kind)
    return links


def marian_feature_order(d_model: int) -> torch.Tensor:
    """attnlab's feature index of each Marian feature `(d_model,)`: the sines (attnlab's even
    features) first, then the cosines (the odd ones)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _permute(t: torch.Tensor, role: str, order: torch.Tensor) -> torch.Tensor:
    """t with its model features taken in `order`: the columns of a "reads" weight, the rows (or
    entries) of a "writes" tensor; a "plain" one as it is."""
    if role == "reads":
        return t[:, order]
    if role == "writes":
        return t[order]
    return t


# -- export ----------------------------------------------------------------------------------------

# What an encoder–decoder needs to be a MarianMT model (besides COMMON_EXPORT_RULES).
MARIAN_EXPORT_RULES: dict[str, PartRule] = {
    **COMMON_EXPORT_RULES,
    "norm": (is_value("norm", "post"), "post-norm"),
    "positions": (is_value("positions", "sinusoidal"), "sinusoidal positions"),
    "tie_embeddings": (is_value("tie_embeddings", True), "one shared vocabulary"),
    "activation": (is_value("activation", *MARIAN_ACTIVATIONS), "relu or gelu here"),
    "normalization": (is_value("normalization", "layernorm"), "LayerNorm"),
    "layer_norm_eps": (is_value("layer_norm_eps", MARIAN_LAYER_NORM_EPS), "1e-5"),
    "n_kv_heads": (lambda c: c.n_kv_heads in (None, c.n_heads), "one key/value head per query head"),
    "transparent_attention": (is_value("transparent_attention", False), "cross-attention on the last encoder layer"),
}


def marian_export_problems(config: Seq2SeqConfig) -> list[str]:
    """What keeps `config` from being a MarianMT model, one entry per part (empty: nothing)."""
    return part_problems(config, MARIAN_EXPORT_RULES, "MarianMT")


def marian_config_to_hf(config: Seq2SeqConfig, *, bos_id: int, eos_id: int) -> dict[str, Any]:
    """The MarianMT config.json of `config` (the inverse of `marian_config_from_hf`); `bos_id`
    becomes Marian's `decoder_start_token_id`. Raises `ExportError` naming what Marian lacks."""
    refuse(marian_export_problems(config), "MarianMT")
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.n_encoder_layers,
        "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": config.activation,
        "max_position_embeddings": config.max_len,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "dropout": config.dropout,
        "attention_dropout": config.dropout,
        "activation_dropout": 0.0,
        "pad_token_id": config.pad_id,
        "eos_token_id": eos_id,
        "forced_eos_token_id": eos_id,
        "decoder_start_token_id": bos_id,
        "bos_token_id": bos_id,
    }


def marian_export(model: Seq2SeqTransformer, *, bos_id: int, eos_id: int) -> HFCheckpoint:
    """`model`, an attnlab `Seq2SeqTransformer` with post-norm, sinusoidal positions and tied
    embeddings, as a `MarianMTModel` checkpoint with features in Marian's order; the embedding is
    stored once, as model.shared. Raises `ExportError` naming what Marian cannot represent."""
    c = model.config
    config = marian_config_to_hf(c, bos_id=bos_id, eos_id=eos_id)
    order = marian_feature_order(c.d_model)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    tensors: dict[str, torch.Tensor] = {}
    for link in marian_links(c):
        t = state[link.ours] if link.part is None else state[link.ours].chunk(3)[link.part]
        tensors[link.hf] = _permute(t, link.role, order)
    tensors["final_logits_bias"] = torch.zeros(1, c.vocab_size)  # attnlab's output has no bias
    return HFCheckpoint(config, tensors)


def to_marian(model: Seq2SeqTransformer, *, bos_id: int, eos_id: int) -> Any:
    """A `transformers.MarianMTModel` computing the same function as `model` (see `marian_export`),
    in memory. Raises `ExportError` (a `ValueError`) naming what Marian cannot represent."""
    from transformers import MarianConfig, MarianMTModel

    checkpoint = marian_export(model, bos_id=bos_id, eos_id=eos_id)
    marian = MarianMTModel(MarianConfig(**checkpoint.config)).eval()
    tied = {name: checkpoint.tensors[MARIAN_EMBEDDING[1]] for name in MARIAN_TIED}
    result = marian.load_state_dict({**checkpoint.tensors, **tied}, strict=False)
    # Everything is given but Marian's fixed sinusoid tables, which it builds itself.
    missing = [k for k in result.missing_keys if not MARIAN_IGNORED_TENSOR.fullmatch(k)]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"MarianMT export out of step with transformers: missing {missing}, unexpected {result.unexpected_keys}"
        )
    return marian


# -- import ----------------------------------------------------------------------------------------

# transformers' MarianConfig defaults, used for keys a config.json leaves out.
MARIAN_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101,
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "gelu",
    "max_position_embeddings": 1024,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "pad_token_id": 58100,
}
# As HF_FIXED_SWITCHES, for Marian's config.json.
MARIAN_FIXED_SWITCHES: dict[str, tuple[Any, str]] = {
    "scale_embedding": (True, "attnlab always scales the embeddings by sqrt(d_model)"),
    "share_encoder_decoder_embeddings": (True, "attnlab's encoder–decoder here has one shared vocabulary"),
    "tie_word_embeddings": (True, "attnlab's output projection is the shared embedding"),
    "add_cross_attention": (False, "it adds a second cross-attention"),
}


def marian_config_from_hf(
    hf: Mapping[str, Any], *, dropout: float | None = None, source: str = CONFIG_FILE
) -> Seq2SeqConfig:
    """The `Seq2SeqConfig` equivalent to a MarianMT `config.json`, read as a dict. Raises
    `CheckpointError` (naming `source` and the key) for one attnlab cannot represent exactly."""
    if hf.get("model_type") != "marian":
        raise CheckpointError(f"{source}: model_type is {hf.get('model_type')!r}, not 'marian'")
    check_switches(hf, MARIAN_FIXED_SWITCHES, "encoder–decoder", source)

    def get(key: str, kind: type | tuple[type, ...] = int) -> Any:
        return config_value(hf, MARIAN_DEFAULTS, key, kind, source)

    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if get(a) != get(b):
            raise CheckpointError(f"{source}: {a}={get(a)} but {b}={get(b)}; attnlab's two stacks share one value")
    if hf.get("decoder_vocab_size") not in (None, get("vocab_size")):
        raise CheckpointError(f"{source}: decoder_vocab_size differs from vocab_size; attnlab has one vocabulary")
    activation = get("activation_function", str)
    if activation not in MARIAN_ACTIVATIONS:
        raise CheckpointError(f"{source}: activation_function {activation!r} is not one of {list(MARIAN_ACTIVATIONS)}")
    if dropout is None:
        dropout = one_dropout({key: get(key, (int, float)) for key in ("dropout", "attention_dropout")}, source)
    try:
        return Seq2SeqConfig(
            vocab_size=get("vocab_size"),
            d_model=get("d_model"),
            n_heads=get("encoder_attention_heads"),
            n_encoder_layers=get("encoder_layers"),
            n_decoder_layers=get("decoder_layers"),
            d_ff=get("encoder_ffn_dim"),
            dropout=dropout,
            activation=activation,
            norm="post",
            positions="sinusoidal",
            max_len=get("max_position_embeddings"),
            tie_embeddings=True,
            pad_id=get("pad_token_id"),
            layer_norm_eps=MARIAN_LAYER_NORM_EPS,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def load_marian(
    folder: str | Path, *, dropout: float | None = None, dtype: torch.dtype = torch.float32
) -> Seq2SeqTransformer:
    """Load the MarianMT checkpoint in `folder` (config.json and weights, as `save_pretrained` or
    `attnlab export` writes them) as an attnlab `Seq2SeqTransformer`, in eval mode: `marian_links`
    read backwards, features back in attnlab's interleaved order. The tied copies of the embedding
    and the final logits bias must agree with attnlab's model (the same matrix, a zero bias).
    Raises `CheckpointError` naming the file and the tensor on any mismatch."""
    folder = Path(folder)
    config_path, hf_config = read_hf_config(folder, "MarianMT", f"{CONFIG_FILE} and model.safetensors")
    config = marian_config_from_hf(hf_config, dropout=dropout, source=str(config_path))
    weights_path, stored = read_weights(folder)
    stored = {k: v for k, v in stored.items() if not MARIAN_IGNORED_TENSOR.fullmatch(k)}
    shared = stored.get(MARIAN_EMBEDDING[1])
    if shared is None:
        raise CheckpointError(f"{weights_path}: missing tensor {MARIAN_EMBEDDING[1]}; re-save it with save_pretrained")
    for name in MARIAN_TIED:
        if name in stored and not torch.equal(stored.pop(name), shared):
            raise CheckpointError(f"{weights_path}: {name} differs from {MARIAN_EMBEDDING[1]}; attnlab ties them")
    bias = stored.pop("final_logits_bias", None)
    if bias is not None and bool(bias.any()):
        raise CheckpointError(f"{weights_path}: final_logits_bias is not zero; attnlab's output projection has no bias")

    model = Seq2SeqTransformer(config)
    expected = model.state_dict()
    inverse = torch.argsort(marian_feature_order(config.d_model))
    parts: dict[str, list[torch.Tensor | None]] = {}
    for link in marian_links(config):
        if link.hf not in stored:
            raise CheckpointError(
                f"{weights_path}: missing tensor {link.hf}; the weights belong to another config.json"
            )
        t = _permute(stored.pop(link.hf), link.role, inverse)
        parts.setdefault(link.ours, [None, None, None] if link.part is not None else [None])[link.part or 0] = t
    if stored:
        raise CheckpointError(f"{weights_path}: unexpected tensor {sorted(stored)[0]} for the MarianMT of config.json")
    state = {name: torch.cat(pieces) for name, pieces in parts.items()}
    for name, t in state.items():
        if t.shape != expected[name].shape:
            raise CheckpointError(
                f"{weights_path}: {name} has shape {tuple(t.shape)}, config.json implies {tuple(expected[name].shape)}"
            )
    for tied in ("tgt_embedding.weight", "output.weight"):
        state[tied] = state[MARIAN_EMBEDDING[0]]
    model.load_state_dict(state, strict=True)  # copies into the one shared matrix
    return model.to(dtype).eval()
