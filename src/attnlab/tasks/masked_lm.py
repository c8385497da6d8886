"""Masked-language-model pre-training (BERT, Devlin et al. 2019 §3.1) on a plain text corpus.

Which model: a BERT encoder with the masked-LM head, new or taken from a pre-trained run
(`data.init_from`: continued pre-training, e.g. on a task's own text; Gururangan et al. 2020).
Which data: a corpus folder with `train.txt` and `valid.txt` (optionally `test.txt`), the WikiText
layout, or a UD treebank folder (the words of its sentences); a WordPiece vocabulary is trained on
the training text unless the run starts from a pre-trained one. The text is one token stream cut
into full blocks of `max_len` tokens ([CLS] ... [SEP]), so no position is padding (RoBERTa's
"full-sentences" packing; no next-sentence objective). Which loss: cross-entropy at the chosen
positions (`mask_prob`, 15% in BERT). Which metric: masked-token
accuracy and perplexity on validation blocks masked the same way every time.
"""

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.accel import reference_cross_entropy
from attnlab.data.conllu import read_conllu
from attnlab.data.mlm import IGNORE_INDEX, mask_tokens
from attnlab.data.parallel import read_lines
from attnlab.data.tokenizers import WordPieceTokenizer, load_tokenizer
from attnlab.errors import ConfigError, UserError
from attnlab.eval import perplexity
from attnlab.models.bert import Bert, BertConfig
from attnlab.tasks.checks import unknown_split
from attnlab.tasks.encoder import load_pretrained, source_config
from attnlab.tasks.token_classification import find_split_file

SPLIT_FILES = {"train": "train.txt", "val": "valid.txt", "test": "test.txt"}
EVAL_SEED = 20_190_524  # the validation blocks are masked identically at every evaluation


@dataclass(frozen=True)
class MLMDataConfig:
    """Where the text comes from and how it becomes masked blocks."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_dir", "init_from")
    """The fields that name files or folders: stored absolute (`attnlab.train.config.resolve`)."""

    data_dir: str = ""
    """Folder with train.txt and valid.txt (optionally test.txt), e.g. WikiText-2; or a UD treebank
    folder (*-ud-train.conllu, *-ud-dev.conllu, *-ud-test.conllu), read as its sentences' words."""
    init_from: str = ""
    """Continue pre-training this encoder (an attnlab run folder or a Hugging Face BERT folder): its
    vocabulary, architecture and weights, the masked-LM head too where it has one. vocab_size,
    tokenizer and lowercase are then the source's."""
    tokenizer: str = "wordpiece"
    """Subword algorithm of the vocabulary trained on train.txt: "wordpiece" (BERT's) or "bpe"."""
    vocab_size: int = 16000
    """Size of the vocabulary trained on train.txt."""
    lowercase: bool = True
    """Lowercase (and strip accents) before WordPiece, as BERT-base-uncased."""
    unknown_word: str = "<unk>"
    """The corpus's own unknown-word marker, read as [UNK] (WikiText writes <unk>); empty: none."""
    mask_prob: float = 0.15
    """Share of tokens chosen for prediction; of those 80% become [MASK], 10% a random token, 10% stay."""

    def __post_init__(self) -> None:
        if self.tokenizer not in ("wordpiece", "bpe"):
            raise ValueError(f"tokenizer must be 'wordpiece' or 'bpe', got {self.tokenizer!r}")
        if self.vocab_size < 100:
            raise ValueError(f"vocab_size must be >= 100, got {self.vocab_size}")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")


class MaskedLM:
    """BERT pre-training: predict the masked tokens of a text from both sides."""

    name = "masked-lm"
    data_config_class = MLMDataConfig
    selection = ("val_loss", "min")
    cross_entropy: Callable[..., torch.Tensor] = staticmethod(reference_cross_entropy)
    """The training loss's cross-entropy: PyTorch's, or the C++ kernel's that the trainer sets
    where attnlab's kernels are on (`attnlab.accel.for_training`)."""

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        if values.get("kind", "bert") != "bert":
            raise ConfigError(f"masked-LM pre-training trains a BERT encoder; model.kind {values['kind']!r} is not one")
        return BertConfig

    @staticmethod
    def build_model_from_config(config: BertConfig) -> Bert:
        return Bert(config)

    def __init__(
        self,
        data: MLMDataConfig,
        model: BertConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 32,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        """Read the splits, train (or reload) the vocabulary, cut each split into blocks."""
        if splits and not data.data_dir:
            raise UserError("masked-LM pre-training needs a corpus: pass --data-dir DIR (with train.txt, valid.txt)")
        self.data_config = data
        self.batch_size = batch_size
        lines = {s: self._read(data.data_dir, s) for s in splits}
        tokenizer_path = run_dir / "tokenizer.json"
        new_run = not resume and "train" in lines
        # Only a new run reads the source folder; afterwards the run has all it needs of it.
        self.pretrained = load_pretrained(data.init_from) if data.init_from and new_run else None
        if not new_run:
            tokenizer = load_tokenizer(tokenizer_path)
            if not isinstance(tokenizer, WordPieceTokenizer):
                raise UserError(f"{tokenizer_path} is not a WordPiece vocabulary with [MASK]")
        else:
            if self.pretrained is not None:
                tokenizer = self.pretrained.tokenizer
            else:
                tokenizer = WordPieceTokenizer.train(
                    lines["train"], data.vocab_size, lowercase=data.lowercase, algorithm=data.tokenizer
                )
            tokenizer.save(tokenizer_path)
        self.tokenizer = tokenizer
        if (source := source_config(self.pretrained, data.init_from, run_dir)) is not None:
            model = continued_config(source, model)
        self.model_config = dataclasses.replace(
            model, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, head="mlm", n_labels=0
        )
        self.blocks = {s: self._blocks(text, s) for s, text in lines.items()}
        # Never chosen for prediction: padding and the markers; [UNK] is a real (if vague) token.
        self.never_chosen = [i for i in tokenizer.special_ids if i != tokenizer.unk_id]

    def _read(self, data_dir: str, split: str) -> list[str]:
        folder = Path(data_dir).expanduser()
        path = folder / SPLIT_FILES[split]
        if not path.exists() and folder.is_dir() and any(folder.glob("*-ud-*.conllu*")):
            # A treebank: one line per sentence, its words as UD splits them (the tags unused).
            treebank_split = "dev" if split == "val" else split
            return [" ".join(s.words) for s in read_conllu(find_split_file(data_dir, treebank_split))]
        if not path.exists():
            raise UserError(
                f"{path} does not exist; the corpus folder needs {', '.join(SPLIT_FILES.values())} "
                "(or *-ud-train.conllu, *-ud-dev.conllu, *-ud-test.conllu)"
            )
        marker = self.data_config.unknown_word
        lines = [line.strip() for line in read_lines(path)]
        return [line.replace(marker, "[UNK]") if marker else line for line in lines if line]

    def _blocks(self, lines: list[str], split: str) -> torch.Tensor:
        """The split as blocks `(N, max_len)`: [CLS] max_len-2 tokens of the stream [SEP]."""
        t = self.tokenizer
        stream = np.fromiter((i for ids in t.encode_batch(lines) for i in ids), dtype=np.int64)
        width = self.model_config.max_len - 2
        n = len(stream) // width
        if n == 0:
            raise UserError(f"the {split} text has {len(stream)} tokens, fewer than one block of {width}")
        body = torch.from_numpy(stream[: n * width].reshape(n, width))
        return torch.cat([torch.full((n, 1), t.cls_id), body, torch.full((n, 1), t.sep_id)], dim=1)  # (N, max_len)

    def build_model(self) -> Bert:
        return Bert(self.model_config)

    def initialize(self, model: Bert) -> None:
        """Copy the source's weights into a new model (no-op without init_from): all of them where
        the source has a masked-LM head; otherwise the encoder, and the head starts fresh."""
        if self.pretrained is None:
            return
        source = self.pretrained.model
        if source.config.head == "mlm":
            model.load_state_dict(source.state_dict())
        else:
            model.load_encoder(source.state_dict())

    def _mask(self, blocks: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return mask_tokens(
            blocks,
            mask_id=self.tokenizer.mask_id,
            vocab_size=self.tokenizer.vocab_size,
            special_ids=self.never_chosen,
            generator=generator,
            mask_prob=self.data_config.mask_prob,
        )

    def train_batch(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `index`: epochs over the blocks in a seeded order; masked with the trainer's
        generator, whose state the checkpoint keeps, so a resumed run masks the same way."""
        blocks = self.blocks["train"]
        per_epoch = max(len(blocks) // self.batch_size, 1)
        epoch, position = divmod(index, per_epoch)
        if getattr(self, "_epoch", None) is None or self._epoch[0] != epoch:
            order = torch.randperm(
                len(blocks), generator=torch.Generator().manual_seed(generator.initial_seed() + epoch)
            )
            self._epoch = (epoch, order)
        chosen = self._epoch[1][position * self.batch_size : (position + 1) * self.batch_size]
        return self._mask(blocks[chosen], generator)

    @staticmethod
    def batch_tokens(batch: tuple[torch.Tensor, torch.Tensor]) -> int:
        return batch[0].numel()

    @staticmethod
    def _logits(model: Bert, inputs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        # The vocabulary projection only at the chosen positions: ~7x less work than everywhere.
        # Through forward, so that a compiled model (train.compile) compiles this too.
        return model(inputs, chosen=chosen)  # (N, V)

    def loss(self, model: Bert, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        inputs, labels = (t.to(device, non_blocking=True) for t in batch)
        return masked_lm_loss(model, inputs, labels, label_smoothing, self.cross_entropy)

    @torch.no_grad()
    def _metrics(self, model: Bert, device: torch.device, split: str, n_blocks: int | None) -> dict[str, float]:
        blocks = self.blocks[split] if n_blocks is None else self.blocks[split][:n_blocks]
        inputs, labels = self._mask(blocks, torch.Generator().manual_seed(EVAL_SEED))
        total, correct, count = 0.0, 0, 0
        for start in range(0, len(blocks), 64):
            x, y = inputs[start : start + 64].to(device), labels[start : start + 64].to(device)
            chosen = y != IGNORE_INDEX
            logits = self._logits(model, x, chosen).float()
            total += F.cross_entropy(logits, y[chosen], reduction="sum").item()
            correct += (logits.argmax(-1) == y[chosen]).sum().item()
            count += int(chosen.sum())
        loss = total / max(count, 1)
        return {"loss": loss, "accuracy": correct / max(count, 1), "ppl": perplexity(loss), "tokens": count}

    def evaluate_during_training(
        self, model: Bert, device: torch.device, *, eval_iters: int = 20, **_: Any
    ) -> dict[str, float]:
        """The first `eval_iters` × batch_size validation blocks, masked the same way each time."""
        m = self._metrics(model, device, "val", eval_iters * self.batch_size)
        return {"val_loss": m["loss"], "val_accuracy": m["accuracy"], "val_ppl": m["ppl"]}

    def evaluate(self, model: Bert, device: torch.device, *, split: str = "val", **_: Any) -> dict[str, Any]:
        """Masked-token loss, accuracy and perplexity over every block of a split."""
        if split not in self.blocks:
            raise unknown_split(split, tuple(SPLIT_FILES))
        m = self._metrics(model, device, split, None)
        return {
            "accuracy": m["accuracy"],
            f"{split}_loss": m["loss"],
            f"{split}_ppl": m["ppl"],
            "masked_tokens": m["tokens"],
        }


def continued_config(source: BertConfig, wanted: BertConfig) -> BertConfig:
    """The architecture of the encoder pre-training continues from, with this run's dropout."""
    return dataclasses.replace(source, dropout=wanted.dropout, head="mlm", n_labels=0)


def masked_lm_loss(
    model: Bert,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    cross_entropy: Callable[..., torch.Tensor] = reference_cross_entropy,
) -> torch.Tensor:
    """The pre-training loss: mean cross-entropy at the chosen positions of inputs `(B, T)`, those
    whose labels `(B, T)` are not IGNORE_INDEX (the vocabulary projection at those alone), through
    `cross_entropy` (PyTorch's; `attnlab.accel.kernels.cross_entropy` computes the same)."""
    chosen = labels != IGNORE_INDEX
    logits = MaskedLM._logits(model, inputs, chosen)  # (N, V), bf16 under autocast
    # fp32 arithmetic either way; attnlab's kernel (train.fused_kernels) never writes fp32 copies.
    return cross_entropy(logits, labels[chosen], label_smoothing=label_smoothing)
