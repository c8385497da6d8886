"""Sentence vectors from a BERT encoder, computed as sentence-transformers computes them.

A sentence-transformers folder is a pipeline of modules listed in its `modules.json`: the
Transformer (the encoder's last hidden states), a Pooling module (`1_Pooling/config.json`: the mean
of the token vectors, the [CLS] vector, their maximum, ...) and often a Normalize module (unit
length, so that a dot product is the cosine). `read_pooling` reads the last two; a folder without
`modules.json` (a plain BERT checkpoint, an attnlab run) gets what sentence-transformers gives it:
the mean over every token of the input, [CLS] and [SEP] included, padding left out.

`attnlab embed` and `POST /v1/embeddings` both call `SentenceEncoder.embed`, so one text gets one
vector whichever way it is asked for; for all-MiniLM-L6-v2 it is `SentenceTransformer(path).encode`'s.

Shape legend: N texts, T tokens (padded), C model width.

References: Reimers & Gurevych, "Sentence-BERT" (2019), §3 (pooling strategies);
sentence-transformers `models/Pooling.py` and `models/Normalize.py`.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.checkpoints import CONFIG
from attnlab.data.parallel import pad_rows
from attnlab.data.tokenizers import EncoderTokenizer
from attnlab.errors import UserError
from attnlab.models.bert import Bert

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "sentence_bert_config.json"
# sentence-transformers' module types, by the class name that ends the `type` of modules.json.
TRANSFORMER, POOLING, NORMALIZE = "Transformer", "Pooling", "Normalize"
# 1_Pooling/config.json's switches -> our mode names; exactly one must be on.
POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}
UNSUPPORTED_MODES = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


@dataclass(frozen=True)
class Pooling:
    """How the token vectors of one text become its vector."""

    mode: str = "mean"
    """"mean" (of the tokens), "cls" (the [CLS] token's), "max" (per feature) or "mean_sqrt_len"
    (the sum divided by the square root of the token count)."""
    normalize: bool = False
    """Scale each vector to unit L2 length (sentence-transformers' Normalize module)."""
    max_tokens: int | None = None
    """Longest input in tokens, [CLS] and [SEP] included (sentence_bert_config.json's
    max_seq_length); None: the model's own limit."""

    def __post_init__(self) -> None:
        if self.mode not in POOLING_MODES.values():
            raise ValueError(f"mode must be one of {sorted(POOLING_MODES.values())}, got {self.mode!r}")


def read_pooling(folder: str | Path) -> Pooling:
    """The pooling of a sentence-transformers folder (modules.json, its Pooling module's
    config.json, sentence_bert_config.json); `Pooling()` for a folder without modules.json.
    Raises `UserError` for a module attnlab does not compute (a Dense layer, say)."""
    folder = Path(folder)
    modules = _read_json(folder / MODULES_FILE)
    if modules is None:
        return Pooling()
    typed = isinstance(modules, list) and all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in modules)
    if not typed:
        raise UserError(f"{folder / MODULES_FILE}: expected a list of modules, each with a 'type'")
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    others = [k for k in kinds if k not in (TRANSFORMER, POOLING, NORMALIZE)]
    if others or kinds[:1] != [TRANSFORMER] or kinds.count(POOLING) != 1:
        raise UserError(
            f"{folder / MODULES_FILE}: modules {kinds}; attnlab computes a Transformer, one Pooling and an "
            "optional Normalize module"
        )
    pooling = modules[kinds.index(POOLING)]
    mode = _pooling_mode(folder / str(pooling.get("path", "")) / "config.json")
    st_config = _read_json(folder / ST_CONFIG_FILE) or {}
    max_tokens = st_config.get("max_seq_length") if isinstance(st_config, dict) else None
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 3):
        raise UserError(f"{folder / ST_CONFIG_FILE}: max_seq_length must be an integer >= 3, got {max_tokens!r}")
    return Pooling(mode=mode, normalize=NORMALIZE in kinds, max_tokens=max_tokens)


def _pooling_mode(path: Path) -> str:
    config = _read_json(path)
    if not isinstance(config, dict):
        raise UserError(f"{path}: the Pooling module's config is missing or not a JSON object")
    unsupported = [key for key in UNSUPPORTED_MODES if config.get(key)]
    on = [mode for key, mode in POOLING_MODES.items() if config.get(key)]
    if unsupported or len(on) != 1:
        raise UserError(
            f"{path}: attnlab pools by exactly one of {', '.join(POOLING_MODES)}; this folder turns on "
            f"{', '.join(unsupported + [k for k in POOLING_MODES if config.get(k)]) or 'none'}"
        )
    return on[0]


def _read_json(path: Path):
    """The JSON in `path`, or None when there is no such file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{path} is unreadable or not JSON ({e})") from None


@dataclass
class SentenceEncoder:
    """A BERT-shaped encoder (BERT, RoBERTa, ModernBERT), its vocabulary and its pooling: texts in,
    one vector per text out."""

    model: Bert
    tokenizer: EncoderTokenizer
    pooling: Pooling = Pooling()

    @property
    def dim(self) -> int:
        return self.model.config.d_model

    @property
    def max_tokens(self) -> int:
        """Most tokens of one text, without [CLS] and [SEP]."""
        limit = self.model.config.max_len
        return min(limit, self.pooling.max_tokens or limit) - 2

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] (RoBERTa's <s> and </s>) not added."""
        return self.tokenizer.encode_batch(list(texts))

    def problem(self, row: Sequence[int]) -> str | None:
        """Why one text's token ids cannot be embedded, or None."""
        if not row:
            return "no tokens (a text can be empty once normalised); give it at least one word"
        if len(row) > self.max_tokens:
            return f"{len(row)} tokens, but this model reads at most {self.max_tokens}"
        if not all(0 <= t < self.tokenizer.vocab_size for t in row):
            return f"a token id outside the vocabulary (0 to {self.tokenizer.vocab_size - 1})"
        return None

    @torch.no_grad()
    def embed(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """The vectors of texts given as token ids (see `encode`) -> float32 `(N, C)` on the CPU.
        Raises `UserError` naming the first text that `problem` refuses."""
        for i, row in enumerate(rows):
            if (problem := self.problem(row)) is not None:
                raise UserError(f"text {i + 1}: {problem}")
        tok = self.tokenizer
        ids = pad_rows([[tok.cls_id, *row, tok.sep_id] for row in rows], tok.pad_id)  # (N, T)
        device = next(self.model.parameters()).device
        hidden = self.model.encode(ids.to(device)).float().cpu()  # (N, T, C)
        lengths = torch.tensor([len(row) + 2 for row in rows])
        mask = torch.arange(ids.size(1))[None, :] < lengths[:, None]  # (N, T)
        vectors = pool(hidden, mask, self.pooling.mode)
        return F.normalize(vectors, p=2, dim=1) if self.pooling.normalize else vectors

    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """`embed(encode(texts))`."""
        return self.embed(self.encode(texts))


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Token vectors `(N, T, C)` with `mask (N, T)` (True = a token of the text) -> `(N, C)`, as
    sentence-transformers' Pooling module computes each mode."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(~mask[..., None], -1e9).max(dim=1).values
    weights = mask[..., None].to(hidden.dtype)
    total = (hidden * weights).sum(1)
    count = weights.sum(1).clamp(min=1e-9)
    return total / (count.sqrt() if mode == "mean_sqrt_len" else count)


def load_sentence_encoder(source: str | Path, device: torch.device) -> SentenceEncoder:
    """The encoder of an attnlab run with a BERT encoder (any encoder task), or of a Hugging Face
    BERT folder with its sentence-transformers pooling (`read_pooling`), in eval mode on `device`."""
    from attnlab.tasks.encoder import load_pretrained

    pretrained = load_pretrained(source)
    pooling = read_pooling(source) if not (Path(source) / CONFIG).exists() else Pooling()
    return SentenceEncoder(pretrained.model.to(device).eval(), pretrained.tokenizer, pooling)
