"""Import Hugging Face RoBERTa checkpoints from a local folder into attnlab's `Bert`, and export a
`Bert` back (`roberta_export`).

RoBERTa (Liu et al. 2019) is BERT's encoder trained differently: the architecture is BERT's and so
are the encoder's tensor names (transformers `models/roberta/modeling_roberta.py`; see `bert.py`'s
name map), under a `roberta.` prefix in the classes with a head. What differs is read here:

- positions, fairseq's way (`utils.make_positions`): the real tokens are numbered from
  pad_token_id + 1, padding takes position pad_token_id, so `max_position_embeddings` (514 for
  roberta-base) is the longest input (512) plus pad_token_id + 1. attnlab's `Bert` counts them so
  with `position_ids = "after_padding"`.
- one segment (`type_vocab_size` 1 in the published models);
- the vocabulary: a byte-level BPE `tokenizer.json` whose post-processor is `RobertaProcessing`
  ("<s> text </s>"), the roles pad, unk, cls, sep, mask played by `<pad>`, `<unk>`, `<s>`, `</s>`,
  `<mask>`;
- the heads. Masked LM: `lm_head.dense`, GELU (always the exact one, whatever `hidden_act` says),
  `lm_head.layer_norm`, the decoder tied to the word embeddings plus `lm_head.bias`. Sentence
  classifier: `classifier.dense` and tanh on the <s> state, then `classifier.out_proj` — BERT's
  pooler and classifier under other names (only the dropouts sit elsewhere, which changes nothing
  in eval mode); token classifier: `classifier`, as BERT's.

Name map of the heads, HF -> attnlab (the encoder's is BERT's):
    lm_head.dense / layer_norm         -> head.dense / head.norm
    lm_head.bias                       -> head.decoder.bias (the decoder weight is embeddings.token)
    classifier.dense                   -> pooler            (RobertaForSequenceClassification)
    classifier.out_proj                -> head.proj
    classifier                         -> head.proj         (RobertaForTokenClassification)

References:
- Liu et al. 2019, "RoBERTa: A Robustly Optimized BERT Pretraining Approach" (§4.4 byte-level BPE).
- fairseq `fairseq/utils.py` `make_positions`, `fairseq/models/roberta/model.py`.
"""

from pathlib import Path

import torch

from attnlab.data.tokenizers import EncoderTokenizer, load_tokenizer
from attnlab.errors import CheckpointError
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.hf._common import TOKENIZER_FILE, HFCheckpoint, HFSource
from attnlab.models.hf.bert import (
    BERT_DEFAULTS,
    BERT_FIXED_SWITCHES,
    EncoderFormat,
    LoadedBert,
    encoder_export,
    encoder_export_problems,
    load_encoder_checkpoint,
)

# transformers' RobertaConfig defaults, used for keys a config.json leaves out. The published
# models' config.json set max_position_embeddings 514, type_vocab_size 1 and layer_norm_eps 1e-5.
ROBERTA_DEFAULTS = {**BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1}

ROBERTA_ARCHITECTURES = {
    "mlm": "RobertaForMaskedLM",
    "sequence": "RobertaForSequenceClassification",
    "token": "RobertaForTokenClassification",
    "none": "RobertaModel",
}

ROBERTA_FORMAT = EncoderFormat(
    family="RoBERTa",
    model_type="roberta",
    prefix="roberta.",
    defaults=ROBERTA_DEFAULTS,
    switches=BERT_FIXED_SWITCHES,
    architectures=ROBERTA_ARCHITECTURES,
    mlm="lm_head",
    mlm_tensors={
        "lm_head.dense.weight": "head.dense.weight",
        "lm_head.dense.bias": "head.dense.bias",
        "lm_head.layer_norm.weight": "head.norm.weight",
        "lm_head.layer_norm.bias": "head.norm.bias",
        "lm_head.bias": "head.decoder.bias",
    },
    classifiers={
        "sequence": {
            "classifier.dense.weight": "pooler.weight",
            "classifier.dense.bias": "pooler.bias",
            "classifier.out_proj.weight": "head.proj.weight",
            "classifier.out_proj.bias": "head.proj.bias",
        },
        "token": {"classifier.weight": "head.proj.weight", "classifier.bias": "head.proj.bias"},
    },
    position_ids="after_padding",
    mlm_activation="gelu",  # RobertaLMHead calls gelu itself
)


def load_roberta(
    folder: str | Path | HFSource,
    *,
    dropout: float | None = None,
    head: str = "auto",
    dtype: torch.dtype = torch.float32,
) -> LoadedBert:
    """Load the Hugging Face RoBERTa checkpoint in `folder` (config.json, the weights, tokenizer.json)
    as an attnlab `Bert`, in eval mode, with its byte-level BPE vocabulary.

    head: "auto" gives the masked-LM head when the checkpoint has one (`lm_head.*`), the classifier
    when it has one ("sequence" or "token" by config.json's `architectures`), and none otherwise;
    "mlm", "sequence" and "token" require theirs; "none" skips any. Parameters are cast to `dtype`.
    Raises `CheckpointError` naming the file and the key on any mismatch (see `load_bert`).
    """
    return load_encoder_checkpoint(
        folder, ROBERTA_FORMAT, read_roberta_tokenizer, dropout=dropout, head=head, dtype=dtype
    )


def read_roberta_tokenizer(folder: Path) -> EncoderTokenizer:
    """The byte-level BPE of a RoBERTa folder: its tokenizer.json, whose post-processor
    (RobertaProcessing) names the <s> and </s> that frame a text."""
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(
            f"no {TOKENIZER_FILE} in {folder}; download RoBERTa's tokenizer with the weights (attnlab reads "
            "the tokenizers file, not vocab.json and merges.txt)"
        )
    tokenizer = load_tokenizer(path)
    if not isinstance(tokenizer, EncoderTokenizer):
        raise CheckpointError(
            f"{path} has no RoBERTa post-processor (RobertaProcessing: <s> text </s>); a RoBERTa checkpoint "
            "needs its own tokenizer.json"
        )
    return tokenizer


def is_roberta(config: BertConfig) -> bool:
    """Whether a `Bert` counts its positions past the padding id as RoBERTa does: a model imported
    from a RoBERTa folder or fine-tuned from one, exported (and its adapters written) as RoBERTa."""
    return config.position_ids == "after_padding"


def roberta_export_problems(config: BertConfig) -> list[str]:
    """What keeps a `BertConfig` from being a transformers RoBERTa, one entry per part (empty: nothing)."""
    return encoder_export_problems(config, ROBERTA_FORMAT)


def roberta_export(model: Bert, labels: list[str] | None = None) -> HFCheckpoint:
    """`model` as a checkpoint of the transformers RoBERTa class of its head (`ROBERTA_ARCHITECTURES`):
    the name maps read backwards. Raises `ExportError` naming every part RoBERTa does not have
    (BERT's positions counted from 0 among them)."""
    return encoder_export(model, ROBERTA_FORMAT, labels)
