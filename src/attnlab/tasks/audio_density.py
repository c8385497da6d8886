"""Speech density estimation (the Free Spoken Digit Dataset): p(waveform | digit[, speaker]) as a
product of per-sample conditionals, each a 256-way softmax over μ-law classes (WaveNet §2.2).

Which model: WaveNet (`attnlab.models.wavenet`). Which data: the FSDD WAVs of `data.data_dir`
(`attnlab.data.audio`): the official split (index 0-4 test), `data.val_size` training recordings
held out for validation. Which loss: cross-entropy of each sample's class, in nats per sample.
Which metric: the same, and in bits per sample (a uniform model scores 8), on the held-out
recordings to pick the best checkpoint, on the test recordings to report.

Every recording is read as `[silence, x_0, ..., x_n-1]` and the model predicts `x_0, ..., x_n-1`
from what comes before: the first sample from silence alone. Training draws random crops of
`data.segment` samples; a crop that starts inside a recording has no past before it, so its first
receptive-field - 1 targets (which would be predicted from zero padding, a past that never
happens in generation) are left out of the loss.

Shape legend: B batch, T time.
"""

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data.audio import SILENCE, Recording, fsdd_splits, mu_law_encode, read_wav, to_float
from attnlab.errors import ConfigError, UserError
from attnlab.models.wavenet import WaveNet, WaveNetConfig
from attnlab.tasks.checks import check_splits, need_data_dir, unknown_split

SPLITS = ("train", "val", "test", "all")


@dataclass(frozen=True)
class AudioDataConfig:
    """Which recordings, and how training cuts them."""

    data_dir: str = ""
    """Folder of FSDD WAV files named DIGIT_SPEAKER_INDEX.wav (mono, 8 kHz, 16-bit)."""
    val_size: int = 100
    """Training recordings held out (a seeded random choice) to pick the best checkpoint."""
    segment: int = 4000
    """Samples per training crop (half a second at 8 kHz)."""
    eval_clips: int = 50
    """Validation recordings scored at each evaluation during training (the first ones)."""
    condition_on_speaker: bool = False
    """Also condition on the speaker (the model's speakers are then those of the training files)."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("val_size", "segment", "eval_clips"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class Clips:
    """μ-law classes of each recording (long, various lengths), its digit and speaker id."""

    audio: list[torch.Tensor]
    digits: torch.Tensor
    speakers: torch.Tensor
    names: list[str]

    def take(self, index: Sequence[int]) -> "Clips":
        i = list(index)
        return Clips([self.audio[k] for k in i], self.digits[i], self.speakers[i], [self.names[k] for k in i])


def encode_clips(recordings: Sequence[Recording], speakers: Sequence[str]) -> Clips:
    """Recordings read and μ-law encoded; speaker ids index `speakers` (-1 when absent)."""
    ids = {s: i for i, s in enumerate(speakers)}
    return Clips(
        [mu_law_encode(to_float(read_wav(r.path))) for r in recordings],
        torch.tensor([r.digit for r in recordings]),
        torch.tensor([ids.get(r.speaker, -1) for r in recordings]),
        [r.path.name for r in recordings],
    )


class AudioDensity:
    """The likelihood of each recording, sample by sample, given its digit; WaveNet can also speak."""

    name = "audio-density"
    data_config_class = AudioDataConfig
    selection = ("val_loss", "min")
    split_names = SPLITS
    report_split = "test"
    uses_tokenizer = False

    @staticmethod
    def model_config_class(values: dict[str, Any]) -> type:
        if values.get("kind", "wavenet") != "wavenet":
            raise ConfigError(f"model.kind {values['kind']!r} is not an audio model; choose wavenet")
        return WaveNetConfig

    @staticmethod
    def build_model_from_config(config: WaveNetConfig) -> nn.Module:
        return WaveNet(config)

    def __init__(
        self,
        data: AudioDataConfig,
        model: WaveNetConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        batch_size: int = 8,
        splits: Sequence[str] = ("train", "val"),
    ) -> None:
        check_splits(splits, SPLITS)
        if splits:
            need_data_dir(data.data_dir, "speech density estimation", "e.g. ../shared/data/fsdd")
        self.data_config, self.batch_size = data, batch_size
        recordings = fsdd_splits(data.data_dir, splits, data.val_size, data.seed) if splits else {}
        if data.condition_on_speaker and not model.speakers and "train" in recordings:
            model = dataclasses.replace(model, speakers=tuple(sorted({r.speaker for r in recordings["train"]})))
        self.clips = {split: encode_clips(recs, model.speakers) for split, recs in recordings.items()}
        if model.speakers:
            for split, clips in self.clips.items():
                unknown = [n for n, s in zip(clips.names, clips.speakers.tolist(), strict=True) if s < 0]
                if unknown:
                    raise UserError(
                        f"{unknown[0]} ({split}) is by a speaker the model does not know; it knows "
                        + ", ".join(model.speakers)
                    )
        self.model_config = model

    def build_model(self) -> nn.Module:
        return WaveNet(self.model_config)

    def speakers_of(self, clips: Clips) -> torch.Tensor | None:
        return clips.speakers if self.model_config.speakers else None

    def train_batch(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        """B random crops: inputs `(B, T)`, targets `(B, T)` (-1 = not scored), digits and speakers `(B,)`."""
        clips = self.clips["train"]
        picks = torch.randint(len(clips.audio), (self.batch_size,), generator=generator).tolist()
        length, warmup = self.data_config.segment, self.model_config.receptive_field - 1
        inputs = torch.full((self.batch_size, length), SILENCE, dtype=torch.long)
        targets = torch.full((self.batch_size, length), -1, dtype=torch.long)
        for row, k in enumerate(picks):
            seq = torch.cat([torch.tensor([SILENCE]), clips.audio[k]])  # the silence before the first sample
            start = int(torch.randint(len(seq) - length, (1,), generator=generator)) if len(seq) > length + 1 else 0
            crop = seq[start : start + length + 1]
            n = len(crop) - 1
            inputs[row, :n], targets[row, :n] = crop[:-1], crop[1:]
            if start > 0:
                targets[row, :warmup] = -1
        return inputs, targets, clips.digits[picks], clips.speakers[picks]

    @staticmethod
    def batch_tokens(batch: tuple[torch.Tensor, ...]) -> int:
        return int((batch[1] >= 0).sum())  # scored samples

    def loss(self, model: nn.Module, batch, device: torch.device, label_smoothing: float = 0.0) -> torch.Tensor:
        inputs, targets, digits, speakers = (t.to(device, non_blocking=True) for t in batch)
        logits = model(inputs, digits, speakers if self.model_config.speakers else None)  # (B, 256, T)
        return F.cross_entropy(logits.float(), targets, ignore_index=-1, label_smoothing=label_smoothing)

    @torch.no_grad()
    def nll(self, model: nn.Module, device: torch.device, split: str, limit: int | None = None) -> tuple[float, int]:
        """Mean NLL in nats per sample over whole recordings (the first `limit`), and the sample count."""
        clips = self.clips[split]
        n = len(clips.audio) if limit is None else min(limit, len(clips.audio))
        order = sorted(range(n), key=lambda k: len(clips.audio[k]))  # similar lengths batch with less padding
        total, count = 0.0, 0
        for i in range(0, n, 16):
            group = order[i : i + 16]
            longest = max(len(clips.audio[k]) for k in group)
            targets = torch.full((len(group), longest), -1, dtype=torch.long)
            for row, k in enumerate(group):
                targets[row, : len(clips.audio[k])] = clips.audio[k]
            inputs = torch.cat([torch.full((len(group), 1), SILENCE), targets[:, :-1].clamp(min=0)], dim=1)
            speakers = clips.speakers[group] if self.model_config.speakers else None
            logits = model(
                inputs.to(device), clips.digits[group].to(device), None if speakers is None else speakers.to(device)
            )
            total += F.cross_entropy(logits.float(), targets.to(device), ignore_index=-1, reduction="sum").item()
            count += int((targets >= 0).sum())
        return total / count, count

    def evaluate_during_training(self, model: nn.Module, device: torch.device, **_: Any) -> dict[str, float]:
        return {"val_loss": self.nll(model, device, "val", self.data_config.eval_clips)[0]}

    def evaluate(self, model: nn.Module, device: torch.device, *, split: str = "test", **_: Any) -> dict[str, Any]:
        if split not in self.clips:
            raise unknown_split(split, SPLITS)
        model.eval()
        nats, n = self.nll(model, device, split)
        return {
            f"{split}_nll": nats,
            f"{split}_bits_per_sample": nats / math.log(2),
            "samples": n,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
