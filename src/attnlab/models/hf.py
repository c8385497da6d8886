"""Import Hugging Face GPT-2 and BERT checkpoints from a local folder into attnlab's `GPT` and `Bert`.

Nothing is ever downloaded: fetch the folder first (e.g. `huggingface-cli download
openai-community/gpt2`) and pass its path. Both importers share the file readers below.

GPT-2 source format: a folder as written by `transformers`' `save_pretrained` for `GPT2LMHeadModel` or
`GPT2Model`, the layout of the `openai-community/gpt2*` repositories on the Hugging Face Hub:
- `config.json`: a `GPT2Config` (transformers `models/gpt2/configuration_gpt2.py`);
- `model.safetensors`, or `pytorch_model.bin` (a state dict of tensors; read with
  `torch.load(weights_only=True)`), or either one sharded behind its `*.index.json`.
Names are those of transformers `models/gpt2/modeling_gpt2.py`, with a `transformer.` prefix when
saved from `GPT2LMHeadModel` and none when saved from `GPT2Model`.

Name map, HF -> attnlab (i = block index):
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

BERT source format: `config.json` (a `BertConfig`, transformers `models/bert/configuration_bert.py`),
the weights as above, and the vocabulary: `tokenizer.json` (a WordPiece `tokenizers` file) or BERT's
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
BERT's `nn.Linear` weights are `(out, in)` like attnlab's, so nothing is transposed. Stacking the
query, key and value weights gives `in_proj` exactly: both libraries split the result into heads as
contiguous slices of C / H features. The next-sentence head (`cls.seq_relationship`) has no attnlab
counterpart and is skipped.

References:
- Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2).
- openai/gpt-2 `src/model.py` (`conv1d`, `attn`); transformers `modeling_gpt2.py` (`GPT2Attention`).
- Devlin et al. 2019 (BERT); google-research/bert `modeling.py`; transformers `modeling_bert.py`.
"""

import dataclasses
import json
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnlab.data.tokenizers import WordPieceTokenizer, load_tokenizer
from attnlab.errors import CheckpointError
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.gpt import GPT, GPTConfig

CONFIG_FILE = "config.json"
# Looked for in this order; the first one present is read.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

# HF `activation_function` -> attnlab activation. "gelu_new" is GPT-2's own tanh approximation of
# GELU (Hendrycks & Gimpel 2016, §2), the same function as PyTorch's approximate="tanh".
HF_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}

# config.json switches whose non-default value changes the forward pass in a way attnlab's GPT does
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
    _check_switches(hf, HF_FIXED_SWITCHES, "GPT", source)

    def get(key: str, kind: type | tuple[type, ...]) -> Any:
        return _config_value(hf, HF_DEFAULTS, key, kind, source)

    activation = get("activation_function", str)
    if activation not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"{source}: activation_function {activation!r} is not supported; "
            f"attnlab can import {sorted(HF_ACTIVATIONS)}"
        )
    n_embd = get("n_embd", int)
    n_inner = hf.get("n_inner")
    if n_inner is None:
        n_inner = 4 * n_embd
    elif not isinstance(n_inner, int) or isinstance(n_inner, bool) or n_inner < 1 or n_inner % n_embd != 0:
        raise CheckpointError(
            f"{source}: n_inner={n_inner!r} is not a positive multiple of n_embd={n_embd}; "
            "attnlab's feed-forward width is ffn_mult * n_embd"
        )
    if dropout is None:
        keys = ("resid_pdrop", "attn_pdrop", "embd_pdrop")
        dropout = _one_dropout({key: get(key, (int, float)) for key in keys}, source)
    try:
        return GPTConfig(
            vocab_size=get("vocab_size", int),
            block_size=get("n_positions", int),
            n_layer=get("n_layer", int),
            n_head=get("n_head", int),
            n_embd=n_embd,
            dropout=dropout,
            bias=True,
            positions="learned",
            activation=HF_ACTIVATIONS[activation],
            norm="pre",
            ffn_mult=n_inner // n_embd,
            layer_norm_eps=float(get("layer_norm_epsilon", (int, float))),
            tie_weights=get("tie_word_embeddings", bool),
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def load_gpt2(folder: str | Path, *, dtype: torch.dtype = torch.float32, dropout: float | None = None) -> GPT:
    """Load the Hugging Face GPT-2 checkpoint in `folder` as an attnlab `GPT`, in eval mode.

    The folder holds `config.json` and the weights (see the module docstring). Every tensor must be
    used and every parameter filled, with the shape the config implies. The output head is tied
    to the token embedding unless the checkpoint stores an `lm_head.weight` that differs from it.
    Parameters are cast to `dtype`. Raises `CheckpointError` naming the file and key on any mismatch.
    """
    folder = Path(folder)
    config_path, hf_config = _read_hf_config(
        folder, "GPT-2", f"{CONFIG_FILE} and model.safetensors (download it first, e.g. with huggingface-cli download)"
    )
    config = gpt2_config_from_hf(hf_config, dropout=dropout, source=str(config_path))
    weights_path, tensors = _read_weights(folder)

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
        state["lm_head.weight"] = _checked("lm_head.weight", head, expected["lm_head.weight"], False, weights_path)
    else:
        state["lm_head.weight"] = state["token_embedding.weight"]
    state = {name: t.to(dtype).contiguous() for name, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_weights:
        # assign=True installs two separate Parameters; share the one matrix again (Press & Wolf 2017).
        model.lm_head.weight = model.token_embedding.weight
    return model.eval()


def _convert(
    hf_state: dict[str, torch.Tensor], config: GPTConfig, expected: Mapping[str, torch.Tensor], source: Path
) -> dict[str, torch.Tensor]:
    """Rename HF GPT-2 tensors to attnlab's names, transposing Conv1D weights; check keys and shapes."""
    plan = {hf: (ours, False) for hf, ours in TOP_TENSORS.items()}
    for i in range(config.n_layer):
        for hf, (ours, conv) in BLOCK_TENSORS.items():
            plan[f"h.{i}.{hf}"] = (f"blocks.{i}.{ours}", conv)
    for name in hf_state:
        if name not in plan:
            raise CheckpointError(
                f"{source}: unexpected tensor {name} for a GPT-2 with n_layer={config.n_layer}; "
                "only GPT2Model / GPT2LMHeadModel checkpoints matching config.json can be imported"
            )
    state = {}
    for hf, (ours, conv) in plan.items():
        if hf not in hf_state:
            raise CheckpointError(
                f"{source}: missing tensor {hf} (or transformer.{hf}); the weights file is incomplete or "
                "belongs to another config.json, re-save it with save_pretrained"
            )
        state[ours] = _checked(hf, hf_state[hf], expected[ours], conv, source)
    return state


# ---- BERT ------------------------------------------------------------------------------------

TOKENIZER_FILE = "tokenizer.json"
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

BERT_HEADS = ("auto", "mlm", "none")

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
# Stored by some checkpoints and not needed: position / segment id buffers (attnlab counts positions
# itself) and the next-sentence-prediction head, which attnlab's Bert does not have.
BERT_IGNORED_TENSOR = re.compile(r"embeddings\.(position_ids|token_type_ids)|cls\.seq_relationship\..*")


@dataclasses.dataclass
class LoadedBert:
    """A Hugging Face BERT checkpoint as attnlab objects."""

    model: Bert
    """In eval mode; its head is "mlm" or "none"."""
    tokenizer: WordPieceTokenizer
    config: BertConfig
    missing: list[str] = dataclasses.field(default_factory=list)
    """attnlab parameters the checkpoint has no tensor for, left at their fresh initialisation
    (the pooler of a BertForMaskedLM checkpoint)."""


def bert_config_from_hf(
    hf: Mapping[str, Any],
    *,
    head: str = "none",
    pad_id: int | None = None,
    dropout: float | None = None,
    source: str = CONFIG_FILE,
) -> BertConfig:
    """The `BertConfig` equivalent to a Hugging Face BERT `config.json`, read as a dict.

    Keys left out take transformers' BertConfig defaults. `head` is "mlm" or "none". `pad_id`, the
    tokenizer's [PAD] id, must agree with `pad_token_id` when the config sets one (attnlab masks
    padding by id). `dropout` overrides the HF dropouts; by default `hidden_dropout_prob` and
    `attention_probs_dropout_prob` must agree, as attnlab has one rate. Raises `CheckpointError`
    (naming `source`) for a config attnlab cannot represent exactly.
    """
    model_type = hf.get("model_type")
    architectures = hf.get("architectures") or []
    is_bert = model_type == "bert" or (
        model_type is None and any(isinstance(a, str) and a.startswith("Bert") for a in architectures)
    )
    if not is_bert:
        found = f"model_type is {model_type!r}" if model_type is not None else f"architectures are {architectures}"
        raise CheckpointError(f"{source}: {found}, not 'bert'; only BERT checkpoints can be imported here")
    _check_switches(hf, BERT_FIXED_SWITCHES, "BERT", source)

    def get(key: str, kind: type | tuple[type, ...]) -> Any:
        return _config_value(hf, BERT_DEFAULTS, key, kind, source)

    activation = get("hidden_act", str)
    if activation not in HF_ACTIVATIONS:
        raise CheckpointError(
            f"{source}: hidden_act {activation!r} is not supported; attnlab can import {sorted(HF_ACTIVATIONS)}"
        )
    hf_pad = hf.get("pad_token_id", 0)
    if hf_pad is not None and (not isinstance(hf_pad, int) or isinstance(hf_pad, bool)):
        raise CheckpointError(f"{source}: pad_token_id must be an int or null, got {hf_pad!r}")
    if pad_id is None:
        pad_id = 0 if hf_pad is None else hf_pad
    elif hf_pad is not None and hf_pad != pad_id:
        raise CheckpointError(
            f"{source}: pad_token_id={hf_pad} but the vocabulary's [PAD] is id {pad_id}; "
            "attnlab masks padding by id, so the two must agree"
        )
    if dropout is None:
        keys = ("hidden_dropout_prob", "attention_probs_dropout_prob")
        dropout = _one_dropout({key: get(key, (int, float)) for key in keys}, source)
    try:
        return BertConfig(
            vocab_size=get("vocab_size", int),
            max_len=get("max_position_embeddings", int),
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
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from e


def load_bert(
    folder: str | Path, *, dropout: float | None = None, head: str = "auto", dtype: torch.dtype = torch.float32
) -> LoadedBert:
    """Load the Hugging Face BERT checkpoint in `folder` as an attnlab `Bert`, in eval mode, with
    its WordPiece tokenizer.

    The folder holds `config.json`, the weights and the vocabulary (see the module docstring).
    head: "auto" gives the masked-LM head when the checkpoint has one (`cls.predictions.*`, saved
    by BertForMaskedLM and BertForPreTraining) and no head otherwise; "mlm" requires it; "none"
    skips it. Every encoder tensor must be present with the shape config.json implies; only the
    pooler may be absent. Parameters are cast to `dtype`. Raises `CheckpointError` naming the file
    and the key on any mismatch.
    """
    if head not in BERT_HEADS:
        raise ValueError(f"head must be one of {list(BERT_HEADS)}, got {head!r}")
    folder = Path(folder)
    config_path, hf_config = _read_hf_config(
        folder, "BERT", f"{CONFIG_FILE}, model.safetensors and {VOCAB_FILE} or {TOKENIZER_FILE} (download it first)"
    )
    weights_path, tensors = _read_weights(folder)
    tokenizer = _read_bert_tokenizer(folder)
    hf_state = _bert_state(tensors, weights_path)

    has_mlm = any(name.startswith("cls.predictions.") for name in hf_state)
    if head == "mlm" and not has_mlm:
        raise CheckpointError(
            f"{weights_path}: no masked-LM head (cls.predictions.*); save a BertForMaskedLM or pass head='none'"
        )
    head = "mlm" if head == "mlm" or head == "auto" and has_mlm else "none"
    config = bert_config_from_hf(
        hf_config, head=head, pad_id=tokenizer.pad_id, dropout=dropout, source=str(config_path)
    )
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"{folder}: the vocabulary has {tokenizer.vocab_size} tokens but {CONFIG_FILE} says vocab_size="
            f"{config.vocab_size}; the tokenizer belongs to another model"
        )

    model = Bert(config)  # fresh initialisation for anything the checkpoint may lack (the pooler)
    state = _convert_bert(hf_state, config, model.state_dict(), weights_path)
    state = {name: t.to(dtype).contiguous() for name, t in state.items()}
    model.to(dtype)
    # Copies into the existing parameters, so the MLM decoder stays tied to the token embedding.
    result = model.load_state_dict(state, strict=False)
    missing = [name for name in result.missing_keys if name != "head.decoder.weight"]
    if any(name not in BERT_POOLER_TENSORS.values() for name in missing) or result.unexpected_keys:
        raise RuntimeError(f"BERT name map is incomplete: missing {missing}, unexpected {result.unexpected_keys}")
    return LoadedBert(model=model.eval(), tokenizer=tokenizer, config=config, missing=missing)


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
        doc = _read_json(config_path, what="the tokenizer config")
        lowercase = doc.get("do_lower_case", True) if isinstance(doc, dict) else None
        if not isinstance(lowercase, bool):
            raise CheckpointError(f"{config_path}: do_lower_case must be true or false, got {lowercase!r}")
    return WordPieceTokenizer.from_vocab_txt(path, lowercase=lowercase)


def _bert_state(tensors: Mapping[str, torch.Tensor], source: Path) -> dict[str, torch.Tensor]:
    """HF BERT tensors under their BertModel names (no "bert." prefix, LayerNorm weight / bias),
    without those attnlab does not need."""
    state: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix("bert.")
        # The original TensorFlow conversion named LayerNorm parameters gamma and beta.
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        if name in state:
            raise CheckpointError(f"{source}: tensor {name} is stored twice (under two of its names)")
        if not BERT_IGNORED_TENSOR.fullmatch(name):
            state[name] = tensor
    return state


def _convert_bert(
    hf_state: dict[str, torch.Tensor], config: BertConfig, expected: Mapping[str, torch.Tensor], source: Path
) -> dict[str, torch.Tensor]:
    """Rename HF BERT tensors to attnlab's names and stack q, k, v; check keys, shapes and the tying."""
    hf_state = dict(hf_state)
    c = config.d_model
    plan = dict(BERT_TOP_TENSORS)
    for i in range(config.n_layers):
        plan.update({f"encoder.layer.{i}.{hf}": f"blocks.{i}.{ours}" for hf, ours in BERT_LAYER_TENSORS.items()})
    optional = dict(BERT_POOLER_TENSORS)

    # The MLM decoder: its weight is the word embedding matrix, its bias cls.predictions.bias (older
    # checkpoints also store both under cls.predictions.decoder, some only the bias there).
    decoder_weight = hf_state.pop("cls.predictions.decoder.weight", None)
    decoder_bias = hf_state.pop("cls.predictions.decoder.bias", None)
    if config.head == "mlm":
        plan.update(BERT_MLM_TENSORS)
        if "cls.predictions.bias" not in hf_state and decoder_bias is not None:
            hf_state["cls.predictions.bias"] = decoder_bias
        words = hf_state.get("embeddings.word_embeddings.weight")
        if decoder_weight is not None and words is not None and not torch.equal(decoder_weight, words):
            raise CheckpointError(
                f"{source}: cls.predictions.decoder.weight differs from the word embeddings; attnlab's masked-LM "
                "decoder is always tied to them (pass head='none' to import the encoder alone)"
            )
    else:
        hf_state = {name: t for name, t in hf_state.items() if not name.startswith("cls.predictions.")}

    qkv = {
        f"encoder.layer.{i}.attention.self.{part}.{kind}"
        for i in range(config.n_layers)
        for part in BERT_QKV
        for kind in ("weight", "bias")
    }
    for name in hf_state:
        if name not in plan and name not in optional and name not in qkv:
            raise CheckpointError(
                f"{source}: unexpected tensor {name} for a BERT with num_hidden_layers={config.n_layers}; only "
                "BertModel / BertForMaskedLM / BertForPreTraining checkpoints matching config.json can be imported"
            )

    def take(hf: str, like: torch.Tensor) -> torch.Tensor:
        if hf not in hf_state:
            raise CheckpointError(
                f"{source}: missing tensor {hf} (or bert.{hf}); the weights file is incomplete or belongs to "
                "another config.json, re-save it with save_pretrained"
            )
        return _checked(hf, hf_state[hf], like, False, source)

    state = {ours: take(hf, expected[ours]) for hf, ours in plan.items()}
    state.update({ours: take(hf, expected[ours]) for hf, ours in optional.items() if hf in hf_state})
    for i in range(config.n_layers):
        for kind in ("weight", "bias"):
            ours = f"blocks.{i}.attn.in_proj.{kind}"
            parts = [take(f"encoder.layer.{i}.attention.self.{p}.{kind}", expected[ours][:c]) for p in BERT_QKV]
            state[ours] = torch.cat(parts, dim=0)  # (3C, C) or (3C,): rows [q; k; v]
    return state


def _check_switches(hf: Mapping[str, Any], switches: Mapping[str, tuple[Any, str]], family: str, source: str) -> None:
    """Refuse a config.json whose switch (key -> (the value attnlab computes, what another value would
    do)) is set to a value attnlab cannot represent."""
    for key, (supported, effect) in switches.items():
        if key in hf and hf[key] != supported:
            raise CheckpointError(
                f"{source}: {key}={json.dumps(hf[key])} cannot be imported ({effect}); "
                f"attnlab's {family} supports only {key}={json.dumps(supported)}"
            )


def _config_value(
    hf: Mapping[str, Any], defaults: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str
) -> Any:
    """hf[key] (transformers' default when absent), checked to be of `kind`; a bool is no number."""
    value = hf.get(key, defaults[key])
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise CheckpointError(f"{source}: {key} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    return value


def _checked(name: str, tensor: torch.Tensor, like: torch.Tensor, conv: bool, source: Path) -> torch.Tensor:
    """`tensor` in attnlab's layout (transposed if a Conv1D weight), after checking its shape against `like`."""
    want = tuple(like.shape[::-1] if conv else like.shape)
    if tuple(tensor.shape) != want:
        raise CheckpointError(
            f"{source}: tensor {name} has shape {tuple(tensor.shape)}, config.json implies {want}; "
            "the weights and config.json come from different models"
        )
    return tensor.t() if conv else tensor


def _read_hf_config(folder: Path, family: str, holding: str) -> tuple[Path, dict[str, Any]]:
    """The path and contents of a checkpoint folder's config.json, or a `CheckpointError` that
    says what the folder should hold."""
    if not folder.is_dir():
        raise CheckpointError(
            f"{family} checkpoint folder {folder} does not exist; pass a local folder holding {holding}"
        )
    config_path = folder / CONFIG_FILE
    hf_config = _read_json(config_path, what=f"a {family} config (written by save_pretrained)")
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object, got {type(hf_config).__name__}")
    return config_path, hf_config


def _one_dropout(rates: dict[str, float], source: str) -> float:
    """The one dropout rate attnlab models have, from a checkpoint's several (which must agree)."""
    if len(set(rates.values())) > 1:
        raise CheckpointError(
            f"{source}: the dropout rates differ ({rates}) and attnlab has one; pass dropout=... to choose it"
        )
    return float(next(iter(rates.values())))


def _read_json(path: Path, *, what: str) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path} not found; the folder needs {what} beside its weights")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({e}); re-save the checkpoint") from e


def _read_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The first weights file of `WEIGHT_FILES` in `folder`, and all its tensors (every shard)."""
    for filename in WEIGHT_FILES:
        path = folder / filename
        if path.is_file():
            break
    else:
        raise CheckpointError(
            f"no weights in {folder}: expected one of {', '.join(WEIGHT_FILES)}; "
            "save the model with save_pretrained or download the weights too"
        )
    if not filename.endswith(".index.json"):
        return path, _read_tensor_file(path)
    index = _read_json(path, what="the shard index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{path}: no weight_map object; re-save the checkpoint")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = folder / shard
        if not shard_path.is_file():
            raise CheckpointError(f"{shard_path} not found, but {path.name} lists it; download every shard")
        tensors.update(_read_tensor_file(shard_path))
    return path, tensors


def _read_tensor_file(path: Path) -> dict[str, torch.Tensor]:
    """All tensors in one safetensors or PyTorch file, on the CPU. PyTorch files never run pickled code."""
    try:
        if path.name.endswith(".safetensors"):
            tensors = load_file(path)
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} holds pickled objects other than tensors, which are never loaded (weights_only=True); "
            "convert it to model.safetensors from a trusted environment"
        ) from e
    except (OSError, RuntimeError, ValueError, EOFError, SafetensorError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} cannot be read ({first_line}); re-download or re-save it") from e
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise CheckpointError(f"{path} is not a state dict of tensors; save model.state_dict() or use save_pretrained")
    return tensors


# -- Export: attnlab's encoder–decoder as a transformers MarianMTModel ------------------------------
#
# MarianMT (Junczys-Dowmunt et al. 2018; transformers `models/marian/modeling_marian.py`) is the
# paper's base architecture exactly as attnlab's `Seq2SeqTransformer` builds it with post-norm,
# sinusoidal positions and one shared vocabulary: embeddings × √d_model plus a fixed sinusoid table,
# LayerNorm after each residual sum, no final LayerNorm, tied output projection. Exporting a trained
# attnlab model therefore gives a transformers model that computes the same function, which lets a
# benchmark compare the two libraries' decoders on the same trained weights and the same outputs.
#
# One layout differs: Marian's table holds all the sines first and then all the cosines
# (`out[:, :d/2] = sin`, `out[:, d/2:] = cos`), attnlab's interleaves them (sin at 2i, cos at 2i+1).
# Marian feature m is attnlab feature MARIAN_ORDER[m]. Re-ordering the d_model features of every
# tensor consistently (embedding columns, the inputs of every projection that reads the residual
# stream, the outputs of every projection that writes it, LayerNorm gains and biases) changes
# nothing else: LayerNorm's mean and variance do not depend on the order of the features.
#
# Name map, attnlab -> Marian (i = layer index; in_proj rows [q; k; v] -> q_proj, k_proj, v_proj):
#   src_embedding / output          -> model.shared / lm_head (all tied)
#   encoder.i.attn                  -> model.encoder.layers.i.self_attn
#   encoder.i.norm1 / norm2         -> ...self_attn_layer_norm / final_layer_norm
#   decoder.i.self_attn / cross_attn -> model.decoder.layers.i.self_attn / encoder_attn
#   decoder.i.norm1 / norm2 / norm3 -> ...self_attn_layer_norm / encoder_attn_layer_norm / final_layer_norm
#   *.ffn.fc1 / fc2                 -> *.fc1 / fc2

MARIAN_LAYER_NORM_EPS = 1e-5  # Marian's nn.LayerNorm(embed_dim) keeps torch's default


def marian_feature_order(d_model: int) -> torch.Tensor:
    """attnlab's feature index of each Marian feature `(d_model,)`: the sines (attnlab's even
    features) first, then the cosines (the odd ones)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def to_marian(model: Any, *, bos_id: int, eos_id: int) -> Any:
    """A `transformers.MarianMTModel` computing the same function as `model`, an attnlab
    `Seq2SeqTransformer` with post-norm, sinusoidal positions and tied embeddings; `bos_id` becomes
    Marian's `decoder_start_token_id`. Raises `ValueError` naming what Marian cannot represent."""
    from transformers import MarianConfig, MarianMTModel

    c = model.config
    problems = [
        f"{what} (Marian has only {wanted})"
        for what, ok, wanted in (
            (f"norm = {c.norm!r}", c.norm == "post", "post-norm"),
            (f"positions = {c.positions!r}", c.positions == "sinusoidal", "sinusoidal positions"),
            ("untied embeddings", c.tie_embeddings, "one shared vocabulary"),
            (f"activation = {c.activation!r}", c.activation in ("relu", "gelu"), "relu or gelu here"),
            (f"layer_norm_eps = {c.layer_norm_eps}", c.layer_norm_eps == MARIAN_LAYER_NORM_EPS, "1e-5"),
        )
        if not ok
    ]
    if problems:
        raise ValueError("cannot export to MarianMT: " + "; ".join(problems))
    config = MarianConfig(
        vocab_size=c.vocab_size,
        d_model=c.d_model,
        encoder_layers=c.n_encoder_layers,
        decoder_layers=c.n_decoder_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=c.activation,
        max_position_embeddings=c.max_len,
        scale_embedding=True,
        dropout=0.0,
        pad_token_id=c.pad_id,
        eos_token_id=eos_id,
        forced_eos_token_id=eos_id,
        decoder_start_token_id=bos_id,
        bos_token_id=bos_id,
    )
    marian = MarianMTModel(config).eval()
    result = marian.load_state_dict(_marian_state(model), strict=False)
    # Everything is given but Marian's fixed sinusoid tables, which it builds itself.
    missing = [k for k in result.missing_keys if "embed_positions" not in k]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"MarianMT export out of step with transformers: missing {missing}, unexpected {result.unexpected_keys}"
        )
    return marian


def _marian_state(model: Any) -> dict[str, torch.Tensor]:
    """attnlab `Seq2SeqTransformer` weights under Marian's names, features in Marian's order."""
    c = model.config
    order = marian_feature_order(c.d_model)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}

    def reads(w: torch.Tensor) -> torch.Tensor:  # a projection from the residual stream: input columns
        return w[:, order]

    def writes(w: torch.Tensor) -> torch.Tensor:  # into the residual stream: output rows (or a vector)
        return w[order]

    embedding = reads(sd["src_embedding.weight"])
    for name in ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"):
        out[f"{name}.weight"] = embedding
    out["final_logits_bias"] = torch.zeros(1, c.vocab_size)

    def attention(src: str, dst: str) -> None:
        for proj, w, b in zip(
            ("q_proj", "k_proj", "v_proj"),
            sd[f"{src}.in_proj.weight"].chunk(3),
            sd[f"{src}.in_proj.bias"].chunk(3),
            strict=True,
        ):
            out[f"{dst}.{proj}.weight"], out[f"{dst}.{proj}.bias"] = reads(w), b
        out[f"{dst}.out_proj.weight"] = writes(sd[f"{src}.out_proj.weight"])
        out[f"{dst}.out_proj.bias"] = writes(sd[f"{src}.out_proj.bias"])

    def layer_norm(src: str, dst: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = writes(sd[f"{src}.weight"]), writes(sd[f"{src}.bias"])

    def ffn(src: str, dst: str) -> None:
        out[f"{dst}.fc1.weight"], out[f"{dst}.fc1.bias"] = reads(sd[f"{src}.fc1.weight"]), sd[f"{src}.fc1.bias"]
        out[f"{dst}.fc2.weight"], out[f"{dst}.fc2.bias"] = (
            writes(sd[f"{src}.fc2.weight"]),
            writes(sd[f"{src}.fc2.bias"]),
        )

    for i in range(c.n_encoder_layers):
        src, dst = f"encoder.{i}", f"model.encoder.layers.{i}"
        attention(f"{src}.attn", f"{dst}.self_attn")
        layer_norm(f"{src}.norm1", f"{dst}.self_attn_layer_norm")
        ffn(f"{src}.ffn", dst)
        layer_norm(f"{src}.norm2", f"{dst}.final_layer_norm")
    for i in range(c.n_decoder_layers):
        src, dst = f"decoder.{i}", f"model.decoder.layers.{i}"
        attention(f"{src}.self_attn", f"{dst}.self_attn")
        layer_norm(f"{src}.norm1", f"{dst}.self_attn_layer_norm")
        attention(f"{src}.cross_attn", f"{dst}.encoder_attn")
        layer_norm(f"{src}.norm2", f"{dst}.encoder_attn_layer_norm")
        ffn(f"{src}.ffn", dst)
        layer_norm(f"{src}.norm3", f"{dst}.final_layer_norm")
    return out
