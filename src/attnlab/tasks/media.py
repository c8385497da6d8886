"""Sampling a trained image or audio density run, as `attnlab sample` does: the request checked
against the run's model (its classes, digits and speakers), the real image to complete read from
the run's data, then the samplers of `attnlab.decode.pixels` and `attnlab.decode.audio`.

`sample_run_images` returns the images; `attnlab.viz.images.sample_image_grid` also draws them as
a PNG. `sample_run_audio` writes the WAV files itself (`attnlab.data.audio` has the writer).

Shape legend: N samples, H rows, W columns, T audio samples.
"""

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.data.audio import FSDD_RATE, mu_law_decode, to_int16, write_wav
from attnlab.decode import sampling_picker
from attnlab.decode.audio import generate_audio
from attnlab.decode.pixels import sample_images
from attnlab.errors import UserError
from attnlab.fileio import check_writable
from attnlab.tasks.image_density import SPLITS, read_images

SEED = 1337
MAX_SECONDS = 60


@dataclass(frozen=True)
class ImageSamples:
    """Images sampled from an image density run, and what they were conditioned on."""

    images: torch.Tensor
    """`(N, H, W)` uint8 on the CPU."""
    label: int | None
    """The class asked for, else the completed image's (a class-conditional model samples it); None:
    neither (the model's own mix of classes)."""
    given: torch.Tensor | None
    """`(H, W)` uint8: the real image whose top `given_rows` rows were kept (None: sampled from nothing)."""
    given_rows: int
    description: str
    """What they are, e.g. "samples" or "completions of the top half of test image 5"."""
    seconds: float
    """Time spent sampling (reading the data and drawing excluded)."""


@dataclass(frozen=True)
class AudioSamples:
    """Sounds sampled from a WaveNet run and the WAV files they were written to."""

    paths: list[Path]
    length: int
    """Samples per sound (at `FSDD_RATE`)."""
    seconds: float
    """Time spent generating (writing excluded)."""

    @property
    def samples_per_second(self) -> float:
        return len(self.paths) * self.length / self.seconds


def _check_condition(name: str, value: int | None, count: int, what: str) -> None:
    """A `UserError` when `value` (None: not given) is not one of the model's `count` choices."""
    if value is None:
        return
    if count == 0:
        raise UserError(f"{name} {value}: this model is not conditioned on the {what}; drop {name}")
    if not 0 <= value < count:
        raise UserError(f"{name} {value} is not a {what} of this model; choose one of 0-{count - 1}")


def _picker(run: Any, temperature: float, seed: int):
    if temperature < 0:
        raise UserError(f"temperature must be >= 0, got {temperature}")
    device = next(run.model.parameters()).device
    return sampling_picker(temperature, generator=torch.Generator(device=device).manual_seed(seed)), device


def require_density_run(run: Any) -> None:
    """A `UserError` unless `run` models images or sounds (an image or audio density run)."""
    if run.config.task == "image-classification":
        raise UserError(
            f"{run.path} is an image classifier ({run.config.model.kind}): it models p(class | image), not "
            "images, so it cannot sample; use `attnlab eval` or `attnlab attention --image`"
        )
    if run.config.task not in ("image-density", "audio-density"):
        raise UserError(f"{run.path} is a {run.config.task!r} run, not an image or audio density run")


def _require_task(run: Any, task: str) -> None:
    require_density_run(run)
    if run.config.task != task:
        images = "an image density run (PixelCNN, Gated PixelCNN, pixel GPT)"
        what = "a WaveNet run" if task == "audio-density" else images
        raise UserError(f"{run.path} is a {run.config.task!r} run; this samples from {what}")


def sample_run_images(
    run: Any,
    n: int = 16,
    *,
    label: int | None = None,
    complete: tuple[str, int] | None = None,
    data_dir: str | None = None,
    temperature: float = 1.0,
    seed: int = SEED,
    progress: bool = False,
) -> ImageSamples:
    """`n` images from an image density run (what `attnlab.load` returns), of class `label` for a
    class-conditional model. `complete=(split, index)`: keep the top half of that image of the
    run's data (read from `data_dir` when given, else the run's data.data_dir) and sample the rest,
    its label the class unless `label` says otherwise. Raises `UserError` for a request the model
    cannot answer (a class it does not have, a classifier run, an image index out of range)."""
    _require_task(run, "image-density")
    if n < 1:
        raise UserError(f"the number of images must be >= 1, got {n}")
    pick, device = _picker(run, temperature, seed)
    config = run.config.model
    _check_condition("--class", label, config.n_classes, "class")
    side = int(config.block_size**0.5) if config.kind == "pixel-gpt" else 28
    given, given_rows, description = None, 0, "samples"
    if complete is not None:
        image, image_label = _image_to_complete(run, complete, data_dir)
        label = image_label if label is None else label
        given, given_rows, side = image, image.shape[0] // 2, image.shape[0]
        description = f"completions of the top half of {complete[0]} image {complete[1]}"
    labels = torch.full((n,), label if label is not None and config.n_classes else 0, dtype=torch.long, device=device)
    start = time.perf_counter()
    images = sample_images(
        run.model,
        labels,
        pick,
        shape=(side, side),
        given=None if given is None else given[None].expand(n, -1, -1).to(device),
        given_rows=given_rows,
        progress=progress,
    ).cpu()
    return ImageSamples(images, label, given, given_rows, description, time.perf_counter() - start)


def _image_to_complete(run: Any, complete: tuple[str, int], data_dir: str | None) -> tuple[torch.Tensor, int]:
    """(split, index) -> (that image `(H, W)` uint8, its label)."""
    split, index = complete
    if split not in SPLITS or index < 0:
        raise UserError(
            f"no image {split}:{index}: the image to complete is SPLIT:INDEX, SPLIT one of {', '.join(SPLITS)}"
        )
    data = run.config.data if not data_dir else dataclasses.replace(run.config.data, data_dir=data_dir)
    images = read_images(data, (split,), "--complete")[split]
    if index >= len(images):
        raise UserError(f"the {split} split has {len(images)} images; {index} is not in 0..{len(images) - 1}")
    return torch.from_numpy(images.images[index]), int(images.labels[index])


def sample_run_audio(
    run: Any,
    out: str | Path,
    n: int = 1,
    *,
    digit: int | None = None,
    speaker: str | None = None,
    seconds: float = 0.5,
    temperature: float = 1.0,
    seed: int = SEED,
    cached: bool = True,
    progress: bool = False,
) -> AudioSamples:
    """`n` sounds of `seconds` from a WaveNet run (what `attnlab.load` returns), saying `digit` in
    the voice of `speaker` where the model is conditioned on them, written as 16-bit WAVs at 8 kHz:
    `out` itself for one, `out`'s stem + `_1.wav`, `_2.wav`, ... for several (`7_wavenet.wav`
    names them as FSDD names its files). `cached=False` reruns the receptive field for every sample
    (the reference; the same samples). The output is checked writable before generating."""
    _require_task(run, "audio-density")
    out = Path(out)
    if out.suffix.lower() != ".wav":
        raise UserError(f"a WaveNet run writes a sound: pass --out FILE.wav (got {out})")
    if n < 1:
        raise UserError(f"the number of sounds must be >= 1, got {n}")
    paths = [out] if n == 1 else [out.with_name(f"{out.stem}_{i + 1}.wav") for i in range(n)]
    check_writable(out)
    pick, device = _picker(run, temperature, seed)
    digits, speakers = _audio_conditions(run.config.model, n, digit, speaker, device)
    if not 0 < seconds <= MAX_SECONDS:
        raise UserError(f"--seconds must be in (0, {MAX_SECONDS}], got {seconds}")
    length = max(1, round(seconds * FSDD_RATE))
    start = time.perf_counter()
    classes = generate_audio(run.model, digits, speakers, length, pick, cached=cached, progress=progress).cpu()
    elapsed = time.perf_counter() - start
    for path, row in zip(paths, classes, strict=True):
        write_wav(path, to_int16(mu_law_decode(row)), FSDD_RATE)
    return AudioSamples(paths, length, elapsed)


def _audio_conditions(
    config: Any, n: int, digit: int | None, speaker: str | None, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The digit and speaker ids `(N,)` a WaveNet is conditioned on (None: it is not)."""
    if config.n_digits and digit is None:
        raise UserError(f"this WaveNet says a digit: pass --digit 0-{config.n_digits - 1}")
    _check_condition("--digit", digit, config.n_digits, "digit")
    speakers = None
    if config.speakers:
        if speaker not in config.speakers:
            raise UserError(f"this WaveNet speaks as one of {', '.join(config.speakers)}: pass --speaker NAME")
        speakers = torch.full((n,), config.speakers.index(speaker), device=device)
    elif speaker is not None:
        raise UserError("--speaker: this WaveNet was not conditioned on the speaker (data.condition_on_speaker)")
    digits = torch.full((n,), digit, device=device) if config.n_digits else None
    return digits, speakers
