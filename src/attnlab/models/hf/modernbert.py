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
    head.dense / head.norm             -> head.dense / head.norm (the masked-LM transform, and the
                                          classifiers': ModernBertPredictionHead in both)
    decoder.bias                       -> head.decoder.bias (the decoder weight is embeddings.token)
    classifier                         -> head.proj (ModernBertForSequenceClassification / ...TokenClassification)
RoPE needs no permutation: transformers' `rotate_half` pairs dimension j of a head with j + D/2, as
attnlab's rotary positions do. The classifiers are `classifier(drop(norm(gelu(dense(x)))))` over
the pooled state (`classifier_pooling`: the [CLS] state or the mean of the real positions) or every
position: attnlab's `classifier_head = "prediction"` (`PredictionClassifierHead`), which has no tanh
pooler; every ModernBERT config is read with it, so a run fine-tuned from a ModernBERT folder has
transformers' head.

The way back (`modernbert_export`) reads the name map backwards, for any `Bert` with ModernBERT's
parts (`modernbert_export_problems` names each one it lacks). config.json carries transformers 5's
`layer_types` and `rope_parameters` and, for older readers, the Hub's `global_attn_every_n_layers`
(where the layers' pattern repeats so), `global_rope_theta` and `local_rope_theta`.

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
    COMMON_EXPORT_RULES,
    TOKENIZER_FILE,
    CheckpointTensors,
    HFCheckpoint,
    HFSource,
    PartRule,
    as_source,
    check_switches,
    config_value,
    is_value,
    one_dropout,
    part_problems,
    refuse,
)
from attnlab.models.hf.bert import LoadedBert, label_fields, label_names

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
    "classifier_activation": ("gelu", "another function in the heads' transform (masked-LM and classifiers)"),
    "attention_bias": (False, "biases on the attention projections"),
    "mlp_bias": (False, "biases in the feed-forward layer"),
    "norm_bias": (False, "a bias in every LayerNorm"),
    "classifier_bias": (False, "a bias on the heads' dense layer"),
    "decoder_bias": (True, "a masked-LM decoder without its output bias"),
    "is_decoder": (False, "a decoder attends causally"),
}
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "window"}
HEADS = ("auto", "mlm", "sequence", "token", "none")
POOLINGS = ("cls", "mean")  # classifier_pooling: the same two as BertConfig.pooling
# attnlab head -> the transformers class that has it (config.json's `architectures`).
MODERNBERT_ARCHITECTURES = {
    "mlm": "ModernBertForMaskedLM",
    "sequence": "ModernBertForSequenceClassification",
    "token": "ModernBertForTokenClassification",
    "none": "ModernBertModel",
}

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
# Both classifiers: the prediction head, then the label layer (its dropout holds no tensor).
MODERNBERT_CLASSIFIER_TENSORS = {
    "head.dense.weight": "head.dense.weight",
    "head.norm.weight": "head.norm.weight",
    "classifier.weight": "head.proj.weight",
    "classifier.bias": "head.proj.bias",
}
MODERNBERT_HEAD_TENSORS = {
    "mlm": MODERNBERT_MLM_TENSORS,
    "sequence": MODERNBERT_CLASSIFIER_TENSORS,
    "token": MODERNBERT_CLASSIFIER_TENSORS,
}
# The heads' tensors (none under "model."): left out of a checkpoint read without its head.
MODERNBERT_HEAD_TENSOR = re.compile(r"(head|decoder|classifier)\..*")


def modernbert_config_from_hf(
    hf: Mapping[str, Any],
    *,
    head: str = "none",
    n_labels: int = 0,
    pad_id: int | None = None,
    dropout: float | None = None,
    source: str = "config.json",
) -> BertConfig:
    """The `BertConfig` equivalent to a Hugging Face ModernBERT `config.json`, read as a dict.

    Keys left out take transformers' ModernBertConfig defaults. `head` is "mlm", "sequence",
    "token" (with `n_labels` classes) or "none"; whichever it is, the config has ModernBERT's
    classifier (`classifier_head = "prediction"`, its pooling `classifier_pooling`), which a run
    fine-tuned from it keeps. `pad_id` (the tokenizer's) must agree with `pad_token_id`. `dropout`
    overrides the checkpoint's, which must otherwise agree (attnlab has one rate). Raises
    `CheckpointError` naming `source` and the key for a config attnlab cannot represent exactly."""
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
            n_labels=n_labels,
            classifier_head="prediction",
            pooling=classifier_pooling(hf, source),
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def classifier_pooling(hf: Mapping[str, Any], source: str) -> str:
    """What the sentence classifier reads, `classifier_pooling`: "cls" (the first position) or
    "mean" (the real positions' mean), attnlab's `BertConfig.pooling` of the same names."""
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in POOLINGS:
        raise CheckpointError(f"{source}: classifier_pooling must be one of {list(POOLINGS)}, got {pooling!r}")
    return pooling


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

    head: "auto" gives the head the checkpoint has: the masked-LM head (`decoder.bias`, saved by
    ModernBertForMaskedLM), a classifier ("sequence" or "token" by config.json's `architectures`,
    its labels from `id2label`) or none (ModernBertModel); "mlm", "sequence" and "token" require
    theirs; "none" skips any. Parameters are cast to `dtype`. Raises `CheckpointError` naming the
    file and the key on any mismatch."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {list(HEADS)}, got {head!r}")
    source = as_source(folder, "ModernBERT")
    tokenizer = read_modernbert_tokenizer(source.config_path.parent)
    head = _stored_head(head, source)
    labels = _labels(source) if head in ("sequence", "token") else []
    # Without its head, a checkpoint's head tensors are left out; every other one must be taken.
    ignored = MODERNBERT_HEAD_TENSOR if head == "none" else None
    tensors = CheckpointTensors(source.tensors, source.weights_path, prefix="model.", ignored=ignored)
    config = modernbert_config_from_hf(
        source.config,
        head=head,
        n_labels=len(labels),
        pad_id=tokenizer.pad_id,
        dropout=dropout,
        source=str(source.config_path),
    )
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"{source.config_path.parent}: the vocabulary has {tokenizer.vocab_size} tokens but config.json says "
            f"vocab_size={config.vocab_size}; the tokenizer belongs to another model"
        )
    model = Bert(config).to(dtype)
    state = _convert(tensors, config, model.state_dict())
    model.load_state_dict({name: t.to(dtype) for name, t in state.items()}, strict=False)
    missing = sorted(set(model.state_dict()) - set(state) - {"head.decoder.weight"})
    if missing:
        raise RuntimeError(f"ModernBERT name map is incomplete: missing {missing}")
    return LoadedBert(model=model.eval(), tokenizer=tokenizer, config=config, labels=labels)


def _stored_head(head: str, source: HFSource) -> str:
    """The head to build: `head` once the checkpoint is checked to hold it, or for "auto" the one it holds."""
    has_mlm, has_classifier = "decoder.bias" in source.tensors, "classifier.weight" in source.tensors
    if head == "mlm" and not has_mlm:
        raise CheckpointError(f"{source.weights_path}: no masked-LM head (decoder.bias); pass head='none'")
    if head in ("sequence", "token") and not has_classifier:
        raise CheckpointError(
            f"{source.weights_path}: no classifier (classifier.weight); save a {MODERNBERT_ARCHITECTURES[head]} "
            "or pass head='none'"
        )
    if head != "auto":
        return head
    if has_mlm or not has_classifier:
        return "mlm" if has_mlm else "none"
    # The two classifiers store the same tensors; only the class that saved them tells which.
    architectures = source.config.get("architectures") or []
    for name in ("sequence", "token"):
        if MODERNBERT_ARCHITECTURES[name] in architectures:
            return name
    raise CheckpointError(
        f"{source.config_path}: a classifier is stored but architectures {architectures} name neither "
        f"{MODERNBERT_ARCHITECTURES['sequence']} nor {MODERNBERT_ARCHITECTURES['token']}; pass head='sequence' "
        "or head='token'"
    )


def _labels(source: HFSource) -> list[str]:
    """A classifier's label names in id order: as many as its `classifier.weight` `(L, C)` scores."""
    return label_names(source.config, source.tensors["classifier.weight"].size(0), source.config_path)


def modernbert_encoder_plan(n_layers: int) -> dict[str, str]:
    """The encoder tensors of an `n_layers`-block ModernBERT: HF name (under "model.") -> attnlab name."""
    plan = dict(MODERNBERT_TOP_TENSORS)
    for i in range(n_layers):
        plan.update({f"layers.{i}.{hf}": f"blocks.{i}.{ours}" for hf, ours in MODERNBERT_LAYER_TENSORS.items()})
    del plan["layers.0.attn_norm.weight"]  # block 0 reads the embeddings' norm
    return plan


def _convert(
    tensors: CheckpointTensors, config: BertConfig, expected: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """attnlab's tensors by the name map; refuses a stored tensor the map does not take."""
    plan = modernbert_encoder_plan(config.n_layers) | MODERNBERT_HEAD_TENSORS.get(config.head, {})
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


# -- export: attnlab Bert -> transformers ModernBertFor... -----------------------------------------

# What a Bert needs to be a transformers ModernBERT (besides COMMON_EXPORT_RULES).
MODERNBERT_EXPORT_RULES: dict[str, PartRule] = {
    **COMMON_EXPORT_RULES,
    "positions": (is_value("positions", "rope"), "rotary positions"),
    "rope_scaling": (is_value("rope_scaling", "none"), "RoPE unscaled"),
    "rotary_dims": (is_value("rotary_dims", None), "RoPE over the whole head"),
    "head_size": (lambda c: c.head_size in (None, c.head_dim), "heads of d_model / n_heads features"),
    "n_kv_heads": (lambda c: c.n_kv_heads in (None, c.n_heads), "one key/value head per query head"),
    "qkv_bias": (is_value("qkv_bias", None, False), "no biases on q, k and v"),
    "qk_norm": (is_value("qk_norm", "none"), "no norm over the queries and keys"),
    "attention_scale": (is_value("attention_scale", None), "scores scaled by 1/√D"),
    "nope_layers": (is_value("nope_layers", ()), "rotary positions in every layer"),
    "norm": (is_value("norm", "pre"), "a norm before each sublayer (pre-norm)"),
    "norm_first_block": (is_value("norm_first_block", False), "no norm before the first block's attention"),
    "normalization": (is_value("normalization", "layernorm"), "LayerNorm"),
    "bias": (is_value("bias", False), "no biases"),
    "activation": (is_value("activation", "geglu"), "a GeGLU feed-forward layer"),
    "type_vocab_size": (is_value("type_vocab_size", 0), "no segment embeddings"),
    "position_ids": (is_value("position_ids", "index"), "positions counted from the first token"),
    "classifier_head": (
        lambda c: c.classifier_head == "prediction" or c.head in ("mlm", "none"),
        "classifiers over its prediction head (dense, GELU, norm), without a tanh pooler",
    ),
}


def is_modernbert(config: BertConfig) -> bool:
    """Whether a `Bert` is exported (and its adapters written) as ModernBERT: it has rotary
    positions, which of the encoder families only ModernBERT has. Whatever else it lacks of
    ModernBERT, `modernbert_export_problems` names."""
    return config.positions == "rope"


def modernbert_export_problems(config: BertConfig) -> list[str]:
    """What keeps `config` from being a transformers ModernBERT, one entry per part (empty: nothing)."""
    return part_problems(config, MODERNBERT_EXPORT_RULES, "ModernBERT")


def modernbert_config_to_hf(config: BertConfig, labels: list[str] | None = None) -> dict[str, Any]:
    """The ModernBERT config.json of `config` (the inverse of `modernbert_config_from_hf`), for
    the transformers class of its head; `labels` name a classifier's classes (default LABEL_i).
    Raises `ExportError` naming every part transformers' ModernBERT does not have."""
    refuse(modernbert_export_problems(config), "ModernBERT")
    patterns = config.layer_attention or (config.attention,) * config.n_layers
    local_theta = config.rope_theta if config.window_rope_theta is None else config.window_rope_theta
    thetas = {"full_attention": config.rope_theta, "sliding_attention": local_theta}
    hf: dict[str, Any] = {
        "model_type": "modernbert",
        "architectures": [MODERNBERT_ARCHITECTURES[config.head]],
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.ffn_size,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "max_position_embeddings": config.max_len,
        "norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_id,
        **{key: config.dropout for key in ("attention_dropout", "embedding_dropout", "mlp_dropout")},
        "classifier_dropout": config.dropout,  # attnlab's classifiers drop at the model's one rate
        "classifier_pooling": config.pooling,
        **{key: value for key, (value, _) in MODERNBERT_SWITCHES.items()},
        "layer_types": [next(hf for hf, ours in LAYER_TYPES.items() if ours == p) for p in patterns],
        # attnlab's window sees |i - j| < w keys either side; ModernBERT's |i - j| <= local_attention // 2.
        "local_attention": 2 * (config.attention_window - 1),
        "rope_parameters": {kind: {"rope_type": "default", "rope_theta": theta} for kind, theta in thetas.items()},
        "global_rope_theta": config.rope_theta,
        "local_rope_theta": local_theta,
        "tie_word_embeddings": True,  # the masked-LM decoder is the token embedding, in both libraries
    }
    if (every := _global_every(patterns)) is not None:
        hf["global_attn_every_n_layers"] = every
    return hf | label_fields(config, labels)


def _global_every(patterns: tuple[str, ...]) -> int | None:
    """n where layer i is global exactly when i is a multiple of n (the Hub's
    `global_attn_every_n_layers`, which older transformers read instead of `layer_types`); None
    for a pattern that is not so. Example: full, window, window, full -> 3."""
    for every in range(1, len(patterns) + 1):
        if all((p == "full") == (i % every == 0) for i, p in enumerate(patterns)):
            return every
    return None


def modernbert_export(
    model: Bert, labels: list[str] | None = None, tokenizer: EncoderTokenizer | None = None
) -> HFCheckpoint:
    """`model` as a checkpoint of the transformers ModernBERT class of its head
    (`MODERNBERT_ARCHITECTURES`): the name map read backwards, the masked-LM decoder's weight (the
    token embedding) not stored twice. `tokenizer` gives config.json's [CLS] and [SEP] ids (left
    null without one). Raises `ExportError` naming every part transformers' ModernBERT does not have."""
    c = model.config
    config = modernbert_config_to_hf(c, labels)
    cls_id, sep_id = (None, None) if tokenizer is None else (tokenizer.cls_id, tokenizer.sep_id)
    config |= {"cls_token_id": cls_id, "bos_token_id": cls_id, "sep_token_id": sep_id, "eos_token_id": sep_id}
    state = model.state_dict()
    # The *For* classes hold the encoder under "model."; the bare model is the encoder itself.
    prefix = "" if c.head == "none" else "model."
    tensors = {prefix + hf: state[ours] for hf, ours in modernbert_encoder_plan(c.n_layers).items()}
    tensors.update({hf: state[ours] for hf, ours in MODERNBERT_HEAD_TENSORS.get(c.head, {}).items()})
    return HFCheckpoint(config, tensors)
