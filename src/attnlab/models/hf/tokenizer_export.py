"""attnlab's tokenizers as files `transformers.AutoTokenizer.from_pretrained` reads offline.

Every tokenizer becomes a Hugging Face `tokenizers` file, `tokenizer.json`, beside a
`tokenizer_config.json` naming the transformers class and the special tokens:
- characters (`CharTokenizer`): a BPE model whose vocabulary is the characters and which has no
  merges, so every character is one token with attnlab's id; no pre-tokenizer (spaces and line
  breaks are characters like any other) and a decoder that joins the tokens back (`Fuse`);
- byte-level BPE (`BPETokenizer`): its own file, unchanged;
- WordPiece (`WordPieceTokenizer`): its own file plus BERT's post-processor, which adds [CLS] and
  [SEP] around a text (`[CLS] A [SEP] B [SEP]` for a pair, B with segment 1), as attnlab's encoder
  tasks do; and BERT's `vocab.txt` (one token per line, in id order) when the model is WordPiece.
attnlab's own `load_tokenizer` reads each `tokenizer.json` back to a tokenizer giving the same ids.

MarianMT's own tokenizer (`MarianTokenizer`) is two SentencePiece models, which attnlab does not
train; its exported translation runs carry their joint byte-level BPE as a `PreTrainedTokenizerFast`
instead, which encodes a source sentence exactly as attnlab's translation task does (no </s> added).
"""

import json
from typing import Any

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer
from attnlab.models.hf._common import TOKENIZER_FILE
from attnlab.models.hf.bert import TOKENIZER_CONFIG_FILE, VOCAB_FILE

# The transformers class AutoTokenizer builds (transformers 5 reads it as its "tokenizers" backend).
FAST_TOKENIZER = "PreTrainedTokenizerFast"
BERT_TOKENIZER = "BertTokenizer"

AnyTokenizer = CharTokenizer | BPETokenizer | WordPieceTokenizer


def char_tokenizer_json(tokenizer: CharTokenizer) -> str:
    """A `tokenizers` file that splits text into attnlab's characters, with attnlab's ids.
    Example: chars ['e', 'h', 'l', 'o'] -> "hole" encodes to [1, 3, 2, 0] and decodes back."""
    from tokenizers import Tokenizer, decoders, models

    # No merges: BPE's first step (one token per character) is all that happens.
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(tokenizer.chars)}, merges=[]))
    tok.decoder = decoders.Fuse()
    return tok.to_str()


def bert_tokenizer_json(tokenizer: WordPieceTokenizer) -> str:
    """The WordPiece file with BERT's post-processor: [CLS] text [SEP] (pairs: [CLS] A [SEP] B [SEP])."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(tokenizer.tokenizer.to_str())
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.cls_id), ("[SEP]", tokenizer.sep_id)],
    )
    return tok.to_str()


def special_tokens(tokenizer: AnyTokenizer) -> dict[str, str]:
    """transformers' special-token fields (bos_token, eos_token, ...) for the tokens `tokenizer` has."""
    if isinstance(tokenizer, CharTokenizer):
        return {}
    hf = tokenizer.tokenizer
    if isinstance(tokenizer, WordPieceTokenizer):
        ids = {
            "unk_token": tokenizer.unk_id,
            "pad_token": tokenizer.pad_id,
            "cls_token": tokenizer.cls_id,
            "sep_token": tokenizer.sep_id,
            "mask_token": tokenizer.mask_id,
        }
    else:
        ids = {"bos_token": tokenizer.bos_id, "eos_token": tokenizer.eos_id, "pad_token": tokenizer.pad_id}
    return {field: hf.id_to_token(i) for field, i in ids.items() if i is not None}


def special_token_ids(tokenizer: AnyTokenizer) -> dict[str, int | None]:
    """config.json's bos_token_id / eos_token_id / pad_token_id for a causal LM with `tokenizer`
    (None where it has no such token: transformers' GPT-2 default, 50256, would be out of range)."""
    if isinstance(tokenizer, CharTokenizer):
        return {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    return {
        "bos_token_id": getattr(tokenizer, "bos_id", None),
        "eos_token_id": tokenizer.eos_id,
        "pad_token_id": getattr(tokenizer, "pad_id", None),
    }


def _vocab_txt(tokenizer: WordPieceTokenizer) -> str | None:
    """BERT's vocab.txt of a WordPiece vocabulary (None for the BPE variant, which it cannot describe)."""
    if json.loads(tokenizer.tokenizer.to_str())["model"]["type"] != "WordPiece":
        return None
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))) or any("\n" in t or "\r" in t for t in tokens):
        return None  # ids with gaps, or a token a line cannot hold: tokenizer.json alone describes it
    return "\n".join(tokens) + "\n"


def tokenizer_files(tokenizer: AnyTokenizer, *, max_length: int) -> dict[str, str]:
    """The tokenizer's files for a transformers folder: file name -> text. `max_length` is the
    model's longest input (transformers' `model_max_length`)."""
    config: dict[str, Any] = {
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,  # decoding must give attnlab's text back, spaces as they are
        **special_tokens(tokenizer),
    }
    if isinstance(tokenizer, CharTokenizer):
        files = {TOKENIZER_FILE: char_tokenizer_json(tokenizer)}
        config["tokenizer_class"] = FAST_TOKENIZER
    elif isinstance(tokenizer, WordPieceTokenizer):
        files = {TOKENIZER_FILE: bert_tokenizer_json(tokenizer)}
        vocab = _vocab_txt(tokenizer)
        if vocab is not None:
            files[VOCAB_FILE] = vocab
        normalizer = json.loads(tokenizer.tokenizer.to_str()).get("normalizer") or {}
        config |= {"tokenizer_class": BERT_TOKENIZER, "do_lower_case": bool(normalizer.get("lowercase", True))}
    else:
        files = {TOKENIZER_FILE: tokenizer.tokenizer.to_str()}
        config["tokenizer_class"] = FAST_TOKENIZER
    files[TOKENIZER_CONFIG_FILE] = json.dumps(config, indent=2, sort_keys=True) + "\n"
    return files
