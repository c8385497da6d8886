"""`attnlab sample` for image density runs (a PNG grid of samples or completions) and WaveNet runs
(a WAV file): the arguments checked, then the library's samplers (`attnlab.decode.pixels`,
`attnlab.decode.audio`) and writers (`attnlab.viz.images`, `attnlab.data.audio`)."""

import argparse
import sys
import time
from typing import Any

import torch

from attnlab.errors import UserError
from attnlab.fileio import check_writable

LM_FLAGS = {"--top-k": "top_k", "--top-p": "top_p", "--stop": "stop", "--stream": "stream", "--compile": "compile"}


def sample_media(args: argparse.Namespace, run: Any, device: torch.device) -> int:
    """Dispatch on the run's task; a classifier cannot sample."""
    task = run.config.task
    if task == "image-classification":
        raise UserError(
            f"{args.run_dir} is an image classifier ({run.config.model.kind}): it models p(class | image), not "
            "images, so it cannot sample; use `attnlab eval` or `attnlab attention --image`"
        )
    used = [flag for flag, name in LM_FLAGS.items() if getattr(args, name)] + (["--prompt"] if args.prompt else [])
    used += ["--fused"] if args.fused else []
    if used:
        raise UserError(f"{', '.join(used)} go with language models; {args.run_dir} is an {task!r} run")
    temperature = 1.0 if args.temperature is None else args.temperature
    if temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {temperature}")
    if task == "images":
        return _images(args, run, device, temperature)
    return _audio(args, run, device, temperature)


def _picker(temperature: float, seed: int, device: torch.device):
    from attnlab.decode import sampling_picker

    return sampling_picker(temperature, generator=torch.Generator(device=device).manual_seed(seed))


def _progress(args: argparse.Namespace) -> bool:
    return not args.json and sys.stderr.isatty()


def _images(args: argparse.Namespace, run: Any, device: torch.device, temperature: float) -> int:
    from attnlab.decode.pixels import sample_images
    from attnlab.viz.figure import check_png_path
    from attnlab.viz.images import plot_image_grid

    for flag in ("digit", "speaker"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag} goes with WaveNet runs; {args.run_dir} samples images (use --class)")
    if args.naive:
        raise UserError("--naive goes with WaveNet runs")
    if args.out is None:
        raise UserError("image runs write a picture: pass --out FILE.png")
    path = check_png_path(args.out)
    check_writable(path)
    n_classes = run.config.model.n_classes
    check_choice("--class", args.label, n_classes, "class")
    if args.data_dir and not args.complete:
        raise UserError("--data-dir goes with --complete (the image to complete)")
    n = args.num_samples or 16
    side = int(run.config.model.block_size**0.5) if run.config.model.kind == "gpt" else 28
    given, given_rows, label, what = None, 0, args.label, "samples"
    if args.complete:
        image, image_label, split, index = _image_to_complete(args, run)
        label = image_label if label is None else label
        given, given_rows, side = image[None].expand(n, -1, -1), image.shape[0] // 2, image.shape[0]
        what = f"completions of the top half of {split} image {index}"
    labels = torch.full((n,), label if label is not None and n_classes else 0, dtype=torch.long, device=device)
    start = time.perf_counter()
    images = sample_images(
        run.model,
        labels,
        _picker(temperature, args.seed, device),
        shape=(side, side),
        given=None if given is None else given.to(device),
        given_rows=given_rows,
        progress=_progress(args),
    ).cpu()
    seconds = time.perf_counter() - start
    shown = images.numpy()
    titles = None
    if given is not None:
        occluded = given[0].clone()
        occluded[given_rows:] = 0
        shown = torch.cat([given[:1], occluded[None], images]).numpy()
        titles = ["original", "given"] + [f"sample {i + 1}" for i in range(n)]
    title = f"{run.config.model.kind}: {what}" + (f", class {label}" if label is not None and n_classes else "")
    plot_image_grid(shown, path, titles=titles, title=title)
    summary = {"out": str(path), "images": n, "class": label, "seconds": round(seconds, 2), "kind": what}
    return _report(args, summary, f"{n} {what} in {seconds:.1f} s saved to {path}")


def _image_to_complete(args: argparse.Namespace, run: Any) -> tuple[torch.Tensor, int, str, int]:
    """--complete SPLIT:INDEX -> (image `(H, W)`, its label, split, index)."""
    import dataclasses

    from attnlab.tasks.images import SPLITS, read_images

    split, sep, index_text = args.complete.partition(":")
    if not sep or split not in SPLITS or not index_text.isdigit():
        raise UserError(f"--complete takes SPLIT:INDEX with SPLIT one of {', '.join(SPLITS)}, got {args.complete!r}")
    data = run.config.data
    if args.data_dir:
        data = dataclasses.replace(data, data_dir=args.data_dir)
    images = read_images(data, (split,), "--complete")[split]
    index = int(index_text)
    if index >= len(images):
        raise UserError(f"the {split} split has {len(images)} images; {index} is not in 0..{len(images) - 1}")
    return torch.from_numpy(images.images[index]), int(images.labels[index]), split, index


def _audio(args: argparse.Namespace, run: Any, device: torch.device, temperature: float) -> int:
    from attnlab.data.audio import FSDD_RATE, mu_law_decode, to_int16, write_wav
    from attnlab.decode.audio import generate_audio

    for flag, value in (
        ("--class", args.label is not None),
        ("--complete", args.complete),
        ("--data-dir", args.data_dir),
    ):
        if value:
            raise UserError(f"{flag} goes with image runs; {args.run_dir} is a WaveNet run (use --digit)")
    config = run.config.model
    if args.out is None or args.out.suffix.lower() != ".wav":
        raise UserError(f"a WaveNet run writes a sound: pass --out FILE.wav (got {args.out})")
    n = args.num_samples or 1
    # FILE_1.wav, FILE_2.wav, ...: --out 7_wavenet.wav names them as FSDD does (digit_speaker_index).
    paths = [args.out] if n == 1 else [args.out.with_name(f"{args.out.stem}_{i + 1}.wav") for i in range(n)]
    check_writable(args.out)
    if config.n_digits and args.digit is None:
        raise UserError(f"this WaveNet says a digit: pass --digit 0-{config.n_digits - 1}")
    check_choice("--digit", args.digit, config.n_digits, "digit")
    speakers = None
    if config.speakers:
        if args.speaker not in config.speakers:
            raise UserError(f"this WaveNet speaks as one of {', '.join(config.speakers)}: pass --speaker NAME")
        speakers = torch.full((n,), config.speakers.index(args.speaker), device=device)
    elif args.speaker is not None:
        raise UserError("--speaker: this WaveNet was not conditioned on the speaker (data.condition_on_speaker)")
    if not 0 < args.seconds <= 60:
        raise UserError(f"--seconds must be in (0, 60], got {args.seconds}")
    length = max(1, round(args.seconds * FSDD_RATE))
    digits = torch.full((n,), args.digit, device=device) if config.n_digits else None
    start = time.perf_counter()
    classes = generate_audio(
        run.model,
        digits,
        speakers,
        length,
        _picker(temperature, args.seed, device),
        cached=not args.naive,
        progress=_progress(args),
    ).cpu()
    seconds = time.perf_counter() - start
    for path, row in zip(paths, classes, strict=True):
        write_wav(path, to_int16(mu_law_decode(row)), FSDD_RATE)
    rate = n * length / seconds
    how = "naive" if args.naive else "cached"
    summary = {
        "out": [str(p) for p in paths],
        "digit": args.digit,
        "speaker": args.speaker,
        "samples": length,
        "seconds": round(seconds, 3),
        "samples_per_sec": round(rate, 1),
        "generation": how,
    }
    shown = ", ".join(str(p) for p in paths)
    return _report(
        args,
        summary,
        f"{n} x {length} samples of digit {args.digit} in {seconds:.1f} s ({rate:,.0f} samples/s, {how}): {shown}",
    )


def check_choice(flag: str, value: int | None, count: int, what: str) -> None:
    """A `UserError` when `value` (None: not given) is not one of the model's `count` choices."""
    if value is None:
        return
    if count == 0:
        raise UserError(f"{flag} {value}: this model is not conditioned on the {what}; drop {flag}")
    if not 0 <= value < count:
        raise UserError(f"{flag} {value} is not a {what} of this model; choose one of 0-{count - 1}")


def _report(args: argparse.Namespace, summary: dict[str, Any], line: str) -> int:
    if args.json:
        from attnlab.cli import print_json

        print_json(summary)
    else:
        print(line)
    return 0
