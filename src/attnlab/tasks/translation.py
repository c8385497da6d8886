"""Machine translation: an encoder–decoder trained on a parallel corpus (Multi30k de→en).

The task knows which models (the Transformer, or an RNN baseline, chosen by `model.kind`), which
data (Multi30k from `--data-dir`, one joint byte-level BPE vocabulary trained on the training
split), which loss (label-smoothed cross-entropy over real target tokens) and which metric (BLEU
with sacrebleu; the best checkpoint is the one with the best validation BLEU).
"""

import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.accel.plan import EAGER, DecodePlan, plan_decoding
from attnlab.data.parallel import (
    MULTI30K_SPLITS,
    EpochBatches,
    TranslationBatch,
    collate,
    encode_pairs,
    load_multi30k,
    token_batches,
    train_joint_bpe,
)
from attnlab.data.tokenizers import BPETokenizer, load_tokenizer
from attnlab.decode.seq2seq import beam_search
from attnlab.errors import ConfigError, UserError
from attnlab.eval import bleu, bleu_lc_tok
from attnlab.models.rnn import RNNConfig, build_rnn
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.progress import ProgressLines

Logger = Callable[[str], object]

MODEL_KINDS: dict[str, type] = {"seq2seq-transformer": Seq2SeqConfig, "gru": RNNConfig, "gru-attention": RNNConfig}


@dataclass(frozen=True)
class TranslationDataConfig:
    """Where the parallel text comes from and how it is batched."""

    path_fields: ClassVar[tuple[str, ...]] = ("data_dir",)
    """The fields that name files or folders: stored absolute (`attnlab.train.config.resolve`)."""

    data_dir: str = ""
    """Folder with {train,val,test_2016_flickr,test_2017_flickr}.{src,tgt}.gz (attnlab train --data-dir)."""
    src_lang: str = "de"
    tgt_lang: str = "en"
    vocab_size: int = 8000
    """Size of the joint BPE vocabulary, trained on the training split only."""
    max_len: int = 100
    """Longest sequence per side in tokens (target counted with <bos> and <eos>); longer pairs are cut."""
    max_tokens: int = 4096
    """Tokens per batch (batch size × longest padded side), batches formed by length."""
    eval_beam: int = 1
    """Beam size for the validation BLEU during training (1 = greedy, fast)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "max_tokens", "eval_beam"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 260:
            raise ValueError(f"vocab_size must be >= 260 (256 bytes + specials), got {self.vocab_size}")


@dataclass(frozen=True)
class Alignment:
    """A sentence's translation and where the decoder looked while writing it."""

    translation: str
    source_tokens: list[str]
    """The source sentence's tokens: the columns (S)."""
    target_tokens: list[str]
    """The translation's tokens and a final "</s>": the rows (T)."""
    weights: torch.Tensor
    """float32 `(T, S)`, on the CPU; each row sums to 1."""


class Translation:
    """Sequence-to-sequence translation with a Transformer or an RNN encoder–decoder."""

    name = "translation"
    data_config_class = TranslationDataConfig
    selection = ("val_bleu", "max")

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        kind = values.get("kind", "seq2seq-transformer")
        if kind not in MODEL_KINDS:
            raise ConfigError(f"unknown model.kind {kind!r}; choose one of {', '.join(MODEL_KINDS)}")
        return MODEL_KINDS[kind]

    @staticmethod
    def build_model_from_config(config: Seq2SeqConfig | RNNConfig) -> nn.Module:
        if isinstance(config, Seq2SeqConfig):
            return Seq2SeqTransformer(config)
        return build_rnn(config)

    def __init__(
        self,
        data: TranslationDataConfig,
        model: Any,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 0,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        """Read the splits, train (or reload) the joint BPE vocabulary, encode the pairs.
        Batches are formed by token count (`data.max_tokens`), so `batch_size` is not used."""
        if splits and not data.data_dir:
            raise UserError("translation needs its data: pass --data-dir DIR (a Multi30k folder)")
        self.data_config = data
        tokenizer_path = run_dir / "tokenizer.json"
        corpora = {s: load_multi30k(data.data_dir, s, data.src_lang, data.tgt_lang) for s in splits}
        if resume or "train" not in corpora:
            tokenizer = load_tokenizer(tokenizer_path)
            if not isinstance(tokenizer, BPETokenizer) or tokenizer.pad_id is None or tokenizer.bos_id is None:
                raise UserError(f"{tokenizer_path} is not a translation vocabulary (it lacks <pad>/<bos>/<eos>)")
        else:
            tokenizer = train_joint_bpe(corpora["train"], data.vocab_size)
            tokenizer.save(tokenizer_path)
        self.tokenizer = tokenizer
        self.pad_id, self.bos_id, self.eos_id = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
        self.corpora = corpora
        self.encoded = {s: encode_pairs(tokenizer, c.pairs, data.max_len) for s, c in corpora.items()}
        for s, c in corpora.items():
            notes = []
            if c.skipped_empty:
                notes.append(f"skipped {c.skipped_empty} empty pairs")
            if self.encoded[s].truncated:
                notes.append(f"truncated {self.encoded[s].truncated} pairs longer than {data.max_len} tokens")
            if notes:
                sys.stderr.write(f"{s}: {'; '.join(notes)}\n")
        max_len = model.max_len if isinstance(model, Seq2SeqConfig) else None
        if max_len is not None and max_len < data.max_len:
            raise ConfigError(f"model.max_len ({max_len}) must be >= data.max_len ({data.max_len})")
        self.model_config = dataclasses.replace(model, vocab_size=tokenizer.vocab_size, pad_id=self.pad_id)
        self._budget_said = False  # the validation budget is said once, at the first evaluation

    def build_model(self) -> nn.Module:
        return self.build_model_from_config(self.model_config)

    # -- training --------------------------------------------------------------------------
    def _batches(self, split: str, seed: int | None) -> list[list[int]]:
        enc = self.encoded[split]
        return token_batches(
            [len(s) for s in enc.src], [len(t) for t in enc.tgt], self.data_config.max_tokens, seed=seed
        )

    def train_batch(self, index: int, generator: torch.Generator) -> TranslationBatch:
        """Micro-batch number `index` of the training stream (see `EpochBatches`)."""
        enc = self.encoded["train"]
        return collate(enc.src, enc.tgt, self._stream(index, generator.initial_seed()), self.pad_id)

    @functools.cached_property
    def _stream(self) -> EpochBatches:
        enc = self.encoded["train"]
        return EpochBatches([len(s) for s in enc.src], [len(t) for t in enc.tgt], self.data_config.max_tokens)

    def batches_per_epoch(self) -> int:
        return self._stream.per_epoch

    @staticmethod
    def batch_tokens(batch: TranslationBatch) -> int:
        return batch.n_tokens

    def loss(self, model: nn.Module, batch: TranslationBatch, device: torch.device, label_smoothing: float = 0.0):
        src, tgt_in, tgt_out = (t.to(device, non_blocking=True) for t in (batch.src, batch.tgt_in, batch.tgt_out))
        logits = model(src, tgt_in)
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(),
            tgt_out.reshape(-1),
            ignore_index=self.pad_id,
            label_smoothing=label_smoothing,
        )

    @torch.no_grad()
    def split_loss(
        self, model: nn.Module, device: torch.device, split: str, batches: list[list[int]] | None = None
    ) -> float:
        """Mean token loss of the split's pairs (those of `batches` where given)."""
        total, count = 0.0, 0
        enc = self.encoded[split]
        for indices in self._batches(split, None) if batches is None else batches:
            batch = collate(enc.src, enc.tgt, indices, self.pad_id)
            total += self.loss(model, batch, device).item() * batch.n_tokens
            count += batch.n_tokens
        return total / count

    def validation_budget(self, eval_iters: int) -> list[list[int]]:
        """The validation batches evaluated during training: all of them when there are at most
        `eval_iters` (train.eval_iters), else `eval_iters` batches of a fixed seeded draw, the same
        at every evaluation so that the scores compare. (`attnlab eval` scores the whole split.)"""
        every = self._batches("val", None)
        return every if len(every) <= eval_iters else self._batches("val", 0)[:eval_iters]

    def evaluate_during_training(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        eval_iters: int,
        log: Callable[[str], object] | None = None,
        **_,
    ) -> dict[str, float]:
        """Validation loss and BLEU (decoded with `data.eval_beam`) on the pairs of at most
        `eval_iters` validation batches (`validation_budget`); `log` gets a line saying how many
        pairs that is, and progress lines while the decoding takes long."""
        batches = self.validation_budget(eval_iters)
        chosen = sorted(i for indices in batches for i in indices)
        pairs = self.corpora["val"].pairs
        if log is not None and not self._budget_said:
            self._budget_said = True
            if len(chosen) < len(pairs):
                log(
                    f"validation during training: {len(chosen)} of {len(pairs)} pairs ({eval_iters} batches, "
                    "train.eval_iters); `attnlab eval RUN` scores the whole split"
                )
        progress = ProgressLines("validation", len(chosen), "sentences translated", write=log)
        val_loss = self.split_loss(model, device, "val", batches)
        sources = [self.encoded["val"].src[i] for i in chosen]
        hyps = self.translate_ids(model, sources, device, beam=self.data_config.eval_beam, progress=progress.update)
        return {"val_loss": val_loss, "val_bleu": bleu(hyps, [pairs[i][1] for i in chosen]).score}

    # -- using a model ------------------------------------------------------------------------
    def translate_ids(
        self,
        model: nn.Module,
        sources: Sequence[Sequence[int]],
        device: torch.device,
        *,
        beam: int = 5,
        length_penalty: float = 1.0,
        max_len_ratio: float = 1.5,
        plan: DecodePlan | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> list[str]:
        """Translate already-encoded source sentences (in their order) to detokenized text;
        `plan`: whether the decoder steps in C++ (`beam_search`'s `fused`), decided where the model
        was loaded (`attnlab.accel.plan.plan_decoding`); None: decided here, the C++ step where it is
        built and covers the model; `progress(n)` after each batch of n sentences."""
        if plan is None:
            plan = plan_decoding(model)
        out: list[str] = [""] * len(sources)
        lengths = [len(s) for s in sources]
        for indices in token_batches(lengths, lengths, 6000, seed=None):
            width = max(lengths[i] for i in indices)
            src = torch.full((len(indices), max(width, 1)), self.pad_id, dtype=torch.long)
            for row, i in enumerate(indices):
                src[row, : lengths[i]] = torch.tensor(sources[i], dtype=torch.long)
            ids = beam_search(
                model,
                src.to(device),
                beam_size=beam,
                bos_id=self.bos_id,
                eos_id=self.eos_id,
                length_penalty=length_penalty,
                max_len_ratio=max_len_ratio,
                fused=plan.fused,
            )
            for row, i in enumerate(indices):
                out[i] = self.tokenizer.decode(ids[row], skip_special=True).strip() if lengths[i] else ""
            if progress is not None:
                progress(len(indices))
        return out

    @torch.no_grad()
    def align(
        self,
        model: nn.Module,
        source_ids: Sequence[int],
        device: torch.device,
        *,
        beam: int = 5,
        length_penalty: float = 1.0,
        max_len_ratio: float = 1.5,
        plan: DecodePlan = EAGER,
    ) -> "Alignment":
        """One encoded source sentence's translation by beam search and the decoder's cross-attention
        over it (`model.cross_attention`: the last layer's, averaged over heads) under teacher forcing
        on that translation."""
        if not source_ids:
            raise UserError("the sentence is empty: there is nothing to translate or align")
        src = torch.tensor([list(source_ids)], device=device)
        options = dict(length_penalty=length_penalty, max_len_ratio=max_len_ratio, fused=plan.fused)
        (target_ids,) = beam_search(model, src, beam_size=beam, bos_id=self.bos_id, eos_id=self.eos_id, **options)
        tgt_in = torch.tensor([[self.bos_id, *target_ids]], device=device)
        weights = model.cross_attention(src, tgt_in)[0].float().cpu()  # (T, S)
        tok = self.tokenizer
        # Row t is where the decoder looked while predicting the token after tgt_in[t]: label it with
        # that token; the last row predicted </s>.
        return Alignment(
            translation=tok.decode(target_ids, skip_special=True).strip(),
            source_tokens=tok.token_texts(source_ids),
            target_tokens=[*tok.token_texts(target_ids), "</s>"],
            weights=weights,
        )

    def encode_sources(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Source token ids of each text (empty text -> no tokens) and how many were cut to max_len."""
        limit = self.data_config.max_len
        ids, cut = [], 0
        for text in texts:
            t = self.tokenizer.encode(text.strip()) if text.strip() else []
            if len(t) > limit:
                t, cut = t[:limit], cut + 1
            ids.append(t)
        return ids, cut

    def evaluate(self, model: nn.Module, device: torch.device, *, split: str = "val", beam: int = 5) -> dict:
        """BLEU of the split: sacreBLEU (detokenized, cased, with its signature) and lowercased
        tokenized BLEU, comparable with the Multi30k tutorial figures."""
        if split not in self.corpora:
            raise UserError(f"unknown split {split!r}; choose one of {', '.join(MULTI30K_SPLITS)}")
        pairs = self.corpora[split].pairs
        progress = ProgressLines(split, len(pairs), "sentences translated")
        hyps = self.translate_ids(model, self.encoded[split].src, device, beam=beam, progress=progress.update)
        refs = [tgt for _, tgt in pairs]
        score = bleu(hyps, refs)
        return {
            "bleu": score.score,
            "bleu_lc_tok": bleu_lc_tok(hyps, refs),
            "sacrebleu_signature": score.signature,
            "sentences": len(pairs),
            "beam": beam,
            f"{split}_loss": self.split_loss(model, device, split),
        }
