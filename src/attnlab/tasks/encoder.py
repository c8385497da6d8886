"""What the encoder tasks share (classification, tagging, masked-LM pre-training): the model
families chosen by `model.kind`, the WordPiece vocabulary, starting from a pre-trained encoder
(`--init-from`), batching by token budget and the accuracy loop.

A fine-tuning run that starts from another model takes three things from it: the vocabulary
(token ids must mean the same thing), the architecture (the weights must fit) and the encoder's
weights. The task head is new and starts from its fresh initialisation.
"""

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.checkpoints import CONFIG
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.data.parallel import EpochBatches, pad_rows, token_batches
from attnlab.data.tokenizers import WordPieceTokenizer, load_tokenizer
from attnlab.errors import ConfigError, UserError
from attnlab.fileio import atomic_write_text
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.bilstm import BiLSTM, BiLSTMConfig
from attnlab.models.electra import Electra

MODEL_KINDS: dict[str, type] = {"bert": BertConfig, "bilstm": BiLSTMConfig}
LABELS_FILE = "labels.json"


def model_config_class(values: dict[str, Any]) -> type:
    kind = values.get("kind", "bert")
    if kind not in MODEL_KINDS:
        raise ConfigError(f"unknown model.kind {kind!r}; choose one of {', '.join(MODEL_KINDS)}")
    return MODEL_KINDS[kind]


def build_model_from_config(config: BertConfig | BiLSTMConfig) -> nn.Module:
    return Bert(config) if isinstance(config, BertConfig) else BiLSTM(config)


@dataclass
class Pretrained:
    """What a fine-tuning run takes from the model it starts from."""

    source: Path
    tokenizer: WordPieceTokenizer
    model: Bert

    @property
    def config(self) -> BertConfig:
        return self.model.config


def load_pretrained(folder: str | Path) -> Pretrained:
    """An attnlab run folder (its best weights; an ELECTRA run's discriminator) or a Hugging Face
    encoder folder (config.json), read by `attnlab.tasks.sources.load_checkpoint`; a `UserError`
    naming what else `folder` is."""
    from attnlab.families import ENCODER
    from attnlab.sources import refusal, what_is
    from attnlab.tasks.sources import load_checkpoint

    path = Path(folder).expanduser()
    if line := refusal(what_is(path), "train --init-from", (ENCODER,)):
        raise UserError(f"--init-from {line}")  # which of the command's arguments is wrong
    loaded = load_checkpoint(path, command="train --init-from", kinds=(ENCODER,))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    if isinstance(model, Electra):
        model = model.discriminator  # ELECTRA fine-tunes its discriminator alone (Clark et al. 2020, §3)
    if not isinstance(model, Bert):
        raise UserError(
            f"--init-from {path}: holds a {type(model).__name__}, but only a BERT encoder can be fine-tuned"
        )
    if not isinstance(tokenizer, WordPieceTokenizer):
        raise UserError(f"--init-from {path}: its tokenizer is not a WordPiece vocabulary with [CLS]/[SEP]/[MASK]")
    return Pretrained(path, tokenizer, model)


def fine_tune_config(pretrained: BertConfig, wanted: BertConfig | BiLSTMConfig) -> BertConfig:
    """The architecture of the pre-trained encoder with this run's head, dropout and pooling. The
    head's form is the encoder's family's (`classifier_head`: BERT's linear classifier, ModernBERT's
    prediction head), so that the run exports to that family's classifier."""
    if not isinstance(wanted, BertConfig):
        raise ConfigError("--init-from starts from a pre-trained BERT encoder; it needs model.kind = 'bert'")
    return dataclasses.replace(
        pretrained, head=wanted.head, n_labels=wanted.n_labels, dropout=wanted.dropout, pooling=wanted.pooling
    )


def wrap_ids(tokenizer: WordPieceTokenizer, ids: Sequence[int], max_len: int) -> list[int]:
    """BERT's single-sentence input: [CLS] ids [SEP], the ids cut so the whole fits `max_len`."""
    return [tokenizer.cls_id, *ids[: max_len - 2], tokenizer.sep_id]


def save_labels(run_dir: Path, labels: Sequence[str]) -> None:
    atomic_write_text(run_dir / LABELS_FILE, json.dumps({"labels": list(labels)}, indent=1))


def read_labels(run_dir: Path) -> list[str]:
    path = run_dir / LABELS_FILE
    try:
        labels = json.loads(path.read_text(encoding="utf-8"))["labels"]
    except FileNotFoundError:
        raise UserError(f"{path} is missing: this run folder has no label set; train it again") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is damaged ({e}); train the run again") from None
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise UserError(f"{path} is damaged: 'labels' must be a non-empty list of strings")
    return labels


class EncoderTask:
    """The common half of classification and tagging; subclasses read the data and say how an
    example becomes ids and targets."""

    name = ""
    data_config_class: type
    selection = ("val_accuracy", "max")
    head = ""  # "sequence" | "token"

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        return model_config_class(values)

    @staticmethod
    def build_model_from_config(config: BertConfig | BiLSTMConfig) -> nn.Module:
        return build_model_from_config(config)

    # -- set-up (called by subclasses' __init__) ----------------------------------------------
    def _setup(
        self,
        data: Any,
        model: BertConfig | BiLSTMConfig,
        run_dir: Path,
        *,
        resume: bool,
        train_texts: Callable[[], Sequence[str]] | None,
        labels: Callable[[], Sequence[str]] | None,
    ) -> None:
        """Vocabulary, label set and model config. A new run trains a WordPiece vocabulary on
        `train_texts()` unless it starts from a pre-trained model (`data.init_from`) or is given
        one (`data.tokenizer`); a resumed run or one loaded for use reads its own."""
        self.data_config = data
        self.run_dir = run_dir
        tokenizer_path = run_dir / "tokenizer.json"
        new_run = not resume and train_texts is not None
        # Only a new run reads the pre-trained folder; afterwards the run has all it needs of it.
        self.pretrained = load_pretrained(data.init_from) if data.init_from and new_run else None
        if not new_run:
            tokenizer = load_tokenizer(tokenizer_path)
            self.labels = read_labels(run_dir)
        else:
            if self.pretrained is not None:
                tokenizer = self.pretrained.tokenizer
            elif data.tokenizer:
                tokenizer = load_tokenizer(_tokenizer_file(data.tokenizer))
            else:
                tokenizer = WordPieceTokenizer.train(train_texts(), data.vocab_size, lowercase=data.lowercase)
            self.labels = list(labels()) if labels is not None else []
            tokenizer.save(tokenizer_path)
            save_labels(run_dir, self.labels)
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise UserError(f"{tokenizer_path} is not a WordPiece vocabulary; this task needs [CLS], [SEP] and [PAD]")
        self.tokenizer = tokenizer
        self.label_ids = {label: i for i, label in enumerate(self.labels)}
        wanted = dataclasses.replace(
            model, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, head=self.head, n_labels=len(self.labels)
        )
        if (source := source_config(self.pretrained, data.init_from, run_dir)) is not None:
            wanted = fine_tune_config(source, wanted)
        self.model_config = wanted
        self.max_len = min(data.max_len, wanted.max_len) if isinstance(wanted, BertConfig) else data.max_len

    def build_model(self) -> nn.Module:
        return build_model_from_config(self.model_config)

    def initialize(self, model: nn.Module) -> None:
        """Copy the pre-trained encoder's weights into a new model (no-op without --init-from)."""
        if self.pretrained is not None:
            model.load_encoder(self.pretrained.model.state_dict())

    # -- ids and batches ---------------------------------------------------------------------
    def wrap(self, ids: Sequence[int]) -> list[int]:
        """[CLS] ids [SEP], cut so the whole fits max_len."""
        return wrap_ids(self.tokenizer, ids, self.max_len)

    def pad(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        return pad_rows(rows, self.tokenizer.pad_id)

    def batches(self, split: str) -> list[list[int]]:
        """A split's examples in length-bucketed batches, shortest first (for evaluation)."""
        lengths = [len(x) for x in self.ids[split]]
        return token_batches(lengths, lengths, self.data_config.max_tokens, seed=None)

    def collate(self, split: str, indices: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """ids `(B, T)` and targets: `(B,)` labels or `(B, T)` tags (IGNORE_INDEX where none); a
        subclass may add tensors that `logits` takes."""
        return self.pad([self.ids[split][i] for i in indices]), self.targets(split, indices)

    def logits(self, model: nn.Module, ids: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """The model's scores for a batch of ids (and the extra tensors `collate` adds)."""
        return model(ids)

    @functools.cached_property
    def _stream(self) -> EpochBatches:
        lengths = [len(x) for x in self.ids["train"]]
        return EpochBatches(lengths, lengths, self.data_config.max_tokens)

    def batches_per_epoch(self) -> int:
        return self._stream.per_epoch

    def train_batch(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        """Batch `index` of the training stream (see `EpochBatches`), with `data.token_dropout`
        of its ordinary subwords replaced by [MASK]."""
        ids, targets, *extra = self.collate("train", self._stream(index, generator.initial_seed()))
        p = self.data_config.token_dropout
        if p > 0:
            # Drawn from the seed and the batch index alone, so a resumed run sees the same noise.
            noise = torch.Generator().manual_seed(generator.initial_seed() * 1_000_003 + index)
            t = self.tokenizer
            ordinary = ~torch.isin(ids, torch.tensor([t.pad_id, t.cls_id, t.sep_id]))
            dropped = ordinary & (torch.rand(ids.shape, generator=noise) < p)
            ids = ids.masked_fill(dropped, t.mask_id)
        return ids, targets, *extra

    @staticmethod
    def batch_tokens(batch: tuple[torch.Tensor, ...]) -> int:
        return batch[0].numel()

    def loss(self, model: nn.Module, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        ids, targets, *extra = (t.to(device, non_blocking=True) for t in batch)
        logits = self.logits(model, ids, *extra)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            label_smoothing=label_smoothing,
        )

    @torch.no_grad()
    def split_metrics(self, model: nn.Module, device: torch.device, split: str) -> dict[str, float]:
        """Loss and accuracy over every example (classification) or word (tagging) of a split."""
        total_loss, correct, count = 0.0, 0, 0
        for indices in self.batches(split):
            ids, targets, *extra = self.collate(split, indices)
            logits = self.logits(model, ids.to(device), *extra).float().cpu()
            flat_logits, flat_targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
            scored = flat_targets != IGNORE_INDEX
            total_loss += F.cross_entropy(flat_logits[scored], flat_targets[scored], reduction="sum").item()
            correct += (flat_logits[scored].argmax(-1) == flat_targets[scored]).sum().item()
            count += int(scored.sum())
        missing = self.unscored(split)  # words cut off by max_len count as errors
        return {"loss": total_loss / max(count, 1), "accuracy": correct / max(count + missing, 1)}

    def unscored(self, split: str) -> int:
        return 0

    def evaluate_during_training(self, model: nn.Module, device: torch.device, **_: Any) -> dict[str, float]:
        m = self.split_metrics(model, device, "val")
        return {"val_loss": m["loss"], "val_accuracy": m["accuracy"]}

    def evaluate(self, model: nn.Module, device: torch.device, *, split: str = "dev", **_: Any) -> dict[str, Any]:
        if split not in self.ids:
            raise UserError(f"unknown split {split!r}; choose one of {', '.join(self.split_names)}")
        m = self.split_metrics(model, device, split)
        return {"accuracy": m["accuracy"], f"{split}_loss": m["loss"], "examples": self.split_size(split)}

    # -- hooks for subclasses ------------------------------------------------------------------
    split_names: tuple[str, ...] = ()

    def targets(self, split: str, indices: Sequence[int]) -> torch.Tensor:
        raise NotImplementedError

    def split_size(self, split: str) -> int:
        return len(self.ids[split])


def source_config(pretrained: Pretrained | None, init_from: str, run_dir: Path) -> BertConfig | None:
    """The shape of the encoder a run starts from (None without init_from): the source's in a new
    run, and afterwards (resumed, or loaded for use) what the run's config.toml saved of it."""
    if pretrained is not None:
        return pretrained.config
    if init_from and (run_dir / CONFIG).exists():
        from attnlab.tasks.trained import saved_model_config  # it imports the task registry, which imports this

        return saved_model_config(run_dir)[1]
    return None


def _tokenizer_file(path: str) -> Path:
    """`data.tokenizer` may name a tokenizer.json or a folder holding one (a run folder)."""
    p = Path(path).expanduser()
    return p / "tokenizer.json" if p.is_dir() else p


# -- contextual embeddings -----------------------------------------------------------------------
def load_encoder(folder: str | Path, device: torch.device) -> tuple[nn.Module, WordPieceTokenizer]:
    """A BERT encoder and its vocabulary from an attnlab run (any task) or a Hugging Face folder."""
    pretrained = load_pretrained(folder)
    return pretrained.model.to(device).eval(), pretrained.tokenizer


@torch.no_grad()
def word_vectors(
    model: Bert, tokenizer: WordPieceTokenizer, words: Sequence[str], device: torch.device
) -> torch.Tensor:
    """The last hidden state at each word's first subword, in the context of the whole sentence -> `(W, C)`."""
    pieces, first = tokenizer.encode_words(list(words))
    if len(pieces) + 2 > model.config.max_len:
        raise UserError(f"the sentence has {len(pieces)} subwords; this model reads at most {model.config.max_len - 2}")
    ids = torch.tensor([[tokenizer.cls_id, *pieces, tokenizer.sep_id]], device=device)
    hidden = model.encode(ids)[0].float().cpu()
    return hidden[[p + 1 for p in first]]


def per_nonblank(texts: Sequence[str], compute: Callable[[list[str]], list], empty: Callable[[], Any]) -> list:
    """`compute` over the texts that are not blank, put back in order, and `empty()` for each
    blank one: a blank input line gets an empty result (an empty output line), not a guess."""
    present = [i for i, t in enumerate(texts) if t.strip()]
    out = [empty() for _ in texts]
    for i, result in zip(present, compute([texts[i] for i in present]) if present else [], strict=True):
        out[i] = result
    return out
