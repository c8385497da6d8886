"""Import Hugging Face ModernBERT checkpoints from a local folder into attnlab's `Bert`.

ModernBERT (Warner et al. 2024, §2.1) is a pre-norm BERT with rotary positions (RoPE), a GeGLU
feed-forward layer, no biases and LayerNorms without a bias; no segment embeddings; no norm before
the first block's attention (the embeddings' norm has just normalised its input); a final norm
after the last block; and attention that alternates between global layers and local ones, a
sliding window of `local_attention` tokens centred on the query (±local_attention / 2), each kind
with its own RoPE base. attnlab's `Bert` computes each part: `norm = "pre"`, `positions = "rope"`,
`activation = "geglu"`, `bias = False`, `type_vocab_size = 0`, `norm_first_block = False`,
`layer_attention` (a "window" of local_attention / 2 + 1 keys either side, itself included, is
|i − j| ≤ local_attention / 2) and `window_rope_theta`.

config.json (transformers `models/modernbert/configuration_modernbert.py`): transformers 5 writes
`layer_types` ("full_attention" / "sliding_attention") and `rope_parameters` (one `rope_theta` per
layer type); older files, those on the Hub, write `global_attn_every_n_layers` (layer i is global
when i is a multiple of it), `global_rope_theta` and `local_rope_theta`. Both are read.

Name map, HF -> attnlab (i = block index; the encoder under "model." in ModernBertForMaskedLM):
    embeddings.tok_embeddings / norm   -> embeddings.token / norm
    layers.i.attn_norm (i > 0)         -> blocks.i.norm1 (block 0 has none)
    layers.i.attn.Wqkv                 -> blocks.i.attn.in_proj (rows [q; k; v], as attnlab's)
    layers.i.attn.Wo                   -> blocks.i.attn.out_proj
    layers.i.mlp_norm                  -> blocks.i.norm2
    layers.i.mlp.Wi                    -> blocks.i.ffn.fc1 (rows [gated half; linear half], as attnlab's)
    layers.i.mlp.Wo                    -> blocks.i.ffn.fc2
    final_norm                         -> final_norm
    head.dense / head.norm             -> head.dense / head.norm (the masked-LM transform)
    decoder.bias                       -> head.decoder.bias (the decoder weight is embeddings.token)
RoPE needs no permutation: transformers' `rotate_half` pairs dimension j of a head with j + D/2, as
attnlab's rotary positions do. The classification heads (a dense layer, GELU and a norm over the
pooled state) are not attnlab's tanh pooler: their checkpoints import with head "none".

References:
- Warner et al. 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder for Fast,
  Memory Efficient, and Long Context Finetuning and Inference" (ModernBERT), §2.1.
- transformers `models/modernbert/modeling_modernbert.py`; `masking_utils.sliding_window_bidirectional_overlay`.
"""

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.data.tokenizers import EncoderTokenizer, load_tokenizer
from attnlab.errors import CheckpointError
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.hf._common import (
    TOKENIZER_FILE,
    CheckpointTensors,
    HFSource,
    as_source,
    check_switches,
    config_value,
    one_dropout,
)
from attnlab.models.hf.bert import LoadedBert

# transformers' ModernBertConfig defaults (ModernBERT-base), for keys a config.json leaves out.
MODERNBERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "norm_eps": 1e-5,
    "pad_token_id": 50283,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160_000.0,
    "local_rope_theta": 10_000.0,
    "attention_dropout": 0.0,
    "embedding_dropout": 0.0,
    "mlp_dropout": 0.0,
    "classifier_activation": "gelu",
}

# Switches attnlab computes one value of: key -> (that value, what another value would do).
MODERNBERT_SWITCHES: dict[str, tuple[Any, str]] = {
    "hidden_activation": ("gelu", "another gate function of the GeGLU feed-forward layer"),
    "classifier_activation": ("gelu", "another function in the masked-LM transform"),
    "attention_bias": (False, "biases on the attention projections"),
    "mlp_bias": (False, "biases in the feed-forward layer"),
    "norm_bias": (False, "a bias in every LayerNorm"),
    "classifier_bias": (False, "a bias on the masked-LM transform"),
    "decoder_bias": (True, "a masked-LM decoder without its output bias"),
    "is_decoder": (False, "a decoder attends causally"),
}
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "window"}
HEADS = ("auto", "mlm", "none")

# Per-layer tensors: HF name after "layers.{i}." -> attnlab name after "blocks.{i}." (norm1 but in block 0).
MODERNBERT_LAYER_TENSORS = {
    "attn_norm.weight": "norm1.weight",
    "attn.Wqkv.weight": "attn.in_proj.weight",
    "attn.Wo.weight": "attn.out_proj.weight",
    "mlp_norm.weight": "norm2.weight",
    "mlp.Wi.weight": "ffn.fc1.weight",
    "mlp.Wo.weight": "ffn.fc2.weight",
}
MODERNBERT_TOP_TENSORS = {
    "embeddings.tok_embeddings.weight": "embeddings.token.weight",
    "embeddings.norm.weight": "embeddings.norm.weight",
    "final_norm.weight": "final_norm.weight",
}
MODERNBERT_MLM_TENSORS = {
    "head.dense.weight": "head.dense.weight",
    "head.norm.weight": "head.norm.weight",
    "decoder.bias": "head.decoder.bias",
}
# The heads' tensors (the masked-LM transform and decoder, the classifiers: none under "model.").
# attnlab has no counterpart of the classifiers; a checkpoint with one imports with head "none".
MODERNBERT_HEAD_TENSOR = re.compile(r"(head|decoder|classifier)\..*")


def modernbert_config_from_hf(
    hf: Mapping[str, Any],
    *,
    head: str = "none",
    pad_id: int | None = None,
    dropout: float | None = None,
    source: str = "config.json",
) -> BertConfig:
    """The `BertConfig` equivalent to a Hugging Face ModernBERT `config.json`, read as a dict.

    Keys left out take transformers' ModernBertConfig defaults. `head` is "mlm" or "none". `pad_id`
    (the tokenizer's) must agree with `pad_token_id`. `dropout` overrides the checkpoint's, which
    must otherwise agree (attnlab has one rate). Raises `CheckpointError` naming `source` and the
    key for a config attnlab cannot represent exactly."""
    if hf.get("model_type") != "modernbert":
        raise CheckpointError(f"{source}: model_type is {hf.get('model_type')!r}, not 'modernbert'")
    check_switches(hf, MODERNBERT_SWITCHES, "ModernBERT", source)

    def get(key: str, kind: type | tuple[type, ...]) -> Any:
        return config_value(hf, MODERNBERT_DEFAULTS, key, kind, source)

    n_layers = get("num_hidden_layers", int)
    patterns = layer_patterns(hf, n_layers, source)
    full_theta, local_theta = rope_thetas(hf, source)
    hf_pad = get("pad_token_id", int)
    if pad_id is not None and pad_id != hf_pad:
        raise CheckpointError(
            f"{source}: pad_token_id={hf_pad} but the vocabulary's padding token is id {pad_id}; "
            "attnlab masks padding by id, so the two must agree"
        )
    if dropout is None:
        keys = ("attention_dropout", "embedding_dropout", "mlp_dropout")
        dropout = one_dropout({key: get(key, (int, float)) for key in keys}, source)
    window = get("local_attention", int)
    try:
        return BertConfig(
            vocab_size=get("vocab_size", int),
            max_len=get("max_position_embeddings", int),
            positions="rope",
            rope_theta=full_theta,
            window_rope_theta=local_theta,
            # attnlab's window sees |i - j| < w; ModernBERT's local layers |i - j| <= local_attention // 2.
            layer_attention=patterns if "window" in patterns else (),
            attention_window=window // 2 + 1,
            type_vocab_size=0,
            d_model=get("hidden_size", int),
            n_heads=get("num_attention_heads", int),
            n_layers=n_layers,
            d_ff=get("intermediate_size", int),
            ffn_hidden=get("intermediate_size", int),
            dropout=float(dropout),
            activation="geglu",
            layer_norm_eps=float(get("norm_eps", (int, float))),
            norm="pre",
            norm_first_block=False,
            bias=False,
            pad_id=hf_pad,
            head=head,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def layer_patterns(hf: Mapping[str, Any], n_layers: int, source: str) -> tuple[str, ...]:
    """Each layer's attention, "full" or "window": transformers 5's `layer_types`, or an older
    file's `global_attn_every_n_layers` (layer i global when i is a multiple of it)."""
    types = hf.get("layer_types")
    if types is None:
        every = config_value(hf, MODERNBERT_DEFAULTS, "global_attn_every_n_layers", int, source)
        if every < 1:
            raise CheckpointError(f"{source}: global_attn_every_n_layers must be >= 1, got {every}")
        return tuple("window" if i % every else "full" for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        raise CheckpointError(f"{source}: layer_types must list {n_layers} of {list(LAYER_TYPES)}, got {types!r}")
    return tuple(LAYER_TYPES[t] for t in types)


def rope_thetas(hf: Mapping[str, Any], source: str) -> tuple[float, float]:
    """RoPE's bases of the global and the local layers: transformers 5's `rope_parameters` (one
    entry per layer type, plain rotary angles only), or an older file's `global_rope_theta` and
    `local_rope_theta`."""
    params = hf.get("rope_parameters")
    if params is None:
        keys = ("global_rope_theta", "local_rope_theta")
        return tuple(float(config_value(hf, MODERNBERT_DEFAULTS, key, (int, float), source)) for key in keys)
    thetas = []
    for layer_type, key in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        entry = params.get(layer_type) if isinstance(params, dict) else None
        entry = {"rope_theta": MODERNBERT_DEFAULTS[key]} if entry is None else entry
        if not isinstance(entry, dict) or entry.get("rope_type", "default") != "default":
            raise CheckpointError(
                f"{source}: rope_parameters.{layer_type}={entry!r} cannot be imported (it rescales the rotary "
                "angles); attnlab computes rope_type 'default' for ModernBERT"
            )
        theta = entry.get("rope_theta", MODERNBERT_DEFAULTS[key])
        if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0:
            raise CheckpointError(f"{source}: rope_parameters.{layer_type}.rope_theta must be > 0, got {theta!r}")
        thetas.append(float(theta))
    return thetas[0], thetas[1]


def load_modernbert(
    folder: str | Path | HFSource,
    *,
    dropout: float | None = None,
    head: str = "auto",
    dtype: torch.dtype = torch.float32,
) -> LoadedBert:
    """Load the Hugging Face ModernBERT checkpoint in `folder` (config.json, the weights,
    tokenizer.json) as an attnlab `Bert`, in eval mode, with its BPE vocabulary.

    head: "auto" gives the masked-LM head when the checkpoint has one (`decoder.bias`, saved by
    ModernBertForMaskedLM) and none otherwise (a classifier's checkpoint gives its encoder alone);
    "mlm" requires it; "none" skips it. Parameters are cast to `dtype`. Raises `CheckpointError`
    naming the file and the key on any mismatch."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {list(HEADS)}, got {head!r}")
    source = as_source(folder, "ModernBERT")
    tokenizer = read_modernbert_tokenizer(source.config_path.parent)
    has_mlm = "decoder.bias" in source.tensors
    if head == "mlm" and not has_mlm:
        raise CheckpointError(f"{source.weights_path}: no masked-LM head (decoder.bias); pass head='none'")
    head = ("mlm" if has_mlm else "none") if head == "auto" else head
    # Without its head, a checkpoint's head tensors are left out; every other one must be taken.
    ignored = MODERNBERT_HEAD_TENSOR if head == "none" else None
    tensors = CheckpointTensors(source.tensors, source.weights_path, prefix="model.", ignored=ignored)
    config = modernbert_config_from_hf(
        source.config, head=head, pad_id=tokenizer.pad_id, dropout=dropout, source=str(source.config_path)
    )
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"{source.config_path.parent}: the vocabulary has {tokenizer.vocab_size} tokens but config.json says "
            f"vocab_size={config.vocab_size}; the tokenizer belongs to another model"
        )
    model = Bert(config).to(dtype)  # the pooler, which ModernBERT has not, keeps its fresh initialisation
    state = _convert(tensors, config, model.state_dict())
    model.load_state_dict({name: t.to(dtype) for name, t in state.items()}, strict=False)
    missing = sorted(set(model.state_dict()) - set(state) - {"head.decoder.weight"})
    if missing != ["pooler.bias", "pooler.weight"]:
        raise RuntimeError(f"ModernBERT name map is incomplete: missing {missing}")
    return LoadedBert(model=model.eval(), tokenizer=tokenizer, config=config, missing=missing)


def _convert(
    tensors: CheckpointTensors, config: BertConfig, expected: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """attnlab's tensors by the name map; refuses a stored tensor the map does not take."""
    plan = dict(MODERNBERT_TOP_TENSORS)
    for i in range(config.n_layers):
        plan.update({f"layers.{i}.{hf}": f"blocks.{i}.{ours}" for hf, ours in MODERNBERT_LAYER_TENSORS.items()})
    del plan["layers.0.attn_norm.weight"]  # block 0 reads the embeddings' norm
    if config.head == "mlm":
        plan.update(MODERNBERT_MLM_TENSORS)
    state = {ours: tensors.take(hf, expected[ours]) for hf, ours in plan.items()}
    tensors.check_all_taken("ModernBERT")
    return state


def read_modernbert_tokenizer(folder: Path) -> EncoderTokenizer:
    """The BPE vocabulary of a ModernBERT folder: its tokenizer.json, whose post-processor frames a
    text as "[CLS] text [SEP]"."""
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(f"no {TOKENIZER_FILE} in {folder}; download ModernBERT's tokenizer with the weights")
    tokenizer = load_tokenizer(path)
    if not isinstance(tokenizer, EncoderTokenizer):
        raise CheckpointError(
            f"{path} does not frame a text between [CLS] and [SEP] (its post-processor); a ModernBERT checkpoint "
            "needs its own tokenizer.json"
        )
    return tokenizer
