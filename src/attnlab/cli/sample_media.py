"""`attnlab sample` for image density runs and WaveNet runs: the flags checked against the kind of
run, then one library call, printed. Image runs call `attnlab.viz.sample_image_grid(run, out, ...)`
(a PNG grid of samples or completions), WaveNet runs `attnlab.tasks.media.sample_run_audio(run,
out, ...)` (WAV files); from Python, `attnlab.tasks.media.sample_run_images` returns the images."""

import argparse
import sys
from typing import Any

from attnlab.errors import UserError

LM_FLAGS = {"--top-k": "top_k", "--top-p": "top_p", "--stop": "stop", "--stream": "stream", "--compile": "compile"}


def sample_media(args: argparse.Namespace, run: Any) -> int:
    """Refuse the language-model flags, then sample images or sounds as the run's task says."""
    from attnlab.tasks.media import require_density_run

    require_density_run(run)
    used = [flag for flag, name in LM_FLAGS.items() if getattr(args, name)] + (["--prompt"] if args.prompt else [])
    used += ["--fused"] if args.fused else []
    if used:
        raise UserError(f"{', '.join(used)} go with language models; {args.run_dir} is an {run.config.task!r} run")
    temperature = 1.0 if args.temperature is None else args.temperature
    progress = not args.json and sys.stderr.isatty()
    if run.config.task == "audio":
        return _audio(args, run, temperature, progress)
    return _images(args, run, temperature, progress)


def _images(args: argparse.Namespace, run: Any, temperature: float, progress: bool) -> int:
    from attnlab.viz.images import sample_image_grid

    for flag in ("digit", "speaker"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag} goes with WaveNet runs; {args.run_dir} samples images (use --class)")
    if args.naive:
        raise UserError("--naive goes with WaveNet runs")
    if args.out is None:
        raise UserError("image runs write a picture: pass --out FILE.png")
    if args.data_dir and not args.complete:
        raise UserError("--data-dir goes with --complete (the image to complete)")
    n = args.num_samples or 16
    samples = sample_image_grid(
        run,
        args.out,
        n,
        label=args.label,
        complete=args.complete,
        data_dir=args.data_dir,
        temperature=temperature,
        seed=args.seed,
        progress=progress,
    )
    what, seconds = samples.description, samples.seconds
    summary = {"out": str(args.out), "images": n, "class": samples.label, "seconds": round(seconds, 2), "kind": what}
    return _report(args, summary, f"{n} {what} in {seconds:.1f} s saved to {args.out}")


def _audio(args: argparse.Namespace, run: Any, temperature: float, progress: bool) -> int:
    from attnlab.tasks.media import sample_run_audio

    image_flags = {"--class": args.label is not None, "--complete": args.complete, "--data-dir": args.data_dir}
    for flag, value in image_flags.items():
        if value:
            raise UserError(f"{flag} goes with image runs; {args.run_dir} is a WaveNet run (use --digit)")
    if args.out is None:
        raise UserError("a WaveNet run writes a sound: pass --out FILE.wav")
    sounds = sample_run_audio(
        run,
        args.out,
        args.num_samples or 1,
        digit=args.digit,
        speaker=args.speaker,
        seconds=args.seconds,
        temperature=temperature,
        seed=args.seed,
        cached=not args.naive,
        progress=progress,
    )
    how = "naive" if args.naive else "cached"
    summary = {
        "out": [str(p) for p in sounds.paths],
        "digit": args.digit,
        "speaker": args.speaker,
        "samples": sounds.length,
        "seconds": round(sounds.seconds, 3),
        "samples_per_sec": round(sounds.samples_per_second, 1),
        "generation": how,
    }
    line = (
        f"{len(sounds.paths)} x {sounds.length} samples of digit {args.digit} in {sounds.seconds:.1f} s "
        f"({sounds.samples_per_second:,.0f} samples/s, {how}): {', '.join(str(p) for p in sounds.paths)}"
    )
    return _report(args, summary, line)


def _report(args: argparse.Namespace, summary: dict[str, Any], line: str) -> int:
    if args.json:
        from attnlab.cli import print_json

        print_json(summary)
    else:
        print(line)
    return 0
