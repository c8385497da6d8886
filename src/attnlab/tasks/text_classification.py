"""Sentence classification (SST-2 sentiment): one label per sentence.

Which model: a BERT encoder with a classifier on the pooled [CLS] state, or the BiLSTM baseline
(`model.kind`). Which data: `train.tsv` and `dev.tsv` (and `test.tsv` when it has labels) with a
`sentence<TAB>label` header. Which loss: cross-entropy. Which metric: accuracy. The best
checkpoint is chosen on `val`, sentences held out of the training file, so `dev` stays unseen
until it is reported.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from attnlab.data.tsv import LabelledSentences, check_labels, read_labelled_tsv
from attnlab.errors import UserError
from attnlab.tasks.checks import check_splits, need_data_dir
from attnlab.tasks.encoder import EncoderTask, per_nonblank

SPLIT_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}


@dataclass(frozen=True)
class ClassificationDataConfig:
    """Where the labelled sentences come from and how they become tokens."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_dir", "tokenizer", "init_from")
    """The fields that name files or folders: stored absolute (`attnlab.train.config.resolve`)."""

    data_dir: str = ""
    """Folder with train.tsv and dev.tsv (optionally test.tsv): `sentence<TAB>label` with a header."""
    text_column: str = "sentence"
    label_column: str = "label"
    val_size: int = 1000
    """Training sentences held out (a seeded random choice) to pick the best checkpoint."""
    vocab_size: int = 8000
    """WordPiece vocabulary trained on the training sentences (unless init_from or tokenizer is set)."""
    lowercase: bool = True
    """Lowercase (and strip accents) before WordPiece when training the vocabulary; False keeps case
    (capitals tell proper nouns apart)."""
    tokenizer: str = ""
    """Use this tokenizer.json (or a run folder's) instead of training one."""
    init_from: str = ""
    """Start from this pre-trained encoder: an attnlab run folder or a Hugging Face BERT folder."""
    max_len: int = 128
    """Longest input in tokens, [CLS] and [SEP] included; longer sentences are cut."""
    max_tokens: int = 4096
    """Tokens per batch (batch size × longest sentence in it)."""
    token_dropout: float = 0.0
    """Share of training input subwords replaced by [MASK] (a fresh draw per batch): the model must
    also read a word from its context, as it must for words it has never seen."""
    seed: int = 0
    """Seed of the held-out choice."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.token_dropout < 1.0:
            raise ValueError(f"token_dropout must be in [0, 1), got {self.token_dropout}")
        for name in ("vocab_size", "max_len", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_len < 3:
            raise ValueError(f"max_len must be >= 3 ([CLS], a token, [SEP]), got {self.max_len}")
        if self.val_size < 1:
            raise ValueError(f"val_size must be >= 1, got {self.val_size}")


class TextClassification(EncoderTask):
    """One label per sentence, predicted from the whole sentence."""

    name = "text-classification"
    data_config_class = ClassificationDataConfig
    head = "sequence"
    split_names = ("train", "val", "dev", "test")

    def __init__(
        self,
        data: ClassificationDataConfig,
        model: Any,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 0,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        """Read the needed files (train.tsv serves both train and val), set up the vocabulary and
        labels, encode. `splits=()` loads nothing: enough to classify new text with a trained run."""
        if splits:
            need_data_dir(data.data_dir, "classification", "a folder with train.tsv and dev.tsv")
        check_splits(splits, self.split_names)
        files = {s: self._read(data, s) for s in {"train" if s == "val" else s for s in splits}}
        self.data: dict[str, tuple[list[str], list[str]]] = {}
        if "train" in files:
            train = files["train"]
            keep, held = self._hold_out(len(train.sentences), data.val_size, data.seed, train.path)
            self.data["train"] = ([train.sentences[i] for i in keep], [train.labels[i] for i in keep])
            self.data["val"] = ([train.sentences[i] for i in held], [train.labels[i] for i in held])
        self._setup(
            data,
            model,
            run_dir,
            resume=resume,
            train_texts=(lambda: self.data["train"][0]) if "train" in self.data else None,
            labels=(lambda: sorted(set(self.data["train"][1]))) if "train" in self.data else None,
        )
        for s in ("dev", "test"):
            if s in files:
                check_labels(files[s], self.labels)
                self.data[s] = (files[s].sentences, files[s].labels)
        if "train" in files and not resume:
            # A new run reads dev.tsv too, only to check it: a label training never saw should stop
            # the run now, not the evaluation an hour later.
            check_labels(files["dev"] if "dev" in files else self._read(data, "dev"), self.labels)
        self.ids = {
            s: [self.wrap(x) for x in self.tokenizer.encode_batch(list(texts))] for s, (texts, _) in self.data.items()
        }
        self.label_targets = {s: [self.label_ids[y] for y in labels] for s, (_, labels) in self.data.items()}

    @staticmethod
    def _read(data: ClassificationDataConfig, split: str) -> LabelledSentences:
        path = Path(data.data_dir).expanduser() / SPLIT_FILES[split]
        if not path.exists():
            raise UserError(
                f"{path} does not exist; the data folder needs {', '.join(SPLIT_FILES.values())} "
                "(test.tsv only to evaluate on it)"
            )
        return read_labelled_tsv(path, text_column=data.text_column, label_column=data.label_column)

    @staticmethod
    def _hold_out(n: int, size: int, seed: int, path: str) -> tuple[list[int], list[int]]:
        if size >= n:
            raise UserError(f"{path} has {n} sentences, too few to hold out data.val_size = {size}; lower it")
        order = np.random.default_rng(seed).permutation(n)
        return sorted(order[size:].tolist()), sorted(order[:size].tolist())

    def targets(self, split: str, indices: Sequence[int]) -> torch.Tensor:
        return torch.tensor([self.label_targets[split][i] for i in indices], dtype=torch.long)

    @torch.no_grad()
    def classify(self, model: torch.nn.Module, texts: Sequence[str], device: torch.device) -> list[dict[str, Any]]:
        """Each text's most likely label and the probability of every label; `{}` for a blank text."""
        return per_nonblank(texts, lambda present: self._classify(model, present, device), dict)

    def _classify(self, model: torch.nn.Module, texts: list[str], device: torch.device) -> list[dict[str, Any]]:
        rows = [self.wrap(ids) for ids in self.tokenizer.encode_batch(texts)]
        probs = torch.softmax(model(self.pad(rows).to(device)).float(), dim=-1).cpu()
        return [
            {"label": self.labels[int(p.argmax())], "probabilities": dict(zip(self.labels, p.tolist(), strict=True))}
            for p in probs
        ]
