"""Replaced-token detection: ELECTRA pre-training (Clark et al. 2020) on a plain text corpus.

Which model: `attnlab.models.electra.Electra`, a small masked-LM generator and the BERT
discriminator that fine-tuning keeps (`--init-from` this run loads the discriminator's encoder).
Which data: what masked-LM pre-training reads (`attnlab.tasks.masked_lm`: a WikiText-style corpus folder
or a UD treebank, a WordPiece vocabulary trained on it, full blocks of `max_len` tokens), masked as
google-research/electra masks (`pretrain_helpers.mask`): `mask_prob` of the tokens chosen, 85% of
those become [MASK] and 15% stay; the generator's samples then replace every chosen token. Which
loss (§3, Eq. 1 with the expectations over one sample): the generator's masked-LM cross-entropy at
the chosen positions plus λ (`discriminator_weight`, 50 in the paper) times the discriminator's
binary cross-entropy, averaged over every token that is not padding. Which metric: both losses,
the generator's accuracy at the chosen positions and the discriminator's over all tokens, on
validation blocks masked and sampled the same way every time (in metrics.csv: `val_loss` the
combined loss, `val_accuracy` the discriminator's accuracy, `val_ppl` the generator's perplexity).

No best checkpoint is kept: as the generator improves the discriminator's task gets harder, so
the combined validation loss does not rank checkpoints; the paper fine-tunes the last one.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.accel import reference_cross_entropy
from attnlab.data.mlm import IGNORE_INDEX, mask_tokens
from attnlab.errors import ConfigError
from attnlab.eval import perplexity
from attnlab.models.electra import Electra, ElectraConfig, ElectraOutput
from attnlab.tasks.checks import unknown_split
from attnlab.tasks.masked_lm import EVAL_SEED, SPLIT_FILES, MaskedLM, MLMDataConfig

REPLACE_PROB = 0.85  # google-research/electra's `mask`: 85% of the chosen tokens become [MASK], 15% stay


@dataclass(frozen=True)
class RTDDataConfig(MLMDataConfig):
    """Where the text comes from, how it is masked for the generator, and the losses' balance."""

    mask_prob: float = 0.15
    """Share of tokens the generator predicts and its samples replace (15% in the paper); of those,
    85% are shown to the generator as [MASK] and 15% as they are (no random tokens)."""
    discriminator_weight: float = 50.0
    """λ of the combined loss, generator loss + λ × discriminator loss (50 in the paper, §3: the
    per-token binary loss is much smaller than the masked-LM loss)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init_from:
            raise ValueError(
                "init_from: replaced-token detection pre-trains its generator and discriminator from scratch; "
                "drop --init-from (fine-tune the result with --init-from RUN instead)"
            )
        if self.discriminator_weight < 0:
            raise ValueError(f"discriminator_weight must be >= 0, got {self.discriminator_weight}")


@dataclass
class ElectraLosses:
    """The combined loss and its two parts (means), with the step they were computed on."""

    total: torch.Tensor
    generator: torch.Tensor
    discriminator: torch.Tensor
    output: ElectraOutput


def electra_losses(
    model: Electra,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    pad_id: int,
    discriminator_weight: float,
    label_smoothing: float = 0.0,
    cross_entropy: Callable[..., torch.Tensor] = reference_cross_entropy,
) -> ElectraLosses:
    """ELECTRA's loss on a masked batch: inputs `(B, T)` (the masked text), labels `(B, T)` (the
    original id at chosen positions, IGNORE_INDEX elsewhere: `mask_tokens`'s), uniforms `(B, T)`
    (the sampling draws). Generator: mean cross-entropy at the chosen positions (label smoothing,
    where given, applies to it alone). Discriminator: mean binary cross-entropy of "replaced" over
    every position whose original id is not `pad_id`."""
    chosen = labels != IGNORE_INDEX
    originals = torch.where(chosen, labels, inputs)  # (B, T): only chosen positions were changed
    out = model(inputs, originals, chosen, uniforms)
    generator = cross_entropy(out.generator_logits, labels[chosen], label_smoothing=label_smoothing)
    real = originals != pad_id
    discriminator = F.binary_cross_entropy_with_logits(
        out.discriminator_logits[real].float(), out.replaced[real].float()
    )
    return ElectraLosses(generator + discriminator_weight * discriminator, generator, discriminator, out)


class ReplacedTokenDetection(MaskedLM):
    """ELECTRA pre-training: a generator fills in masked tokens, a discriminator spots them. The corpus,
    its vocabulary and its blocks are read as masked-LM pre-training reads them."""

    name = "replaced-token-detection"
    data_config_class = RTDDataConfig
    selection = None

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        if values.get("kind", "electra") != "electra":
            raise ConfigError(
                f"replaced-token detection trains an ELECTRA generator and discriminator; model.kind "
                f"{values['kind']!r} is not one (model.kind = 'electra')"
            )
        return ElectraConfig

    @staticmethod
    def build_model_from_config(config: ElectraConfig) -> Electra:
        return Electra(config)

    def __init__(self, data: RTDDataConfig, model: ElectraConfig, run_dir: Path, **kwargs: Any) -> None:
        """As masked-LM pre-training; the model config then says the discriminator has no BERT head."""
        super().__init__(data, model, run_dir, **kwargs)
        self.model_config = dataclasses.replace(self.model_config, head="none")

    def build_model(self) -> Electra:
        return Electra(self.model_config)

    def _mask(
        self, blocks: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs, labels, uniforms), each `(B, T)`: ELECTRA's masking, and a uniform draw per
        position for the generator's sampling, from the same generator (a resumed run draws alike)."""
        inputs, labels = mask_tokens(
            blocks,
            mask_id=self.tokenizer.mask_id,
            vocab_size=self.tokenizer.vocab_size,
            special_ids=self.never_chosen,
            generator=generator,
            mask_prob=self.data_config.mask_prob,
            replace_prob=REPLACE_PROB,
            random_prob=0.0,
        )
        return inputs, labels, torch.rand(blocks.shape, generator=generator)

    def _losses(
        self,
        model: Electra,
        batch,
        device: torch.device,
        label_smoothing: float = 0.0,
        cross_entropy: Callable[..., torch.Tensor] | None = None,
    ) -> ElectraLosses:
        """The losses of a batch from `train_batch`; through the training loss's cross-entropy
        (attnlab's kernel where the trainer set it) unless `cross_entropy` is given."""
        inputs, labels, uniforms = (t.to(device, non_blocking=True) for t in batch)
        return electra_losses(
            model,
            inputs,
            labels,
            uniforms,
            pad_id=self.tokenizer.pad_id,
            discriminator_weight=self.data_config.discriminator_weight,
            label_smoothing=label_smoothing,
            cross_entropy=cross_entropy or self.cross_entropy,
        )

    def loss(self, model: Electra, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        return self._losses(model, batch, device, label_smoothing).total

    @torch.no_grad()
    def _metrics(self, model: Electra, device: torch.device, split: str, n_blocks: int | None) -> dict[str, float]:
        blocks = self.blocks[split] if n_blocks is None else self.blocks[split][:n_blocks]
        masked = self._mask(blocks, torch.Generator().manual_seed(EVAL_SEED))
        sums = dict.fromkeys(
            ("gen_loss", "gen_correct", "chosen", "disc_loss", "disc_correct", "tokens", "replaced"), 0.0
        )
        for start in range(0, len(blocks), 64):
            batch = tuple(t[start : start + 64] for t in masked)
            losses = self._losses(model, batch, device, cross_entropy=reference_cross_entropy)
            _add_sums(sums, losses, batch[1].to(device), self.tokenizer.pad_id)
        chosen, tokens = max(sums["chosen"], 1.0), max(sums["tokens"], 1.0)
        gen, disc = sums["gen_loss"] / chosen, sums["disc_loss"] / tokens
        return {
            "loss": gen + self.data_config.discriminator_weight * disc,
            "generator_loss": gen,
            "generator_accuracy": sums["gen_correct"] / chosen,
            "discriminator_loss": disc,
            "discriminator_accuracy": sums["disc_correct"] / tokens,
            "replaced_share": sums["replaced"] / tokens,
        }

    def evaluate_during_training(
        self, model: Electra, device: torch.device, *, eval_iters: int = 20, **_: Any
    ) -> dict[str, float]:
        """The first `eval_iters` × batch_size validation blocks, masked and sampled the same way each
        time, in metrics.csv's columns: the combined loss, the discriminator's accuracy and the
        generator's perplexity at the masked positions."""
        m = self._metrics(model, device, "val", eval_iters * self.batch_size)
        return {
            "val_loss": m["loss"],
            "val_accuracy": m["discriminator_accuracy"],
            "val_ppl": perplexity(m["generator_loss"]),
        }

    def evaluate(self, model: Electra, device: torch.device, *, split: str = "val", **_: Any) -> dict[str, Any]:
        """Both losses and accuracies over every block of a split; `accuracy` is the discriminator's."""
        if split not in self.blocks:
            raise unknown_split(split, tuple(SPLIT_FILES))
        m = self._metrics(model, device, split, None)
        return {
            "accuracy": m["discriminator_accuracy"],
            f"{split}_loss": m["loss"],
            "generator_loss": m["generator_loss"],
            "generator_accuracy": m["generator_accuracy"],
            "discriminator_loss": m["discriminator_loss"],
            "replaced_share": m["replaced_share"],
        }


def _add_sums(sums: dict[str, float], losses: ElectraLosses, labels: torch.Tensor, pad_id: int) -> None:
    """Add one evaluation batch's totals (from its mean losses) to `sums`."""
    out, chosen = losses.output, labels != IGNORE_INDEX
    real = torch.where(chosen, labels, out.corrupted) != pad_id  # (B, T): the original is not padding
    n_chosen, n_real = int(chosen.sum()), int(real.sum())
    sums["gen_loss"] += losses.generator.item() * n_chosen
    sums["gen_correct"] += (out.generator_logits.argmax(-1) == labels[chosen]).sum().item()
    sums["chosen"] += n_chosen
    sums["disc_loss"] += losses.discriminator.item() * n_real
    sums["disc_correct"] += ((out.discriminator_logits > 0) == out.replaced)[real].sum().item()
    sums["tokens"] += n_real
    sums["replaced"] += out.replaced[real].sum().item()
