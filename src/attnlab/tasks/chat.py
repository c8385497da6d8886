"""Supervised fine-tuning on conversations (`task = "chat"`): a GPT taught to answer in turns, the
loss on the assistant's tokens only (and their end-of-turn token), nothing on the system, user and
tool tokens (Ouyang et al. 2022, §3.5 "SFT"; nanochat's chat SFT).

The data are OpenAI's fine-tuning JSONL (`attnlab.data.conversations`). Each conversation is
rendered by the model's chat template: a Hugging Face folder's own (`data.init_from`); for a model
without one (an attnlab run, a base checkpoint), attnlab's ChatML-like template, whose two special
tokens are added to the tokenizer and given embedding rows (the mean of the others'). The run
folder keeps the template (`chat_template.jinja`) and its tokens (`tokenizer.json` and
`tokenizer_config.json`, the end-of-turn token as eos), so `attnlab chat`, `attnlab serve`'s chat
and the loaders read it as they read a Hugging Face folder's.

Each conversation is one row, padded on the right: a causal model never attends to the padding
after a conversation, so rows need no attention mask, and no conversation sees another. A
conversation longer than the context is skipped with a count on stderr (`data.too_long = "skip"`)
or refused (`"refuse"`); none is cut.
"""

import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from attnlab.checkpoints import TOKENIZER
from attnlab.data.chat_templates import (
    TEMPLATE_FILE,
    TOKENIZER_CONFIG,
    ChatTemplate,
    carried_chat_template,
    read_chat_template,
    read_template,
)
from attnlab.data.conversations import (
    ATTNLAB_END_OF_TURN,
    ATTNLAB_TEMPLATE,
    ATTNLAB_TOKENS,
    Conversation,
    ConversationError,
    Rendered,
    read_conversations,
    render_conversation,
)
from attnlab.data.tokenizers import BPETokenizer, load_tokenizer
from attnlab.errors import UserError
from attnlab.eval import perplexity
from attnlab.fileio import atomic_write_text
from attnlab.models import GPT, GPTConfig
from attnlab.tasks.language_model import Source, cropped_state, fine_tune_config, load_source, write_source_record

TOO_LONG = ("skip", "refuse")
IGNORE = -1  # the GPT's ignore_index: a target that is not trained


@dataclass(frozen=True)
class ChatDataConfig:
    """Which conversations, which model to start from, what to do with one that does not fit."""

    path_fields: ClassVar[tuple[str, ...]] = ("path", "val_path", "init_from", "data_dir")

    path: str = ""
    """OpenAI's fine-tuning JSONL: one `{"messages": [...]}` a line."""
    data_dir: str = ""
    """A folder of conversations (`--data-dir`): its train.jsonl, and its val.jsonl where there is
    one, for `path` and `val_path` when those are empty."""
    val_path: str = ""
    """A JSONL of validation conversations; empty: the last val_fraction of `path`'s."""
    val_fraction: float = 0.1
    """Share of the conversations (the file's last) held out when there is no val_path."""
    init_from: str = ""
    """The model to fine-tune: a Hugging Face causal-LM folder, a GGUF file or a language-model run
    (with a byte-level BPE). Empty: a GPT trained from scratch, with a BPE trained on the conversations."""
    block_size: int = 0
    """With init_from: the longest conversation in tokens (0: model.block_size capped at its context)."""
    vocab_size: int = 4096
    """From scratch: the BPE's vocabulary size."""
    too_long: str = "skip"
    """A conversation longer than the context: "skip" (counted on stderr) or "refuse" (an error naming its line)."""

    def files(self) -> "ChatDataConfig":
        """This config with `data_dir`'s files in `path` and `val_path` where those are empty."""
        if not self.data_dir or self.path:
            return self
        folder = Path(self.data_dir)
        val = folder / "val.jsonl"
        return dataclasses.replace(
            self, path=str(folder / "train.jsonl"), val_path=self.val_path or (str(val) if val.is_file() else "")
        )

    def __post_init__(self) -> None:
        if self.too_long not in TOO_LONG:
            raise ValueError(f"too_long must be one of {list(TOO_LONG)}, got {self.too_long!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.block_size < 0:
            raise ValueError(f"block_size must be >= 0 (0: model.block_size), got {self.block_size}")
        if self.vocab_size < 259:
            raise ValueError(f"vocab_size must be >= 259 (256 bytes + 3 special tokens), got {self.vocab_size}")


@dataclass(frozen=True)
class ChatFormat:
    """A model's chat template and the special tokens it names (`bos_token`, `eos_token`)."""

    source: str
    special_tokens: dict[str, str]


Batch = tuple[torch.Tensor, torch.Tensor]


class Chat:
    """Supervised fine-tuning of a GPT on conversations, the loss on the assistant's tokens."""

    name = "chat"
    data_config_class = ChatDataConfig
    selection = ("val_loss", "min")

    @staticmethod
    def model_config_class(values: dict) -> type:
        return GPTConfig

    @staticmethod
    def build_model_from_config(config: GPTConfig) -> GPT:
        return GPT(config)

    def __init__(
        self,
        data: ChatDataConfig,
        model: GPTConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 8,
        splits: tuple[str, ...] = ("train", "val"),
    ) -> None:
        """The tokenizer and template (the source's, attnlab's, or the run's own when resuming),
        saved in `run_dir`; the conversations rendered and split (none read where `splits` is empty)."""
        data = data.files()
        self.data_config, self.batch_size, self.run_dir = data, batch_size, run_dir
        if data.block_size and not data.init_from:
            raise UserError("data.block_size is for a run that starts from a checkpoint (data.init_from)")
        if splits and not data.path:
            raise UserError(
                "data.path is empty: the chat task trains on OpenAI's fine-tuning JSONL, one "
                '{"messages": [...]} a line (--set data.path="FILE.jsonl", or --data-dir DIR holding train.jsonl)'
            )
        source = load_source(data.init_from) if data.init_from and not resume else None
        self.initial_weights: dict[str, torch.Tensor] | None = None
        if resume:
            self.tokenizer, self.format = _bpe(load_tokenizer(run_dir / TOKENIZER), run_dir), saved_format(run_dir)
        else:
            self.tokenizer, self.format, added = self._new_format(source, data)
        self.model_config = self._model_config(model, source, run_dir, resume)
        if source is not None:
            state = cropped_state(
                source, dataclasses.replace(self.model_config, vocab_size=source.model.config.vocab_size)
            )
            self.initial_weights = grown_state(state, self.model_config, added)
            write_source_record(run_dir, source.record)
        self.rows = {split: [] for split in ("train", "val")}
        if splits:
            self.rows = self._read_rows(data)

    def _new_format(self, source: Source | None, data: ChatDataConfig) -> tuple[BPETokenizer, ChatFormat, int]:
        """The tokenizer and template of a new run, saved; and how many tokens were added."""
        folder = source.record.path if source is not None else None
        found = (
            read_template(folder)
            if folder is not None and folder.is_dir() and source.record.kind != "attnlab"
            else None
        )
        if source is None:
            texts = [m.get("content") or "" for c in read_conversations(data.path) for m in c.messages]
            tokenizer = BPETokenizer.train(texts, data.vocab_size, special_tokens=("<|endoftext|>", *ATTNLAB_TOKENS))
        else:
            tokenizer = _bpe(source.tokenizer, source.record.path)
        before = tokenizer.vocab_size
        if found is None:  # attnlab's template and its two tokens
            tokenizer.tokenizer.add_special_tokens(list(ATTNLAB_TOKENS))
            found = (ATTNLAB_TEMPLATE, {})
            end = ATTNLAB_END_OF_TURN
        else:
            end = _end_of_turn(tokenizer, found)
        tokenizer = BPETokenizer(
            tokenizer.tokenizer, bos_id=tokenizer.bos_id, eos_id=tokenizer.tokenizer.token_to_id(end)
        )
        chat_format = save_format(self.run_dir, tokenizer, found[0], found[1])
        return _bpe(load_tokenizer(self.run_dir / TOKENIZER), self.run_dir), chat_format, tokenizer.vocab_size - before

    def _model_config(self, wanted: GPTConfig, source: Source | None, run_dir: Path, resume: bool) -> GPTConfig:
        if source is not None:
            config = fine_tune_config(source, wanted, self.data_config.block_size)
            return dataclasses.replace(config, vocab_size=self.tokenizer.vocab_size)
        if resume and self.data_config.init_from:
            from attnlab.tasks.trained import saved_model_config  # it imports the task registry

            return saved_model_config(run_dir)[1]
        return dataclasses.replace(wanted, vocab_size=self.tokenizer.vocab_size)

    def _read_rows(self, data: ChatDataConfig) -> dict[str, list[Rendered]]:
        conversations = read_conversations(data.path)
        if data.val_path:
            train, val = conversations, read_conversations(data.val_path)
        else:
            if len(conversations) < 2:
                raise UserError(f"{data.path} has one conversation; give at least two (or data.val_path)")
            n_val = max(1, math.ceil(len(conversations) * data.val_fraction))
            train, val = conversations[:-n_val], conversations[-n_val:]
        return {"train": self._render(train, data.path), "val": self._render(val, data.val_path or data.path)}

    def _render(self, conversations: list[Conversation], path: str) -> list[Rendered]:
        """The conversations that fit the context, rendered; those longer skipped (a count on
        stderr) or refused, as data.too_long says."""
        fmt, context = self.format, self.model_config.block_size
        rows, long = [], []
        for c in conversations:
            try:
                r = render_conversation(c, fmt.source, fmt.special_tokens, self.tokenizer.tokenizer)
            except ConversationError as e:
                raise ConversationError(f"{path} {e}") from None
            (rows if len(r.ids) - 1 <= context else long).append(r)
        if long and self.data_config.too_long == "refuse":
            raise UserError(
                f"{path} line {long[0].line}: the conversation is {len(long[0].ids)} tokens, past the context of "
                f'{context} + 1; shorten it, raise the block size, or set data.too_long = "skip"'
            )
        if long:
            lines = ", ".join(str(r.line) for r in long[:10]) + (", ..." if len(long) > 10 else "")
            sys.stderr.write(
                f"{path}: skipped {len(long)} conversations longer than {context + 1} tokens (lines {lines})\n"
            )
        if not rows:
            raise UserError(f"{path}: no conversation fits the context of {context + 1} tokens; raise the block size")
        return rows

    def initialize(self, model: GPT) -> None:
        """A fine-tuning run's model starts from the source's weights (grown for added tokens)."""
        if self.initial_weights is not None:
            model.load_state_dict(self.initial_weights)
            self.initial_weights = None

    def build_model(self) -> GPT:
        return GPT(self.model_config)

    def batch(self, rows: list[Rendered]) -> Batch:
        """Inputs `(B, T)` and targets `(B, T)`, one conversation a row padded on the right; a
        target is IGNORE unless it is an assistant's token (and on the padding)."""
        width = max(len(r.ids) for r in rows) - 1
        x = torch.zeros(len(rows), width, dtype=torch.long)
        y = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        for i, r in enumerate(rows):
            ids, mask = torch.tensor(r.ids), torch.tensor(r.mask)
            x[i, : len(ids) - 1] = ids[:-1]
            y[i, : len(ids) - 1] = torch.where(mask[1:], ids[1:], IGNORE)
        return x, y

    def sample_batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        rows = self.rows[split]
        picks = torch.randint(len(rows), (batch_size,), generator=generator)
        return self.batch([rows[i] for i in picks.tolist()])

    def train_batch(self, index: int, generator: torch.Generator) -> Batch:
        return self.sample_batch("train", self.batch_size, generator)

    @staticmethod
    def batch_tokens(batch: Batch) -> int:
        return batch[0].numel()

    @staticmethod
    def loss(model: GPT, batch: Batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        """The mean cross-entropy over the batch's assistant tokens."""
        x, y = (t.to(device, non_blocking=True) for t in batch)
        logits = model(x)
        return F.cross_entropy(
            logits.view(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE, label_smoothing=label_smoothing
        )

    @torch.no_grad()
    def evaluate_during_training(
        self, model: GPT, device: torch.device, *, step: int, eval_iters: int, seed: int, **_
    ) -> dict[str, float]:
        """The training loss on `eval_iters` random batches; the validation loss over every validation conversation."""
        gen = torch.Generator().manual_seed(seed + 1_000_003 * (step + 1))
        losses = [
            self.loss(model, self.sample_batch("train", self.batch_size, gen), device).item() for _ in range(eval_iters)
        ]
        return {"train_loss": sum(losses) / len(losses), "val_loss": self.evaluate(model, device)["val_loss"]}

    @torch.no_grad()
    def evaluate(self, model: GPT, device: torch.device, *, split: str = "val", **_: object) -> dict[str, float]:
        """Loss (per assistant token) and perplexity over every conversation of a split."""
        if split not in self.rows:
            raise UserError(f"unknown split {split!r} for a chat run; choose val or train")
        model.eval()
        rows, total, count = self.rows[split], 0.0, 0
        for i in range(0, len(rows), self.batch_size):
            x, y = self.batch(rows[i : i + self.batch_size])
            n = int((y != IGNORE).sum())
            total += self.loss(model, (x, y), device).item() * n
            count += n
        mean = total / count
        return {f"{split}_loss": mean, f"{split}_ppl": perplexity(mean)}


def _bpe(tokenizer, where) -> BPETokenizer:
    if not isinstance(tokenizer, BPETokenizer):
        raise UserError(
            f"{where}: the chat task needs a byte-level BPE tokenizer, to which special tokens can be added; "
            'pretrain with data.tokenizer = "bpe"'
        )
    return tokenizer


def _end_of_turn(tokenizer: BPETokenizer, found: tuple[str, dict[str, str]]) -> str:
    """The token that ends an assistant's turn under a folder's template: the last token of a
    rendered assistant turn (Llama 3's <|eot_id|>, ChatML's <|im_end|>)."""
    probe = Conversation(0, ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}))
    r = render_conversation(probe, found[0], found[1], tokenizer.tokenizer)
    last = max(i for i, m in enumerate(r.mask) if m)
    return tokenizer.tokenizer.id_to_token(r.ids[last])


def save_format(run_dir: Path, tokenizer: BPETokenizer, source: str, special: dict[str, str]) -> ChatFormat:
    """The run's tokenizer.json, its template (chat_template.jinja) and tokenizer_config.json (the
    template's special tokens, bos and eos, by name: what `read_template` and `load_tokenizer` read)."""
    import json

    tokenizer.save(run_dir / TOKENIZER)
    named = {
        f"{role}_token": tokenizer.tokenizer.id_to_token(i)
        for role, i in (("bos", tokenizer.bos_id), ("eos", tokenizer.eos_id))
        if i is not None
    }
    special = {**special, **named}
    atomic_write_text(run_dir / TOKENIZER_CONFIG, json.dumps(special, indent=1) + "\n")
    atomic_write_text(run_dir / TEMPLATE_FILE, source)
    return ChatFormat(source, special)


def saved_format(run_dir: Path) -> ChatFormat:
    found = read_template(run_dir)
    if found is None:
        raise UserError(f"{run_dir} has no {TEMPLATE_FILE}; restore it or train the run again")
    return ChatFormat(*found)


def saved_chat_template(run_dir: Path) -> str | None:
    """The template a chat run saved (its chat_template.jinja), or None for a run without one."""
    path = Path(run_dir) / TEMPLATE_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def loaded_chat_template(path: str | Path, loaded) -> ChatTemplate:
    """The `ChatTemplate` of a model loaded from `path` (`attnlab.tasks.sources.Loaded`): the one
    its checkpoint carries (a chat run's, a GGUF file's), else its Hugging Face folder's; a
    `UserError` naming the fix where it has none (a base run, a folder without a template)."""
    path = Path(path)
    if loaded.chat_template is not None:
        return carried_chat_template(loaded.chat_template, loaded.tokenizer)
    template = read_chat_template(path, loaded.tokenizer.decode) if path.is_dir() and loaded.run is None else None
    if template is None:
        raise UserError(
            f"{path} has no chat template; fine-tune it on conversations first: "
            f"attnlab train chat-sft --init-from {path} --set data.path=CONVERSATIONS.jsonl"
        )
    return template


def grown_state(state: dict[str, torch.Tensor], config: GPTConfig, added: int) -> dict[str, torch.Tensor]:
    """The source's weights with `added` rows for new tokens in the token embedding (and an untied
    head): each the mean of the existing rows, so a new token starts as an average token."""
    if added == 0:
        return state
    if config.input_embedding != "plain" or config.softmax != "full":
        raise UserError(
            'the chat task adds tokens to the vocabulary; it needs model.input_embedding "plain" and softmax "full"'
        )
    out = dict(state)
    for key in ("token_embedding.weight", "lm_head.weight"):
        if key in out and out[key].size(0) == config.vocab_size - added:
            out[key] = torch.cat([out[key], out[key].mean(0, keepdim=True).expand(added, -1)])
    if "lm_head.bias" in out and out["lm_head.bias"].size(0) == config.vocab_size - added:
        out["lm_head.bias"] = torch.cat([out["lm_head.bias"], out["lm_head.bias"].mean().expand(added)])
    return out
