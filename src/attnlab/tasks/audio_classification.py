"""Spoken-digit classification (the Free Spoken Digit Dataset): which digit a recording says.

Which model: a CNN over the log spectrogram (`attnlab.models.audio_cnn`). Which data: the FSDD
WAVs of `data.data_dir`, the official split (index 0-4 test), `data.val_size` training recordings
held out; split "all" takes every recording of a folder, e.g. WaveNet's samples written as
`DIGIT_wavenet_I.wav` (`attnlab sample RUN --digit 7 --num-samples 100 --out DIR/7_wavenet.wav`).
Which loss: cross-entropy. Which metric: accuracy. It judges whether WaveNet's generated digits are
recognizable: its accuracy on real test recordings beside its accuracy on samples (BENCHMARKS.md,
"Are the generated digits recognizable?").

Shape legend: B batch, T samples.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data.audio import fsdd_splits, read_wav, to_float
from attnlab.errors import ConfigError, UserError
from attnlab.models.audio_cnn import SpectrogramCNN, SpectrogramCNNConfig
from attnlab.tasks.checks import check_splits, need_data_dir, unknown_split

SPLITS = ("train", "val", "test", "all")


@dataclass(frozen=True)
class DigitsDataConfig:
    """Which recordings."""

    data_dir: str = ""
    """Folder of FSDD WAV files named DIGIT_SPEAKER_INDEX.wav (mono, 8 kHz, 16-bit)."""
    val_size: int = 100
    """Training recordings held out (a seeded random choice) to pick the best checkpoint."""
    max_samples: int = 8000
    """Longer recordings are cut to their first this many samples (FSDD: 1,148 to 18,262)."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("val_size", "max_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def pad(waves: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Waveforms of various lengths -> zero-padded `(B, T)` and their lengths `(B,)`."""
    lengths = torch.tensor([len(w) for w in waves])
    out = torch.zeros(len(waves), int(lengths.max()))
    for row, w in enumerate(waves):
        out[row, : len(w)] = w
    return out, lengths


class AudioClassification:
    """The digit each recording says."""

    name = "audio-classification"
    data_config_class = DigitsDataConfig
    selection = ("val_accuracy", "max")
    split_names = SPLITS
    report_split = "test"
    uses_tokenizer = False

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        if values.get("kind", "spectrogram-cnn") != "spectrogram-cnn":
            raise ConfigError(f"model.kind {values['kind']!r} is not a digit classifier; choose spectrogram-cnn")
        return SpectrogramCNNConfig

    @staticmethod
    def build_model_from_config(config: SpectrogramCNNConfig) -> nn.Module:
        return SpectrogramCNN(config)

    def __init__(
        self,
        data: DigitsDataConfig,
        model: SpectrogramCNNConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 32,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        check_splits(splits, SPLITS)
        if splits:
            need_data_dir(data.data_dir, "digit classification", "e.g. ../shared/data/fsdd")
        self.data_config, self.model_config, self.batch_size = data, model, batch_size
        recordings = fsdd_splits(data.data_dir, splits, data.val_size, data.seed) if splits else {}
        self.waves = {
            s: [to_float(read_wav(r.path))[: data.max_samples] for r in recs] for s, recs in recordings.items()
        }
        self.digits = {s: torch.tensor([r.digit for r in recs]) for s, recs in recordings.items()}
        for split, digits in self.digits.items():
            if int(digits.max()) >= model.n_classes:
                raise UserError(
                    f"the {split} recordings say digits up to {int(digits.max())}; the model has {model.n_classes}"
                )

    def build_model(self) -> nn.Module:
        return SpectrogramCNN(self.model_config)

    def train_batch(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        picks = torch.randint(len(self.waves["train"]), (self.batch_size,), generator=generator).tolist()
        x, lengths = pad([self.waves["train"][k] for k in picks])
        return x, lengths, self.digits["train"][picks]

    @staticmethod
    def batch_tokens(batch: tuple[torch.Tensor, ...]) -> int:
        return batch[0].size(0)  # recordings per second

    @staticmethod
    def loss(model: nn.Module, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        x, lengths, digits = (t.to(device, non_blocking=True) for t in batch)
        return F.cross_entropy(model(x, lengths).float(), digits, label_smoothing=label_smoothing)

    @torch.no_grad()
    def scores(self, model: nn.Module, device: torch.device, split: str) -> dict[str, float]:
        waves, digits = self.waves[split], self.digits[split]
        order = sorted(range(len(waves)), key=lambda k: len(waves[k]))  # similar lengths batch with less padding
        loss, correct = 0.0, 0
        for i in range(0, len(order), 64):
            group = order[i : i + 64]
            x, lengths = pad([waves[k] for k in group])
            logits = model(x.to(device), lengths.to(device)).float().cpu()
            loss += F.cross_entropy(logits, digits[group], reduction="sum").item()
            correct += int((logits.argmax(-1) == digits[group]).sum())
        return {"loss": loss / len(waves), "accuracy": correct / len(waves), "recordings": len(waves)}

    def evaluate_during_training(self, model: nn.Module, device: torch.device, **_: Any) -> dict[str, float]:
        s = self.scores(model, device, "val")
        return {"val_loss": s["loss"], "val_accuracy": s["accuracy"]}

    def evaluate(self, model: nn.Module, device: torch.device, *, split: str = "test", **_: Any) -> dict[str, Any]:
        if split not in self.waves:
            raise unknown_split(split, SPLITS)
        model.eval()
        s = self.scores(model, device, split)
        return {
            "accuracy": s["accuracy"],
            f"{split}_loss": s["loss"],
            "recordings": s["recordings"],
            "parameters": sum(p.numel() for p in model.parameters()),
        }
