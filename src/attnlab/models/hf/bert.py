"""Import Hugging Face BERT checkpoints from a local folder into attnlab's `Bert`, and export a
`Bert` back (`bert_export`): the same name map read both ways.

BERT source format: `config.json` (a `BertConfig`, transformers `models/bert/configuration_bert.py`),
the weights (see `_common`), and the vocabulary: `tokenizer.json` (a WordPiece `tokenizers` file) or BERT's
`vocab.txt` (lowercased unless `tokenizer_config.json` says `"do_lower_case": false`). Tensor names
are those of transformers `models/bert/modeling_bert.py`, with a `bert.` prefix when saved from
`BertForMaskedLM` or `BertForPreTraining` and none when saved from `BertModel`; the original
TensorFlow conversion's LayerNorm `gamma` / `beta` are read as `weight` / `bias`.

Name map, HF -> attnlab (i = block index, "layer.i" short for "encoder.layer.i"):
    embeddings.word_embeddings / position_embeddings / token_type_embeddings
                                           -> embeddings.token / position / segment
    embeddings.LayerNorm                   -> embeddings.norm
    layer.i.attention.self.{query,key,value} -> blocks.i.attn.in_proj (rows [q; k; v])
    layer.i.attention.output.dense         -> blocks.i.attn.out_proj
    layer.i.attention.output.LayerNorm     -> blocks.i.norm1
    layer.i.intermediate.dense             -> blocks.i.ffn.fc1
    layer.i.output.dense                   -> blocks.i.ffn.fc2
    layer.i.output.LayerNorm               -> blocks.i.norm2
    pooler.dense                           -> pooler
    cls.predictions.transform.dense / LayerNorm -> head.dense / head.norm
    cls.predictions.bias                   -> head.decoder.bias (the decoder weight is embeddings.token)
    classifier                             -> head.proj (BertForSequenceClassification / ...TokenClassification)
BERT's `nn.Linear` weights are `(out, in)` like attnlab's, so nothing is transposed. Stacking the
query, key and value weights gives `in_proj` exactly: both libraries split the result into heads as
contiguous slices of C / H features. The next-sentence head (`cls.seq_relationship`) has no attnlab
counterpart and is skipped.

Families with BERT's encoder (RoBERTa) name it as BERT does and differ around it: their prefix, their
heads and their config. An `EncoderFormat` says how; `load_encoder_checkpoint` and `encoder_export`
read and write any of them, `load_bert` and `bert_export` are the two for `BERT_FORMAT`.

References:
- Devlin et al. 2019 (BERT); google-research/bert `modeling.py`; transformers `modeling_bert.py`.
"""

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from attnlab.data.tokenizers import EncoderTokenizer, WordPieceTokenizer, load_tokenizer
from attnlab.errors import CheckpointError
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.hf._common import (
    COMMON_EXPORT_RULES,
    CONFIG_FILE,
    EXPORT_ACTIVATIONS,
    HF_ACTIVATIONS,
    TOKENIZER_FILE,
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
    read_json,
    refuse,
)

VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# transformers' BertConfig defaults (bert-base), used for keys a config.json leaves out.
BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
}

# As HF_FIXED_SWITCHES, for BERT's config.json.
BERT_FIXED_SWITCHES: dict[str, tuple[Any, str]] = {
    "position_embedding_type": (
        "absolute",
        "it adds relative-position terms to the attention scores (Shaw et al. 2018; Huang et al. 2020)",
    ),
    "is_decoder": (False, "a decoder BERT attends causally"),
    "add_cross_attention": (False, "attnlab's BERT blocks have no cross-attention"),
}

BERT_HEADS = ("auto", "mlm", "sequence", "token", "none")
# attnlab head -> the transformers class that has it (config.json's `architectures`).
BERT_ARCHITECTURES = {
    "mlm": "BertForMaskedLM",
    "sequence": "BertForSequenceClassification",
    "token": "BertForTokenClassification",
    "none": "BertModel",
}

# Encoder tensors: HF name (after the optional "bert.") -> attnlab name.
BERT_TOP_TENSORS: dict[str, str] = {
    "embeddings.word_embeddings.weight": "embeddings.token.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.segment.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
}
# Per-layer tensors: HF name after "encoder.layer.{i}." -> attnlab name after "blocks.{i}.".
# The query, key and value projections are stacked into attn.in_proj separately (BERT_QKV).
BERT_LAYER_TENSORS: dict[str, str] = {
    "attention.output.dense.weight": "attn.out_proj.weight",
    "attention.output.dense.bias": "attn.out_proj.bias",
    "attention.output.LayerNorm.weight": "norm1.weight",
    "attention.output.LayerNorm.bias": "norm1.bias",
    "intermediate.dense.weight": "ffn.fc1.weight",
    "intermediate.dense.bias": "ffn.fc1.bias",
    "output.dense.weight": "ffn.fc2.weight",
    "output.dense.bias": "ffn.fc2.bias",
    "output.LayerNorm.weight": "norm2.weight",
    "output.LayerNorm.bias": "norm2.bias",
}
BERT_QKV = ("query", "key", "value")  # the row order of attnlab's in_proj
# BertForMaskedLM saves no pooler (transformers builds it with add_pooling_layer=False); attnlab's
# pooler then keeps its fresh initialisation and LoadedBert.missing says so.
BERT_POOLER_TENSORS = {"pooler.dense.weight": "pooler.weight", "pooler.dense.bias": "pooler.bias"}
BERT_MLM_TENSORS: dict[str, str] = {
    "cls.predictions.transform.dense.weight": "head.dense.weight",
    "cls.predictions.transform.dense.bias": "head.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "head.norm.weight",
    "cls.predictions.transform.LayerNorm.bias": "head.norm.bias",
    "cls.predictions.bias": "head.decoder.bias",
}
# The label classifier of both classification heads (dropout, then this layer).
BERT_CLASSIFIER_TENSORS = {"classifier.weight": "head.proj.weight", "classifier.bias": "head.proj.bias"}
# Stored by some checkpoints and not needed: position / segment id buffers (attnlab counts positions
# itself) and the next-sentence-prediction head, which attnlab's Bert does not have.
BERT_IGNORED_TENSOR = re.compile(r"embeddings\.(position_ids|token_type_ids)|cls\.seq_relationship\..*")


@dataclasses.dataclass(frozen=True)
class EncoderFormat:
    """How a family of checkpoints with BERT's encoder names what is around it. The encoder itself
    (`BERT_TOP_TENSORS`, `BERT_LAYER_TENSORS`, `BERT_QKV`, the pooler) has BERT's names in every one."""

    family: str
    """As messages name it: "BERT"."""
    model_type: str
    """config.json's model_type."""
    prefix: str
    """The encoder's prefix in the transformers classes with a head ("bert."); none in the bare model."""
    defaults: Mapping[str, Any]
    """transformers' config defaults, for keys a config.json leaves out."""
    switches: Mapping[str, tuple[Any, str]]
    """config.json switches attnlab computes one value of (see `check_switches`)."""
    architectures: Mapping[str, str]
    """attnlab head -> the transformers class that has it."""
    mlm: str
    """The masked-LM head's module ("cls.predictions"): its `.decoder` is tied to the word embeddings."""
    mlm_tensors: Mapping[str, str]
    """The masked-LM head's tensors but the tied decoder: HF name -> attnlab name."""
    classifiers: Mapping[str, Mapping[str, str]]
    """"sequence" and "token" -> the classifier's tensors, HF name -> attnlab name."""
    position_ids: str = "index"
    """`BertConfig.position_ids` of the family; "after_padding" takes pad_id + 1 rows off the
    position table's max_position_embeddings to give max_len."""
    mlm_activation: str | None = None
    """The masked-LM transform's activation where the family fixes it; None: hidden_act's."""
    ignored: re.Pattern = BERT_IGNORED_TENSOR
    """Stored tensors attnlab does not need."""

    @property
    def classes(self) -> str:
        """The transformers classes, for messages: "BertModel, BertForMaskedLM, ..."."""
        return ", ".join(dict.fromkeys(self.architectures.values()))


BERT_FORMAT = EncoderFormat(
    family="BERT",
    model_type="bert",
    prefix="bert.",
    defaults=BERT_DEFAULTS,
    switches=BERT_FIXED_SWITCHES,
    architectures=BERT_ARCHITECTURES,
    mlm="cls.predictions",
    mlm_tensors=BERT_MLM_TENSORS,
    classifiers={"sequence": BERT_CLASSIFIER_TENSORS, "token": BERT_CLASSIFIER_TENSORS},
)


@dataclasses.dataclass
class LoadedBert:
    """A Hugging Face BERT checkpoint as attnlab objects."""

    model: Bert
    """In eval mode; its head is "mlm", "sequence", "token" or "none"."""
    tokenizer: EncoderTokenizer
    """BERT's WordPiece, RoBERTa's byte-level BPE: the ids for text, and the special roles."""
    config: BertConfig
    missing: list[str] = dataclasses.field(default_factory=list)
    """attnlab parameters the checkpoint has no tensor for, left at their fresh initialisation
    (the pooler of a BertForMaskedLM or BertForTokenClassification checkpoint)."""
    labels: list[str] = dataclasses.field(default_factory=list)
    """A classifier's label names in id order (config.json's id2label); empty without one."""


def bert_config_from_hf(
    hf: Mapping[str, Any],
    *,
    head: str = "none",
    n_labels: int = 0,
    pad_id: int | None = None,
    dropout: float | None = None,
    source: str = CONFIG_FILE,
) -> BertConfig:
    """The `BertConfig` equivalent to a Hugging Face BERT `config.json`, read as a dict.

    Keys left out take transformers' BertConfig defaults. `head` is "mlm", "sequence", "token" (with
    `n_labels` classes) or "none". `pad_id`, the
    tokenizer's [PAD] id, must agree with `pad_token_id` when the config sets one (attnlab masks
    padding by id). `dropout` overrides the HF dropouts; by default `hidden_dropout_prob` and
    `attention_probs_dropout_prob` must agree, as attnlab has one rate. Raises `CheckpointError`
    (naming `source`) for a config attnlab cannot represent exactly.
    """
    return encoder_config_from_hf(
        hf, BERT_FORMAT, head=head, n_labels=n_labels, pad_id=pad_id, dropout=dropout, source=source
    )


def encoder_config_from_hf(
    hf: Mapping[str, Any],
    fmt: EncoderFormat,
    *,
    head: str = "none",
    n_labels: int = 0,
    pad_id: int | None = None,
    dropout: float | None = None,
    source: str = CONFIG_FILE,
) -> BertConfig:
    """`bert_config_from_hf` for the family `fmt` (its model_type, defaults, switches and positions)."""
    _check_family(hf, fmt, source)
    check_switches(hf, fmt.switches, fmt.family, source)

    def get(key: str, kind: type | tuple[type, ...]) -> Any:
        return config_value(hf, fmt.defaults, key, kind, source)

    activation = get("hidden_act", str)
    if activation not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"{source}: hidden_act {activation!r} is not supported; attnlab can import {sorted(HF_ACTIVATIONS)}"
        )
    if head == "mlm" and fmt.mlm_activation not in (None, activation):
        # attnlab's masked-LM transform applies the blocks' activation; this family's applies its own.
        raise CheckpointError(
            f"{source}: hidden_act {activation!r} with a masked-LM head cannot be imported ({fmt.family}'s head "
            f"applies {fmt.mlm_activation!r} whatever hidden_act says); pass head='none' to import the encoder alone"
        )
    pad_id = _pad_id(hf, pad_id, fmt, source)
    if dropout is None:
        keys = ("hidden_dropout_prob", "attention_probs_dropout_prob")
        dropout = one_dropout({key: get(key, (int, float)) for key in keys}, source)
    table = get("max_position_embeddings", int)
    # RoBERTa's table also holds the pad_id + 1 rows its position counting skips.
    skipped = pad_id + 1 if fmt.position_ids == "after_padding" else 0
    if table <= skipped:
        raise CheckpointError(
            f"{source}: max_position_embeddings={table} leaves no position for a token; {fmt.family} counts "
            f"positions from pad_token_id + 1 = {skipped}"
        )
    try:
        return BertConfig(
            vocab_size=get("vocab_size", int),
            max_len=table - skipped,
            position_ids=fmt.position_ids,
            type_vocab_size=get("type_vocab_size", int),
            d_model=get("hidden_size", int),
            n_heads=get("num_attention_heads", int),
            n_layers=get("num_hidden_layers", int),
            d_ff=get("intermediate_size", int),
            dropout=dropout,
            activation=HF_ACTIVATIONS[activation],
            layer_norm_eps=float(get("layer_norm_eps", (int, float))),
            pad_id=pad_id,
            head=head,
            n_labels=n_labels,
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def _check_family(hf: Mapping[str, Any], fmt: EncoderFormat, source: str) -> None:
    """Refuse a config.json of another family: its model_type, or without one its architectures."""
    model_type = hf.get("model_type")
    architectures = hf.get("architectures") or []
    # The class names of a family share its prefix: BertModel, BertForPreTraining, ...
    class_prefix = fmt.architectures["none"].removesuffix("Model")
    ours = model_type == fmt.model_type or (
        model_type is None and any(isinstance(a, str) and a.startswith(class_prefix) for a in architectures)
    )
    if not ours:
        found = f"model_type is {model_type!r}" if model_type is not None else f"architectures are {architectures}"
        raise CheckpointError(
            f"{source}: {found}, not {fmt.model_type!r}; only {fmt.family} checkpoints can be imported here"
        )


def _pad_id(hf: Mapping[str, Any], pad_id: int | None, fmt: EncoderFormat, source: str) -> int:
    """The padding id: the tokenizer's `pad_id`, checked against config.json's pad_token_id."""
    default = fmt.defaults.get("pad_token_id", 0)
    hf_pad = hf.get("pad_token_id", default)
    if hf_pad is not None and (not isinstance(hf_pad, int) or isinstance(hf_pad, bool)):
        raise CheckpointError(f"{source}: pad_token_id must be an int or null, got {hf_pad!r}")
    if pad_id is None:
        return default if hf_pad is None else hf_pad
    if hf_pad is not None and hf_pad != pad_id:
        raise CheckpointError(
            f"{source}: pad_token_id={hf_pad} but the vocabulary's padding token is id {pad_id}; "
            "attnlab masks padding by id, so the two must agree"
        )
    return pad_id


def load_bert(
    folder: str | Path | HFSource,
    *,
    dropout: float | None = None,
    head: str = "auto",
    dtype: torch.dtype = torch.float32,
) -> LoadedBert:
    """Load the Hugging Face BERT checkpoint in `folder` as an attnlab `Bert`, in eval mode, with
    its WordPiece tokenizer.

    The folder holds `config.json`, the weights and the vocabulary (see the module docstring).
    head: "auto" gives the masked-LM head when the checkpoint has one (`cls.predictions.*`, saved
    by BertForMaskedLM and BertForPreTraining), the classifier when it has one (`classifier.*`:
    "sequence" or "token" by config.json's `architectures`), and no head otherwise; "mlm",
    "sequence" and "token" require theirs; "none" skips any. Every encoder tensor must be present
    with the shape config.json implies; only the pooler may be absent. Parameters are cast to
    `dtype`. Raises `CheckpointError` naming the file and the key on any mismatch.
    """
    return load_encoder_checkpoint(folder, BERT_FORMAT, _read_bert_tokenizer, dropout=dropout, head=head, dtype=dtype)


def load_encoder_checkpoint(
    folder: str | Path | HFSource,
    fmt: EncoderFormat,
    read_tokenizer: Callable[[Path], EncoderTokenizer],
    *,
    dropout: float | None = None,
    head: str = "auto",
    dtype: torch.dtype = torch.float32,
) -> LoadedBert:
    """`load_bert` for the family `fmt`, its vocabulary read from the checkpoint's folder by `read_tokenizer`."""
    if head not in BERT_HEADS:
        raise ValueError(f"head must be one of {list(BERT_HEADS)}, got {head!r}")
    source = as_source(folder, fmt.family)
    tokenizer = read_tokenizer(source.config_path.parent)
    hf_state = _bert_state(source.tensors, source.weights_path, fmt)

    head = _stored_head(head, hf_state, source.config, source.weights_path, fmt)
    labels = _labels(source, hf_state, fmt, head) if head in fmt.classifiers else []
    config = encoder_config_from_hf(
        source.config,
        fmt,
        head=head,
        n_labels=len(labels),
        pad_id=tokenizer.pad_id,
        dropout=dropout,
        source=str(source.config_path),
    )
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"{source.config_path.parent}: the vocabulary has {tokenizer.vocab_size} tokens but {CONFIG_FILE} says "
            f"vocab_size={config.vocab_size}; the tokenizer belongs to another model"
        )

    model = Bert(config)  # fresh initialisation for anything the checkpoint may lack (the pooler)
    state = _convert_bert(hf_state, config, model.state_dict(), source.weights_path, fmt)
    state = {name: t.to(dtype).contiguous() for name, t in state.items()}
    model.to(dtype)
    # Copies into the existing parameters, so the MLM decoder stays tied to the token embedding.
    result = model.load_state_dict(state, strict=False)
    missing = [name for name in result.missing_keys if name != "head.decoder.weight"]
    if any(name not in BERT_POOLER_TENSORS.values() for name in missing) or result.unexpected_keys:
        raise RuntimeError(
            f"{fmt.family} name map is incomplete: missing {missing}, unexpected {result.unexpected_keys}"
        )
    return LoadedBert(model=model.eval(), tokenizer=tokenizer, config=config, missing=missing, labels=labels)


def _stored_head(
    head: str, hf_state: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any], source: Path, fmt: EncoderFormat
) -> str:
    """The head to build: `head` once the checkpoint is checked to hold it, or for "auto" the one it holds."""
    has_mlm = any(name.startswith(fmt.mlm + ".") for name in hf_state)
    has_classifier = any(name.startswith("classifier.") for name in hf_state)
    if head == "mlm" and not has_mlm:
        raise CheckpointError(
            f"{source}: no masked-LM head ({fmt.mlm}.*); save a {fmt.architectures['mlm']} or pass head='none'"
        )
    if head in fmt.classifiers and not has_classifier:
        raise CheckpointError(
            f"{source}: no classifier (classifier.*); save a {fmt.architectures[head]} or pass head='none'"
        )
    if head != "auto":
        return head
    if has_mlm:
        return "mlm"
    if not has_classifier:
        return "none"
    # BERT's two classification heads store the same two tensors; only the class that saved them tells which.
    architectures = hf_config.get("architectures") or []
    for name in fmt.classifiers:
        if fmt.architectures[name] in architectures:
            return name
    raise CheckpointError(
        f"{source}: a classifier is stored but config.json's architectures {architectures} name neither "
        f"{' nor '.join(fmt.architectures[name] for name in fmt.classifiers)}; pass head='sequence' or head='token'"
    )


def _labels(source: HFSource, hf_state: Mapping[str, torch.Tensor], fmt: EncoderFormat, head: str) -> list[str]:
    """The classifier's label names in id order (`label_names` of the classes its layer scores)."""
    # The weight (L, C) of the layer that scores the labels.
    layer = next(hf for hf, ours in fmt.classifiers[head].items() if ours == "head.proj.weight")
    if layer not in hf_state:
        raise CheckpointError(
            f"{source.weights_path}: missing tensor {layer}, which a {fmt.architectures[head]} stores; "
            f"pass the head the checkpoint has (head='sequence' or head='token') or head='none'"
        )
    return label_names(source.config, hf_state[layer].size(0), source.config_path)


def label_names(hf: Mapping[str, Any], n: int, source: Path) -> list[str]:
    """The names of a classifier's `n` classes in id order: config.json's id2label when it has one
    for every class, else LABEL_0, LABEL_1, ... (transformers' own default names)."""
    id2label = hf.get("id2label") or {}
    if not isinstance(id2label, dict):
        raise CheckpointError(f"{source}: id2label must be an object, got {id2label!r}")
    names = [id2label.get(str(i), id2label.get(i)) for i in range(n)]
    if len(id2label) != n or not all(isinstance(name, str) for name in names):
        return [f"LABEL_{i}" for i in range(n)]
    return names


def _read_bert_tokenizer(folder: Path) -> WordPieceTokenizer:
    """The WordPiece tokenizer of a BERT folder: tokenizer.json if present, else vocab.txt."""
    path = folder / TOKENIZER_FILE
    if path.is_file():
        tokenizer = load_tokenizer(path)
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise CheckpointError(
                f"{path} is not a WordPiece tokenizer; a BERT checkpoint needs its WordPiece vocabulary"
            )
        return tokenizer
    path = folder / VOCAB_FILE
    if not path.is_file():
        raise CheckpointError(
            f"no tokenizer in {folder}: expected {TOKENIZER_FILE} or {VOCAB_FILE}; "
            "download the vocabulary with the weights"
        )
    lowercase = True  # BertTokenizer's default
    config_path = folder / TOKENIZER_CONFIG_FILE
    if config_path.is_file():
        doc = read_json(config_path, what="the tokenizer config")
        lowercase = doc.get("do_lower_case", True) if isinstance(doc, dict) else None
        if not isinstance(lowercase, bool):
            raise CheckpointError(f"{config_path}: do_lower_case must be true or false, got {lowercase!r}")
    return WordPieceTokenizer.from_vocab_txt(path, lowercase=lowercase)


def _bert_state(tensors: Mapping[str, torch.Tensor], source: Path, fmt: EncoderFormat) -> dict[str, torch.Tensor]:
    """HF tensors under their bare-model names (no "bert." prefix, LayerNorm weight / bias),
    without those attnlab does not need."""
    state: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix(fmt.prefix)
        # The original TensorFlow conversion named LayerNorm parameters gamma and beta.
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        if name in state:
            raise CheckpointError(f"{source}: tensor {name} is stored twice (under two of its names)")
        if not fmt.ignored.fullmatch(name):
            state[name] = tensor
    return state


def bert_encoder_plan(n_layers: int) -> dict[str, str]:
    """The encoder tensors of an `n_layers`-block BERT but q, k, v (`BERT_QKV`): HF name -> attnlab name."""
    plan = dict(BERT_TOP_TENSORS)
    for i in range(n_layers):
        plan.update({f"encoder.layer.{i}.{hf}": f"blocks.{i}.{ours}" for hf, ours in BERT_LAYER_TENSORS.items()})
    return plan


def _convert_bert(
    hf_state: dict[str, torch.Tensor],
    config: BertConfig,
    expected: Mapping[str, torch.Tensor],
    source: Path,
    fmt: EncoderFormat = BERT_FORMAT,
) -> dict[str, torch.Tensor]:
    """Rename HF tensors to attnlab's names and stack q, k, v; check keys, shapes and the tying."""
    c = config.d_model
    hf_state, plan, optional = _head_plan(hf_state, config, source, fmt)
    qkv = {
        f"encoder.layer.{i}.attention.self.{part}.{kind}"
        for i in range(config.n_layers)
        for part in BERT_QKV
        for kind in ("weight", "bias")
    }
    for name in hf_state:
        if name not in plan and name not in optional and name not in qkv:
            raise CheckpointError(
                f"{source}: unexpected tensor {name} for a {fmt.family} with num_hidden_layers={config.n_layers}; "
                f"only {fmt.classes} checkpoints matching config.json can be imported"
            )

    def take(hf: str, like: torch.Tensor) -> torch.Tensor:
        if hf not in hf_state:
            raise CheckpointError(
                f"{source}: missing tensor {hf} (or {fmt.prefix}{hf}); the weights file is incomplete or belongs "
                "to another config.json, re-save it with save_pretrained"
            )
        return checked(hf, hf_state[hf], like, False, source)

    state = {ours: take(hf, expected[ours]) for hf, ours in plan.items()}
    state.update({ours: take(hf, expected[ours]) for hf, ours in optional.items() if hf in hf_state})
    for i in range(config.n_layers):
        for kind in ("weight", "bias"):
            ours = f"blocks.{i}.attn.in_proj.{kind}"
            parts = [take(f"encoder.layer.{i}.attention.self.{p}.{kind}", expected[ours][:c]) for p in BERT_QKV]
            state[ours] = torch.cat(parts, dim=0)  # (3C, C) or (3C,): rows [q; k; v]
    return state


def _head_plan(
    hf_state: dict[str, torch.Tensor], config: BertConfig, source: Path, fmt: EncoderFormat
) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, str]]:
    """The tensors to convert (without the other heads'), the name map of those that must be
    there (the encoder and the head) and of those that may be (the pooler)."""
    hf_state = dict(hf_state)
    plan = bert_encoder_plan(config.n_layers)
    optional = dict(BERT_POOLER_TENSORS)
    # The MLM decoder: its weight is the word embedding matrix, its bias "<mlm>.bias" (older
    # checkpoints also store both under <mlm>.decoder, some only the bias there).
    decoder_weight = hf_state.pop(f"{fmt.mlm}.decoder.weight", None)
    decoder_bias = hf_state.pop(f"{fmt.mlm}.decoder.bias", None)
    if config.head == "mlm":
        plan.update(fmt.mlm_tensors)
        if f"{fmt.mlm}.bias" not in hf_state and decoder_bias is not None:
            hf_state[f"{fmt.mlm}.bias"] = decoder_bias
        words = hf_state.get("embeddings.word_embeddings.weight")
        if decoder_weight is not None and words is not None and not torch.equal(decoder_weight, words):
            raise CheckpointError(
                f"{source}: {fmt.mlm}.decoder.weight differs from the word embeddings; attnlab's masked-LM "
                "decoder is always tied to them (pass head='none' to import the encoder alone)"
            )
    else:
        hf_state = {name: t for name, t in hf_state.items() if not name.startswith(fmt.mlm + ".")}
    if config.head in fmt.classifiers:
        plan.update(fmt.classifiers[config.head])
        # RoBERTa's sentence classifier holds the pooler's dense layer; its bare model's pooler is another.
        optional = {hf: ours for hf, ours in optional.items() if ours not in plan.values()}
    else:
        hf_state = {name: t for name, t in hf_state.items() if not name.startswith("classifier.")}
    return hf_state, plan, optional


# -- export: attnlab Bert -> transformers BertFor... -----------------------------------------------

# What a Bert needs to be a transformers BERT (besides COMMON_EXPORT_RULES).
BERT_EXPORT_RULES: dict[str, PartRule] = {
    **COMMON_EXPORT_RULES,
    "positions": (is_value("positions", "learned"), "learned absolute positions"),
    "norm": (is_value("norm", "post"), "LayerNorm after each residual sum (post-norm)"),
    "normalization": (is_value("normalization", "layernorm"), "LayerNorm"),
    "activation": (is_value("activation", *EXPORT_ACTIVATIONS), f"one of {sorted(EXPORT_ACTIVATIONS)}"),
    "n_kv_heads": (lambda c: c.n_kv_heads in (None, c.n_heads), "one key/value head per query head"),
    "bias": (is_value("bias", True), "biases in every layer and norm"),
    "type_vocab_size": (lambda c: c.type_vocab_size >= 1, "segment embeddings (type_vocab_size >= 1)"),
    # Only the sequence classifier and BertModel's pooler_output read the pooler.
    "pooling": (lambda c: c.pooling == "cls" or c.head in ("mlm", "token"), "a pooler on the [CLS] state"),
    "classifier_head": (
        lambda c: c.classifier_head == "linear" or c.head == "mlm",
        "a linear classifier, a sentence's on the tanh pooler",
    ),
}


def bert_export_problems(config: BertConfig) -> list[str]:
    """What keeps `config` from being a transformers BERT, one entry per part (empty: nothing)."""
    return encoder_export_problems(config, BERT_FORMAT)


def encoder_export_problems(config: BertConfig, fmt: EncoderFormat) -> list[str]:
    """What keeps `config` from being a checkpoint of the family `fmt`, one entry per part."""
    rules = {
        **BERT_EXPORT_RULES,
        "position_ids": (is_value("position_ids", fmt.position_ids), f"position ids {fmt.position_ids!r}"),
    }
    if fmt.mlm_activation is not None:
        wanted = HF_ACTIVATIONS[fmt.mlm_activation]
        rules["activation"] = (
            lambda c: c.activation == wanted or c.head != "mlm" and c.activation in EXPORT_ACTIVATIONS,
            f"{wanted!r} under a masked-LM head (one of {sorted(EXPORT_ACTIVATIONS)} without one)",
        )
    return part_problems(config, rules, fmt.family)


def bert_config_to_hf(config: BertConfig, labels: list[str] | None = None) -> dict[str, Any]:
    """The BERT config.json of `config` (the inverse of `bert_config_from_hf`), for the
    transformers class of its head; `labels` name a classifier's classes (default LABEL_i).
    Raises `ExportError` naming every part transformers' BERT does not have."""
    return encoder_config_to_hf(config, BERT_FORMAT, labels)


def encoder_config_to_hf(config: BertConfig, fmt: EncoderFormat, labels: list[str] | None = None) -> dict[str, Any]:
    """`bert_config_to_hf` for the family `fmt`."""
    refuse(encoder_export_problems(config, fmt), fmt.family)
    hf: dict[str, Any] = {
        "model_type": fmt.model_type,
        "architectures": [fmt.architectures[config.head]],
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.ffn_size,
        "hidden_act": EXPORT_ACTIVATIONS[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.dropout,
        "max_position_embeddings": config.position_rows,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,  # the masked-LM decoder is the token embedding, in both libraries
    }
    return hf | label_fields(config, labels)


def label_fields(config: BertConfig, labels: list[str] | None) -> dict[str, Any]:
    """config.json's id2label and label2id of a classifier, its classes named `labels` (default
    LABEL_i; the inverse of `label_names`); none for another head."""
    if config.head not in ("sequence", "token"):
        return {}
    names = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(config.n_labels)]
    if len(names) != config.n_labels:
        raise ValueError(f"{len(names)} label names for a classifier of {config.n_labels} classes")
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def bert_export(model: Bert, labels: list[str] | None = None) -> HFCheckpoint:
    """`model` as a checkpoint of the transformers class of its head (`BERT_ARCHITECTURES`): the
    name map read backwards, in_proj split into query, key and value. The pooler goes where
    transformers has one (BertModel, BertForSequenceClassification); the masked-LM decoder's weight
    is the word embedding and is not stored twice. Raises `ExportError` naming every part
    transformers' BERT does not have."""
    return encoder_export(model, BERT_FORMAT, labels)


def encoder_export(model: Bert, fmt: EncoderFormat, labels: list[str] | None = None) -> HFCheckpoint:
    """`bert_export` for the family `fmt`."""
    c = model.config
    config = encoder_config_to_hf(c, fmt, labels)
    state = model.state_dict()
    # The *For* classes hold the encoder under the prefix ("bert."); the bare model is the encoder itself.
    prefix = "" if c.head == "none" else fmt.prefix
    tensors = {prefix + hf: state[ours] for hf, ours in bert_encoder_plan(c.n_layers).items()}
    for i in range(c.n_layers):
        for kind in ("weight", "bias"):
            parts = state[f"blocks.{i}.attn.in_proj.{kind}"].chunk(3)  # rows [q; k; v]
            for part, t in zip(BERT_QKV, parts, strict=True):
                tensors[f"{prefix}encoder.layer.{i}.attention.self.{part}.{kind}"] = t
    heads = {"mlm": fmt.mlm_tensors, **fmt.classifiers}
    head_tensors = heads.get(c.head, {})
    # The bare model has a pooler, and so has BERT's sentence classifier (RoBERTa's holds its own).
    if c.head == "none" or c.head == "sequence" and "pooler.weight" not in head_tensors.values():
        tensors.update({prefix + hf: state[ours] for hf, ours in BERT_POOLER_TENSORS.items()})
    tensors.update({hf: state[ours] for hf, ours in head_tensors.items()})
    return HFCheckpoint(config, tensors)
