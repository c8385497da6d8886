"""The attention weights of a trained run, or of a Hugging Face checkpoint, for one text, ready to
draw: every layer, every head.

Shape legend: L layers, H heads, Tq query tokens (rows), Tk key tokens (columns).

What each family shows:
- GPT (language models): causal self-attention of the text's tokens; the upper triangle is 0.
- BERT (masked LM, classification, tagging): bidirectional self-attention of [CLS] text [SEP].
- Transformer translation: by default the decoder's cross-attention from the translation of the
  text (found by beam search) to the text; `kind="self"` gives the encoder's self-attention.
- RNN with attention: its additive (Bahdanau) alignment, one "layer" of one "head".
The weights are the models' own (`attention_weights`, `encoder_attention`, `cross_attention_layers`,
`cross_attention`), computed in float32 and copied to numpy unchanged.

References: Bahdanau et al. (2015), Figure 3; Vaswani et al. (2017), Figures 3-5; Vig, "A
Multiscale Visualization of Attention in the Transformer Model" (2019), the layer/head view.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnlab.data.tokenizers import gpt2_byte_decoder
from attnlab.errors import UserError

KINDS = ("self", "cross")


@dataclass(frozen=True)
class AttentionMaps:
    """One example's attention weights, layer by layer.

    weights: one float32 array `(H, Tq, Tk)` per layer; row q holds how much query token q attends
        to each key token (each row sums to 1).
    query_tokens, key_tokens: the labels of the rows (Tq) and the columns (Tk).
    kind: what the weights are, for titles: "causal self-attention", "decoder cross-attention", ...
    causal: True when a query may only attend to itself and earlier keys (GPT).
    cross: True when the queries are target tokens and the keys source tokens (translation).
    text: the text the weights were computed for; translation: the source sentence.
    output: the model's translation of `text` (translation runs), else "".
    """

    weights: list[np.ndarray]
    query_tokens: list[str]
    key_tokens: list[str]
    kind: str
    causal: bool = False
    cross: bool = False
    text: str = ""
    output: str = ""

    @property
    def n_layers(self) -> int:
        return len(self.weights)

    @property
    def n_heads(self) -> int:
        return self.weights[0].shape[0]

    def check(self, layer: int | None = None, head: int | None = None) -> None:
        """A `UserError` naming the valid range when `layer` or `head` does not exist (None = any)."""
        if layer is not None and not 0 <= layer < self.n_layers:
            raise UserError(
                f"--layer {layer} is out of range: this {self.kind} has {self.n_layers} layer(s), "
                f"0 to {self.n_layers - 1}"
            )
        if head is not None and not 0 <= head < self.n_heads:
            raise UserError(
                f"--head {head} is out of range: this {self.kind} has {self.n_heads} head(s) per layer, "
                f"0 to {self.n_heads - 1}"
            )


def has_attention(model: torch.nn.Module) -> bool:
    """Whether `attention_maps` can show this model's attention: the Transformers and the RNN with
    attention, not the BiLSTM, the plain RNN encoder-decoder or a graph model."""
    from attnlab.models.bert import Bert
    from attnlab.models.gpt import GPT
    from attnlab.models.rnn import AttentionGRUSeq2Seq
    from attnlab.models.seq2seq import Seq2SeqTransformer

    return isinstance(model, GPT | Bert | Seq2SeqTransformer | AttentionGRUSeq2Seq)


def attention_maps(run, text: str, *, kind: str | None = None, beam: int = 5) -> AttentionMaps:
    """The attention weights of `run` for `text`: what `attnlab.load` returns, or a Hugging Face
    checkpoint as `attnlab.models.hf.load_causal_lm` or `load_bert` return it (anything with a
    `.model` and its `.tokenizer`).

    kind: None for the family's natural picture (see the module docstring), "self" or "cross".
    beam: beam size of the translation whose cross-attention is shown (translation runs; 1 = greedy).
    Raises `UserError` for an empty text, a text longer than the model takes, a kind the model does
    not have, or a model without attention (the BiLSTM, the RNN without attention).
    """
    from attnlab.models.bert import Bert
    from attnlab.models.gpt import GPT
    from attnlab.models.seq2seq import Seq2SeqTransformer

    if kind is not None and kind not in KINDS:
        raise UserError(f"unknown attention kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not text.strip():
        raise UserError("the text is empty: there is no attention to show; pass --text TEXT")
    if getattr(_model_config(run), "attention", "full") == "linformer" and kind != "cross":
        raise UserError(
            f"{_name(run)} uses Linformer attention: each query attends to k projections of all the tokens, "
            "not to tokens, so there is no token-to-token map to draw"
        )
    model = run.model
    if isinstance(model, GPT | Bert):
        if kind == "cross":
            raise UserError(f"{_what(run)} has self-attention only; drop --kind cross")
        return _gpt_maps(run, text) if isinstance(model, GPT) else _bert_maps(run, text)
    if has_attention(model):  # a translation model
        if kind == "self" and not isinstance(model, Seq2SeqTransformer):
            raise UserError("the RNN encoder-decoder has no self-attention; use --kind cross")
        return _translation_maps(run, text, kind or "cross", beam)
    raise UserError(
        f"this run's model ({type(model).__name__}) has no attention to show; "
        "train a seq2seq-transformer, bert, gpt or gru-attention model"
    )


def _model_config(run):
    """The model's configuration: a run's `config.model`, else the model's own `config`."""
    config = getattr(run, "config", None)
    return getattr(config, "model", None) or getattr(run.model, "config", None)


def _name(run) -> str:
    """The run folder, for messages; "this model" for what a Hugging Face loader returned."""
    return str(getattr(run, "path", "this model"))


def _what(run) -> str:
    """ "a 'language-model' run", or for a Hugging Face checkpoint its model's class: "a GPT"."""
    task = getattr(getattr(run, "config", None), "task", None)
    return f"a {task!r} run" if task else f"a {type(run.model).__name__}"


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each id's text, for labels: the tokenizer's own `token_texts` where it has one (BPE,
    WordPiece), else the decoded token (one character for the character tokenizer).

    Byte-level BPE (GPT-2's, Llama 3's) pieces are read back to their bytes and shown as text
    ("Ġworld" -> " world"); a piece holding part of a multi-byte character shows those bytes as
    "<0xC3>", as SentencePiece's byte pieces are written, rather than "Ã" or "�". A SentencePiece
    vocabulary's word-start pieces ("▁Hello", Llama 2's and Mistral's) decode alone without their
    space (the decoder strips a text's first space); their labels keep it."""
    if not hasattr(tokenizer, "token_texts"):
        return [tokenizer.decode([i]) for i in ids]
    vocabulary = getattr(tokenizer, "tokenizer", None)  # a `tokenizers.Tokenizer`
    if vocabulary is None:
        return tokenizer.token_texts(ids)
    from tokenizers import decoders

    pieces = [vocabulary.id_to_token(i) or "" for i in ids]
    if isinstance(vocabulary.decoder, decoders.ByteLevel):
        return [_byte_level_text(piece) for piece in pieces]
    texts = tokenizer.token_texts(ids)
    return [" " + t if p.startswith("▁") and not t.startswith(" ") else t for t, p in zip(texts, pieces, strict=True)]


def _byte_level_text(piece: str) -> str:
    """A byte-level BPE piece as text: "Ġcaf" -> " caf", "Ã" -> "<0xC3>" (half of "é")."""
    to_byte = gpt2_byte_decoder()
    if not all(c in to_byte for c in piece):  # an added token spelt in plain text
        return piece
    data = bytes(to_byte[c] for c in piece)
    out, i = [], 0
    while i < len(data):
        for n in (1, 2, 3, 4):  # the UTF-8 character starting at i, if the piece holds all of it
            try:
                out.append(data[i : i + n].decode("utf-8"))
                i += n
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<0x{data[i]:02X}>")
            i += 1
    return "".join(out)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _layers(weights: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Batch row 0 of each layer's `(1, H, Tq, Tk)` as float32 numpy `(H, Tq, Tk)`."""
    return [w[0].detach().to("cpu", torch.float32).numpy() for w in weights]


def _check_length(n: int, limit: int, what: str) -> None:
    if n > limit:
        raise UserError(f"the text has {n} tokens but this model takes at most {limit} ({what}); give a shorter text")


def _gpt_maps(run, text: str) -> AttentionMaps:
    ids = run.tokenizer.encode(text)
    _check_length(len(ids), run.model.config.block_size, "model.block_size")
    idx = torch.tensor([ids], dtype=torch.long, device=_device(run.model))
    tokens = token_texts(run.tokenizer, ids)
    weights = _layers(run.model.attention_weights(idx))
    return AttentionMaps(weights, tokens, tokens, "causal self-attention", causal=True, text=text)


def _bert_maps(run, text: str) -> AttentionMaps:
    from attnlab.tasks.encoder import wrap_ids

    tok = run.tokenizer
    ids = tok.encode(text)
    limit = run.model.config.max_len
    _check_length(len(ids) + 2, limit, "model.max_len, with [CLS] and [SEP]")
    ids = wrap_ids(tok, ids, limit)
    tokens = token_texts(tok, ids)
    weights = _layers(run.model.attention_weights(torch.tensor([ids], device=_device(run.model))))
    return AttentionMaps(weights, tokens, tokens, "self-attention", text=text)


def _translation_maps(run, text: str, kind: str, beam: int) -> AttentionMaps:
    from attnlab.decode.seq2seq import beam_search
    from attnlab.models.seq2seq import Seq2SeqTransformer
    from attnlab.tasks import open_task

    if beam < 1:
        raise UserError(f"--beam must be >= 1, got {beam}")
    task = open_task(run)
    source_ids = task.tokenizer.encode(text.strip())
    _check_length(len(source_ids), task.data_config.max_len, "data.max_len")
    src = torch.tensor([source_ids], device=_device(run.model))
    source_tokens = task.tokenizer.token_texts(source_ids)
    if kind == "self":
        weights = _layers(run.model.encoder_attention(src))
        return AttentionMaps(weights, source_tokens, source_tokens, "encoder self-attention", text=text)
    (target_ids,) = beam_search(run.model, src, beam_size=beam, bos_id=task.bos_id, eos_id=task.eos_id)
    tgt_in = torch.tensor([[task.bos_id, *target_ids]], device=src.device)
    with torch.no_grad():
        if isinstance(run.model, Seq2SeqTransformer):
            weights = _layers(run.model.cross_attention_layers(src, tgt_in))
        else:  # the RNN's alignment α (B, T, S): one layer of one head
            weights = _layers([run.model.cross_attention(src, tgt_in)[:, None]])
    # Row t is where the decoder looked while predicting the token after tgt_in[t]: label it with
    # that token, as `attnlab translate --attention` does; the last row predicted </s>.
    target_tokens = [*task.tokenizer.token_texts(target_ids), "</s>"]
    output = task.tokenizer.decode(target_ids, skip_special=True).strip()
    return AttentionMaps(
        weights, target_tokens, source_tokens, "decoder cross-attention", cross=True, text=text, output=output
    )
