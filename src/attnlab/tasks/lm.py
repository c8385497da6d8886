"""Language modelling: a GPT trained on a text corpus to predict the next token.

The task knows which model (GPT), which data (a text corpus split 90/10, char or BPE tokens),
which loss (next-token cross-entropy) and which metric (validation loss and perplexity). The
trainer and the CLI know nothing more specific than this interface.
"""

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.data.text import encode_splits, random_blocks, read_corpus, sequential_blocks, split_text, train_tokenizer
from attnlab.data.tokenizers import Tokenizer, load_tokenizer
from attnlab.errors import UserError
from attnlab.eval import perplexity
from attnlab.models import GPT, GPTConfig

TOKENIZER_KINDS = ("char", "bpe")


@dataclass(frozen=True)
class LMDataConfig:
    """Where the text comes from and how it becomes tokens."""

    path_fields: ClassVar[tuple[str, ...]] = ("path",)
    """The fields that name files or folders: stored absolute (`attnlab.train.config.resolve`)."""

    path: str = ""
    """A UTF-8 text file; empty means the bundled Tiny Shakespeare."""
    tokenizer: str = "char"
    """"char" (one token per character) or "bpe" (byte-level BPE trained on the corpus)."""
    vocab_size: int = 4096
    """Target vocabulary size of the BPE tokenizer (ignored for "char")."""
    val_fraction: float = 0.1
    """Share of the corpus (its end) held out for validation."""

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer must be one of {list(TOKENIZER_KINDS)}, got {self.tokenizer!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.vocab_size < 257:
            raise ValueError(f"vocab_size must be >= 257 (256 bytes + 1 special token), got {self.vocab_size}")


Batch = tuple[torch.Tensor, torch.Tensor]


class LanguageModeling:
    """Next-token prediction on a text corpus with a GPT."""

    name = "language-model"
    data_config_class = LMDataConfig
    # No "best" checkpoint: the loss during training is nanoGPT's estimate on a few random batches,
    # too noisy to choose by (measured: the estimate's best step was worse on the full split than
    # the last one). The run's last checkpoint is its model.
    selection = None

    @staticmethod
    def model_config_class(values: dict) -> type:
        return GPTConfig

    @staticmethod
    def build_model_from_config(config: GPTConfig) -> GPT:
        return GPT(config)

    def __init__(
        self,
        data: LMDataConfig,
        model: GPTConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 12,
        splits: tuple[str, ...] = ("train", "val"),
    ) -> None:
        """Read the corpus, train the tokenizer (or reload the run's own when resuming), and encode
        both splits into `run_dir/data`. (`splits` is part of the common task interface; a text
        corpus always yields both.)"""
        self.data_config = data
        self.batch_size = batch_size
        text = read_corpus(data.path)
        train_text, val_text = split_text(text, data.val_fraction)
        tokenizer_path = run_dir / "tokenizer.json"
        if resume:
            self.tokenizer: Tokenizer = load_tokenizer(tokenizer_path)
        else:
            self.tokenizer = train_tokenizer(data.tokenizer, train_text, text, data.vocab_size)
            self.tokenizer.save(tokenizer_path)
        self.splits = encode_splits(
            self.tokenizer, train_text, val_text, tokenizer_path.read_text(encoding="utf-8"), run_dir / "data"
        )
        self.model_config = dataclasses.replace(model, vocab_size=self.tokenizer.vocab_size)
        block = self.model_config.block_size
        for name, tokens in (("train", self.splits.train), ("val", self.splits.val)):
            if len(tokens) <= block:
                raise UserError(
                    f"the {name} split of the corpus has {len(tokens)} tokens, fewer than one block of "
                    f"{block} + 1; use a longer corpus or a smaller model.block_size"
                )

    def build_model(self) -> GPT:
        return GPT(self.model_config)

    def tokens(self, split: str) -> np.ndarray:
        return self.splits.train if split == "train" else self.splits.val

    def sample_batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """Random contiguous blocks `(B, T)` from a split, with next-token targets."""
        return random_blocks(self.tokens(split), batch_size, self.model_config.block_size, generator)

    def train_batch(self, index: int, generator: torch.Generator) -> Batch:
        """A training micro-batch: random blocks drawn with the trainer's generator."""
        return self.sample_batch("train", self.batch_size, generator)

    @staticmethod
    def batch_tokens(batch: Batch) -> int:
        return batch[0].numel()

    @staticmethod
    def loss(model: GPT, batch: Batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        if label_smoothing == 0.0:
            return model(x, y)[1]
        logits = model(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), label_smoothing=label_smoothing)

    @torch.no_grad()
    def evaluate_during_training(
        self, model: GPT, device: torch.device, *, step: int, eval_iters: int, seed: int, **_
    ) -> dict[str, float]:
        """nanoGPT's estimate: mean loss of `eval_iters` random batches of each split. Draws from its
        own generator, so evaluating never shifts the training batches."""
        gen = torch.Generator().manual_seed(seed + 1_000_003 * (step + 1))
        out = {}
        for split in ("train", "val"):
            losses = [
                self.loss(model, self.sample_batch(split, self.batch_size, gen), device).item()
                for _ in range(eval_iters)
            ]
            out[f"{split}_loss"] = sum(losses) / len(losses)
        return out

    @torch.no_grad()
    def evaluate(
        self,
        model: GPT,
        device: torch.device,
        *,
        split: str = "val",
        batch_size: int = 64,
        context: int | None = None,
        max_tokens: int | None = None,
        **_: object,
    ) -> dict[str, float]:
        """Loss and perplexity over every non-overlapping block of a split: deterministic. (Other
        keywords of the common task interface, such as a translation's beam size, do not apply.)

        context: the block length to evaluate at (default the training block_size); longer ones
            measure whether the position scheme extrapolates (Press et al. 2022). max_tokens: only
            the split's first tokens (a fixed prefix, so runs compare on the same text)."""
        if split not in ("train", "val"):
            raise UserError(f"unknown split {split!r} for a language model; choose val or train")
        block = self.model_config.block_size if context is None else context
        check_context(model, block)
        tokens = self.tokens(split)
        if max_tokens is not None:
            tokens = tokens[: max_tokens + 1]
        if len(tokens) <= block:
            raise UserError(f"the {split} split has {len(tokens)} tokens, fewer than one block of {block} + 1")
        batch_size = max(1, batch_size * self.model_config.block_size // block)  # about the same tokens a batch
        model.eval()
        total, count = 0.0, 0
        for x, y in sequential_blocks(tokens, block, batch_size):
            _, loss = model(x.to(device), y.to(device))
            total += loss.item() * y.numel()
            count += y.numel()
        mean = total / count if count else math.nan
        return {f"{split}_loss": mean, f"{split}_ppl": perplexity(mean)}


def check_context(model: GPT, context: int) -> None:
    """UserError when `model` cannot read `context` tokens at once: learned positions (and
    Linformer) stop at block_size; the other schemes compute any position."""
    if context < 1:
        raise UserError(f"--context must be >= 1, got {context}")
    limit = model.max_context
    if limit is not None and context > limit:
        c = model.config
        raise UserError(
            f"this model has {c.positions} positions and attention {c.attention!r}: it reads at most "
            f"block_size {limit} tokens, not {context}; evaluate at --context {limit} or less "
            "(rope, alibi, relative, sinusoidal, fourier and none can run past their training length)"
        )
