"""Audio: WAV files through the standard library's `wave`, μ-law companding, and the Free Spoken
Digit Dataset's files and split.

μ-law (ITU-T G.711; WaveNet §2.2, van den Oord et al. 2016): f(x) = sign(x) ln(1 + μ|x|) / ln(1 + μ)
for x in [-1, 1], then quantized to μ + 1 = 256 levels. Speech spends most of its time near zero,
where μ-law's levels are dense, so 256 classes reconstruct it far better than 256 even steps.

FSDD (Jackson et al., github.com/Jakobovski/free-spoken-digit-dataset): mono 8 kHz 16-bit WAVs
named `{digit}_{speaker}_{index}.wav`; the official split puts index 0-4 in test, 5-49 in train.
"""

import io
import re
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnlab.errors import UserError
from attnlab.fileio import atomic_write_bytes, check_writable

MU = 255
FSDD_RATE = 8000
FSDD_NAME = re.compile(r"(\d)_([A-Za-z]+)_(\d+)\.wav")
TEST_INDICES = range(5)


def mu_law_encode(x: torch.Tensor, mu: int = MU) -> torch.Tensor:
    """Samples in [-1, 1] (float) -> classes 0..mu (long): f(x) quantized to mu + 1 even steps of [-1, 1].
    Example: [-1.0, 0.0, 1.0] -> [0, 128, 255]."""
    x = x.clamp(-1.0, 1.0)
    f = torch.sign(x) * torch.log1p(mu * x.abs()) / np.log1p(mu)
    return ((f + 1) / 2 * mu + 0.5).floor().long()


SILENCE = int(mu_law_encode(torch.zeros(1))[0])  # 128: the class of a zero sample
"""The mu-law class of silence: what a WaveNet reads before the first sample."""


def mu_law_decode(q: torch.Tensor, mu: int = MU) -> torch.Tensor:
    """Classes 0..mu (long) -> samples in [-1, 1] (float32): the inverse of f at each level's centre,
    x = sign(y) ((1 + mu)^|y| - 1) / mu with y = 2 q / mu - 1."""
    y = 2 * q.float() / mu - 1
    return torch.sign(y) * ((1 + mu) ** y.abs() - 1) / mu


def read_wav(path: str | Path, rate: int = FSDD_RATE) -> np.ndarray:
    """A mono 16-bit PCM WAV at `rate` Hz as int16 samples `(T,)`. Any other rate, channel count or
    sample width is a one-line `UserError` naming the file (attnlab does not resample)."""
    path = Path(path)
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, found_rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if (channels, width, found_rate) != (1, 2, rate):
                raise UserError(
                    f"{path} is {channels}-channel {8 * width}-bit audio at {found_rate} Hz; expected mono 16-bit "
                    f"at {rate} Hz (convert it first, e.g. sox IN -c 1 -b 16 -r {rate} OUT)"
                )
            frames = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise UserError(f"{path} is not a readable PCM WAV file ({e})") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    return np.frombuffer(frames, dtype="<i2").copy()


def wav_bytes(samples: np.ndarray, rate: int = FSDD_RATE) -> bytes:
    """int16 samples `(T,)` as the bytes of a mono 16-bit WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, dtype="<i2").tobytes())
    return buffer.getvalue()


def write_wav(path: str | Path, samples: np.ndarray, rate: int = FSDD_RATE) -> None:
    """Write int16 samples `(T,)` as a mono 16-bit WAV, atomically (a killed write leaves no half file)."""
    path = Path(path)
    check_writable(path)
    try:
        atomic_write_bytes(path, wav_bytes(samples, rate))
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror}") from None


@dataclass(frozen=True)
class Recording:
    """One FSDD file: its path and what its name says."""

    path: Path
    digit: int
    speaker: str
    index: int


def fsdd_recordings(folder: str | Path, split: str) -> list[Recording]:
    """The "train" (index 5-49), "test" (index 0-4) or "all" recordings of an FSDD folder, sorted by name
    ("all": e.g. a folder of generated files named like FSDD's, to score a digit classifier on)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UserError(f"--data-dir {folder} does not exist; give the folder of FSDD WAV files")
    found = []
    for p in sorted(folder.iterdir()):
        m = FSDD_NAME.fullmatch(p.name)
        if m is None:
            continue
        rec = Recording(p, int(m.group(1)), m.group(2), int(m.group(3)))
        if split == "all" or (rec.index in TEST_INDICES) == (split == "test"):
            found.append(rec)
    if not found:
        raise UserError(
            f"{folder} has no {split} recordings named DIGIT_SPEAKER_INDEX.wav (FSDD: index 0-4 test, 5-49 train)"
            if split != "all"
            else f"{folder} has no recordings named DIGIT_SPEAKER_INDEX.wav"
        )
    return found


def fsdd_splits(folder: str | Path, splits: Sequence[str], val_size: int, seed: int) -> dict[str, list[Recording]]:
    """The asked-for splits of "train", "val", "test", "all": val is `val_size` training recordings
    held out by a seeded random choice, train the rest; "all" every recording in the folder."""
    out: dict[str, list[Recording]] = {}
    if {"train", "val"} & set(splits):
        train = fsdd_recordings(folder, "train")
        if val_size >= len(train):
            raise UserError(f"{folder} has {len(train)} training recordings, too few to hold out {val_size}")
        held = set(np.random.default_rng(seed).permutation(len(train))[:val_size].tolist())
        out["train"] = [r for i, r in enumerate(train) if i not in held]
        out["val"] = [r for i, r in enumerate(train) if i in held]
    for split in {"test", "all"} & set(splits):
        out[split] = fsdd_recordings(folder, split)
    return {s: out[s] for s in splits}


def to_float(samples: np.ndarray) -> torch.Tensor:
    """int16 samples -> float32 in [-1, 1)."""
    return torch.from_numpy(samples.astype(np.float32) / 32768.0)


def to_int16(x: torch.Tensor) -> np.ndarray:
    """float samples in [-1, 1] -> int16 (clipped)."""
    return (x.clamp(-1.0, 32767 / 32768) * 32768.0).round().to(torch.int16).numpy()
