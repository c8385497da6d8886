"""Language modelling: a GPT trained on a text corpus to predict the next token.

The task knows which model (GPT), which data (a text corpus split 90/10, char or BPE tokens),
which loss (next-token cross-entropy) and which metric (validation loss and perplexity). The
trainer and the CLI know nothing more specific than this interface.

Fine-tuning (`data.init_from`, `attnlab train finetune-lm --init-from FOLDER`): a new run takes
the model (config and weights) and the tokenizer of a Hugging Face causal-LM folder (any causal
family of `attnlab.families`), a GGUF file or an attnlab language-model run, never retraining the
tokenizer (nanoGPT's `init_from`, and
Howard & Ruder 2018 for fine-tuning a language model on one's own text). Its `source.json` records
the folder and the hash of its weights (`source_record`); a resumed run reads none of the source.
"""

import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.checkpoints import TOKENIZER, weights_sha256
from attnlab.data.text import encode_splits, random_blocks, read_corpus, sequential_blocks, split_text, train_tokenizer
from attnlab.data.tokenizers import Tokenizer, load_tokenizer
from attnlab.errors import CheckpointError, UserError
from attnlab.eval import perplexity
from attnlab.fileio import atomic_write_text
from attnlab.models import GPT, GPTConfig
from attnlab.nn import rank_by_frequency

TOKENIZER_KINDS = ("char", "bpe")
SOURCE_FILE = "source.json"
SOURCE_FORMAT_VERSION = 1
POSITION_TABLE = "positions.embedding.weight"  # learned positions: the one tensor a shorter context crops


@dataclass(frozen=True)
class LMDataConfig:
    """Where the text comes from and how it becomes tokens."""

    path_fields: ClassVar[tuple[str, ...]] = ("path", "init_from", "tokenizer_file")
    """The fields that name files or folders: stored absolute (`attnlab.train.config.resolve`)."""

    path: str = ""
    """A UTF-8 text file, or a folder of .txt files (joined in name order); empty means the bundled
    Tiny Shakespeare."""
    tokenizer: str = "char"
    """"char" (one token per character) or "bpe" (byte-level BPE trained on the corpus); not used
    with init_from, which brings its own."""
    vocab_size: int = 4096
    """Target vocabulary size of the BPE tokenizer (ignored for "char")."""
    tokenizer_file: str = ""
    """A tokenizer.json (another run's, or a Hugging Face folder's) used as it is instead of
    training one (data.tokenizer and vocab_size are then not used): a model trained from scratch
    with a pre-trained model's tokens, so that their losses per token compare."""
    val_fraction: float = 0.1
    """Share of the corpus (its end) held out for validation."""
    init_from: str = ""
    """A checkpoint to fine-tune: a Hugging Face causal-LM folder, a GGUF file or an attnlab
    language-model run. Its model (config and weights) and tokenizer replace the model section's
    shape and data.tokenizer; the model section's dropout is kept. Empty: train from scratch."""
    block_size: int = 0
    """With init_from: tokens per training block, an error past the checkpoint's context. 0 takes
    model.block_size capped at that context (the log says so). The run's model.block_size is the
    block (a learned position table keeps its first rows, as nanoGPT's crop_block_size)."""

    def __post_init__(self) -> None:
        if self.block_size < 0:
            raise ValueError(f"block_size must be >= 0 (0: model.block_size), got {self.block_size}")
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer must be one of {list(TOKENIZER_KINDS)}, got {self.tokenizer!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.tokenizer_file and self.init_from:
            raise ValueError("give tokenizer_file or init_from, not both: init_from brings its own tokenizer")
        if self.vocab_size < 257:
            raise ValueError(f"vocab_size must be >= 257 (256 bytes + 1 special token), got {self.vocab_size}")


Batch = tuple[torch.Tensor, torch.Tensor]


class LanguageModel:
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
        """Read the corpus, train the tokenizer (or, with data.init_from, take the checkpoint's model
        config, weights and tokenizer; or reload the run's own when resuming), and encode both
        splits into `run_dir/data`. (`splits` is part of the common task interface; a text corpus
        always yields both.)"""
        self.data_config = data
        self.batch_size = batch_size
        if data.block_size and not data.init_from:
            raise UserError(
                "data.block_size is for a run that starts from a checkpoint (data.init_from); "
                "a model trained from scratch takes model.block_size"
            )
        # Only a new run reads the source; afterwards the run folder holds all it needs of it.
        source = load_source(data.init_from) if data.init_from and not resume else None
        # A new fine-tuning run's first weights, until `initialize` puts them into its model.
        self.initial_weights: dict[str, torch.Tensor] | None = None
        if source is not None:
            config = fine_tune_config(source, model, data.block_size)
            self.initial_weights = cropped_state(source, config)
        text = read_corpus(data.path)
        train_text, val_text = split_text(text, data.val_fraction)
        tokenizer_path = run_dir / TOKENIZER
        self.tokenizer = self._tokenizer(tokenizer_path, resume, source, train_text, text)
        if source is not None:
            write_source_record(run_dir, source.record)
        self.splits = encode_splits(
            self.tokenizer, train_text, val_text, tokenizer_path.read_text(encoding="utf-8"), run_dir / "data"
        )
        self.model_config = config if source is not None else self._saved_or_new_config(model, run_dir)
        block = self.model_config.block_size
        for name, tokens in (("train", self.splits.train), ("val", self.splits.val)):
            if len(tokens) <= block:
                raise UserError(
                    f"the {name} split of the corpus has {len(tokens)} tokens, fewer than one block of "
                    f"{block} + 1; use a longer corpus or a smaller model.block_size (data.block_size with init_from)"
                )

    def _tokenizer(self, path: Path, resume: bool, source: "Source | None", train_text: str, text: str) -> Tokenizer:
        """The run's tokenizer, saved at `path`: its own when resuming, else the checkpoint's, else
        one trained on the corpus."""
        if resume:
            return load_tokenizer(path)
        if source is not None:
            # Read back from the run's file, as a resumed run and `attnlab sample RUN` read it: the
            # corpus is one stream of text, so the checkpoint's rule of adding "<s>" before each
            # text it encodes (Llama's post-processor) does not cut into it.
            source.tokenizer.save(path)
            return load_tokenizer(path)
        if self.data_config.tokenizer_file:  # (a missing or unreadable file: one line, from load_tokenizer)
            load_tokenizer(self.data_config.tokenizer_file).save(path)
            return load_tokenizer(path)
        tokenizer = train_tokenizer(self.data_config.tokenizer, train_text, text, self.data_config.vocab_size)
        tokenizer.save(path)
        return tokenizer

    def _saved_or_new_config(self, wanted: GPTConfig, run_dir: Path) -> GPTConfig:
        """A fine-tuning run resumed (or loaded for use) has the model its config.toml saved, the
        checkpoint's shape; a run from scratch the one asked for, sized to its tokenizer."""
        if self.data_config.init_from:
            from attnlab.tasks.trained import saved_model_config  # it imports the task registry, which imports this

            return saved_model_config(run_dir)[1]
        return dataclasses.replace(wanted, vocab_size=self.tokenizer.vocab_size)

    def initialize(self, model: GPT) -> None:
        """A new fine-tuning run's model starts from the checkpoint's weights; a new run's adaptive
        input or softmax ranks its clusters by the training tokens' counts (Baevski & Auli 2019)."""
        if self.initial_weights is not None:
            model.load_state_dict(self.initial_weights)
            self.initial_weights = None  # the model holds them now
            return
        c = model.config
        if c.input_embedding == "adaptive" or c.softmax.startswith("adaptive"):
            counts = np.bincount(self.splits.train, minlength=c.vocab_size)
            rank_by_frequency(model, torch.from_numpy(counts))

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


# -- fine-tuning: the checkpoint a run starts from ---------------------------------------------------
ATTNLAB_RUN = "attnlab"
"""`SourceRecord.kind` of an attnlab run folder (a Hugging Face folder's is its model_type)."""


@dataclass(frozen=True)
class SourceRecord:
    """What a fine-tuning run started from: its `source.json`, read back by `source_record`."""

    path: Path
    """The checkpoint folder (or GGUF file), absolute."""
    kind: str
    """A Hugging Face folder's model_type ("llama"), a GGUF file's general.architecture, or "attnlab"
    (a run folder)."""
    weights_sha256: str
    """`attnlab.checkpoints.weights_sha256(path)` when the run started."""


@dataclass
class Source:
    """A checkpoint loaded to fine-tune from (`load_source`)."""

    model: GPT
    tokenizer: Tokenizer
    record: SourceRecord

    @property
    def context(self) -> int:
        """The longest sequence the checkpoint was made for: its block_size (GPT-2's n_positions,
        Llama's max_position_embeddings)."""
        return self.model.config.block_size


def load_source(folder: str | Path) -> Source:
    """The model, tokenizer and record of a Hugging Face causal-LM folder, a GGUF file or an attnlab
    language-model run (its best weights), on the CPU in float32, read by
    `attnlab.tasks.sources.load_checkpoint`. A `UserError` naming the problem for anything else."""
    from attnlab.families import CAUSAL_LM
    from attnlab.sources import refusal, takes_words, what_is
    from attnlab.tasks.sources import load_checkpoint

    path = Path(folder).expanduser().resolve()
    if line := refusal(what_is(path), "train --init-from", (CAUSAL_LM,)):
        raise UserError(f"--init-from {line}")  # which of the command's arguments is wrong
    loaded = load_checkpoint(path, command="train --init-from", kinds=(CAUSAL_LM,))
    if loaded.run is not None and loaded.task != LanguageModel.name:
        raise UserError(
            f"--init-from {path}: a {loaded.task!r} run, not a language model; give "
            + takes_words((CAUSAL_LM,)).replace("a run folder", "a language-model run folder", 1)
        )
    kind = ATTNLAB_RUN if loaded.run is not None else str(loaded.source.model_type)
    return Source(loaded.model.float().eval(), loaded.tokenizer, SourceRecord(path, kind, weights_sha256(path)))


def fine_tune_config(source: Source, wanted: GPTConfig, block_size: int) -> GPTConfig:
    """The checkpoint's model config with this run's dropout and training block (`block_size`, or
    else `wanted.block_size` capped at the checkpoint's context), said in one line on stderr."""
    context = source.context
    if block_size > context:
        raise UserError(
            f"data.block_size {block_size} is past the context of {source.record.path} ({context} tokens); "
            f"set data.block_size to {context} or less"
        )
    block = block_size or min(wanted.block_size, context)
    config = dataclasses.replace(source.model.config, dropout=wanted.dropout, block_size=block)
    r, c = source.record, config
    what = "attnlab run" if r.kind == ATTNLAB_RUN else f"{r.kind} checkpoint"
    capped = f" (model.block_size {wanted.block_size} capped at its context)" if block < wanted.block_size else ""
    sys.stderr.write(
        f"--init-from {r.path}: the model and tokenizer of this {what} ({c.n_layers} layers, d_model "
        f"{c.d_model}, {c.n_heads} heads, {c.vocab_size} token ids, context {context}); the model section's "
        f"shape is not used, its dropout {c.dropout} is; training blocks of {block} tokens{capped}\n"
    )
    return config


def cropped_state(source: Source, config: GPTConfig) -> dict[str, Any]:
    """The checkpoint's weights for a model of `config`, its shape with a context no longer than its
    own: a learned position table keeps its first block_size rows (nanoGPT's crop_block_size); any
    other tensor must fit as it is."""
    with torch.device("meta"):  # the shapes alone, no memory
        shapes = {k: v.shape for k, v in GPT(config).state_dict().items()}
    state = source.model.state_dict()
    if POSITION_TABLE in state:
        state[POSITION_TABLE] = state[POSITION_TABLE][: config.block_size]
    misfits = [k for k, v in state.items() if shapes.get(k) != v.shape]
    if misfits:
        raise UserError(
            f"--init-from {source.record.path}: its {misfits[0]} is made for {source.context} tokens, not the "
            f"training blocks of {config.block_size}; set data.block_size = {source.context}"
        )
    return state


def write_source_record(run_dir: Path, record: SourceRecord) -> None:
    """`run_dir/source.json`: what the run started from (a format version, the folder, its kind and
    the hash of its weights)."""
    doc = {
        "format_version": SOURCE_FORMAT_VERSION,
        "path": str(record.path),
        "kind": record.kind,
        "weights_sha256": record.weights_sha256,
    }
    atomic_write_text(run_dir / SOURCE_FILE, json.dumps(doc, indent=2) + "\n")


def source_record(run_dir: str | Path) -> SourceRecord | None:
    """What the language-model run in `run_dir` was fine-tuned from (its source.json), or None for a
    run trained from scratch. A `CheckpointError` where the file is damaged."""
    path = Path(run_dir) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        version, fields = doc["format_version"], (doc["path"], doc["kind"], doc["weights_sha256"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is damaged ({type(e).__name__}: {e}); restore it or train again") from None
    if version != SOURCE_FORMAT_VERSION or not all(isinstance(f, str) and f for f in fields):
        raise CheckpointError(
            f"{path}: expected format_version {SOURCE_FORMAT_VERSION} and the strings path, kind and "
            "weights_sha256; restore it or train the run again"
        )
    return SourceRecord(Path(fields[0]), fields[1], fields[2])
