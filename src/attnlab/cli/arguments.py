"""The options many subcommands share, declared once: one default and one help text each, so that
`--device` means the same in `sample` as in `eval`. A subcommand adds them with these functions and
never declares them itself (tests/cli/test_arguments.py checks it).

Nothing here imports PyTorch: the parsers are built before a mistake is reported, in well under a
second."""

import argparse

DEVICE_CHOICES = "cpu, cuda, cuda:N, or auto: cuda when available, else cpu"
SEED = 1337


def add_device_argument(p: argparse.ArgumentParser, *, sets_config: bool = False) -> None:
    """--device, resolved by `attnlab.device.resolve_device`. `sets_config`: the command trains, so
    the option overrides the config's train.device, and leaving it out keeps the config's (auto
    unless the config says otherwise) rather than forcing "auto" over it."""
    if sets_config:
        p.add_argument("--device", help=f"{DEVICE_CHOICES}; sets train.device (default: the config's, auto unless set)")
    else:
        p.add_argument("--device", default="auto", help=f"{DEVICE_CHOICES} (default auto)")


def checkpoint_choice(text: str) -> str | int:
    """--checkpoint's value: "best", "last" or a step number ("1500" -> 1500)."""
    from attnlab.cli import _did_you_mean

    if text in ("best", "last"):
        return text
    if text.isascii() and text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(
        f"expected best, last or a step number (e.g. 1500), got {text!r}{_did_you_mean(text, ['best', 'last'])}"
    )


def add_checkpoint_argument(p: argparse.ArgumentParser) -> None:
    """--checkpoint, as every command that loads a run's weights takes it."""
    p.add_argument(
        "--checkpoint",
        type=checkpoint_choice,
        default="best",
        metavar="best|last|STEP",
        help="which weights: best, last, or the checkpoint of a step, e.g. 1500 (default best)",
    )


def add_json_argument(p: argparse.ArgumentParser, what: str = "the result") -> None:
    """--json: the command prints `what` (e.g. '{"samples": [...]}') as JSON instead of text."""
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON instead of text")


def add_seed_argument(p: argparse.ArgumentParser) -> None:
    """--seed of the sampling generator: the same seed, the same samples on the same device."""
    p.add_argument("--seed", type=int, default=SEED, help=f"random seed of the sampling (default {SEED})")


def add_data_dir_argument(p: argparse.ArgumentParser, use: str = "") -> None:
    """--data-dir, which sets data.data_dir (a run's, or every run's); `use` says when the command
    reads data at all, e.g. "with --complete: the image to complete"."""
    help = "the folder of the data files, instead of the config's data.data_dir"
    p.add_argument("--data-dir", metavar="DIR", help=f"{help}; {use}" if use else help)


def split_index(text: str) -> tuple[str, int]:
    """An argparse type: "SPLIT:INDEX" -> (split, index), e.g. "test:5" -> ("test", 5). Which
    splits exist is the task's to say, once the run is loaded."""
    split, sep, index = text.partition(":")
    if not sep or not split or not (index.isascii() and index.isdigit()):
        raise argparse.ArgumentTypeError(f"expected SPLIT:INDEX, e.g. test:5, got {text!r}")
    return split, int(index)


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """--backend and --address: where a sweep's runs train (`attnlab.studies.backends.make_backend`)."""
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        metavar="local|ray",
        help="where the runs train: local (this machine, default) or ray (a Ray cluster: every run a task, "
        "retried from its last checkpoint where its worker dies; needs the ray extra and folders every "
        "machine sees at the same path)",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="with --backend ray: the cluster's head, e.g. 10.0.0.1:6379 (`ray start --head` prints it) or auto; "
        "default: a new Ray instance on this machine",
    )


WEIGHTS = ("fp32", "bf16", "int8", "int4", "q4_k")
"""--weights' choices: `attnlab.accel.fused.WEIGHT_FORMATS`, repeated here so that parsing imports no
PyTorch (tests/accel/test_fused_int8.py checks that the two agree)."""


def add_weights_argument(p: argparse.ArgumentParser, *, by_checkpoint: bool = True) -> None:
    """--weights: how the fused decoding step stores the products' weights (fp32, bf16, int8, int4
    or q4_k). by_checkpoint: left out, it is None, for `decoding_weights` to take the checkpoint's own
    format (a Q8_0 GGUF's int8, a Q4_0 GGUF's int4, a Q4_K_M GGUF's q4_k); False: fp32."""
    default = (
        "int8, int4 or q4_k for a GGUF file whose weight matrices are all Q8_0, all Q4_0 or all Q4_K and Q6_K (its "
        "own blocks) where the fused step covers the model, fp32 elsewhere"
        if by_checkpoint
        else "fp32"
    )
    p.add_argument(
        "--weights",
        choices=WEIGHTS,
        default=None if by_checkpoint else "fp32",
        help="the decoding step's weights: fp32; bf16 (rounded to 16 bits), int8 (blocks of 32 "
        "values with one fp32 scale each, as GGUF's q8_0; activations in fp32) or int4 (GGUF's Q4_0: blocks of 32 "
        "four-bit values and one scale, any width a multiple of 32; up to 15 rows the activations are quantized "
        "to int8 blocks as llama.cpp's are) or q4_k (llama.cpp's Q4_K_M mix of GGUF's Q4_K and Q6_K super-blocks "
        "of 256 values, any width a multiple of 256), read by the fused step (built first if need be); a model the "
        f"fused step does not cover decodes with fp32 weights, saying so (default: {default})",
    )


def check_weights_options(args: argparse.Namespace) -> None:
    """--weights bf16, int8, int4 or q4_k need the fused step: refused beside --no-fused or --compile."""
    from attnlab.errors import UserError

    if args.weights in (None, "fp32"):  # None: not given (`decoding_weights` picks)
        return
    if args.fused is False or getattr(args, "compile", False):
        what = "--no-fused" if args.fused is False else "--compile"
        raise UserError(f"--weights {args.weights} is read by the fused decoding step; leave out {what}")


def decoding_weights(model, weights: str | None, command: str, stored: str | None = None, fused: bool = True) -> str:
    """`weights` where the fused step covers `model`; else "fp32", after one line on stderr saying
    why and what runs instead (`attnlab.accel.fused.weights_refusal`). `command` begins the line
    ("sample", or "serve: NAME" for one of several models). weights None (--weights not given):
    `stored`, the checkpoint's own format (`attnlab.tasks.sources.Loaded.stored_weights`), where
    `fused` (the fused step not turned off) and the step covers the model; else fp32, silently."""
    import sys

    from attnlab.accel.fused import weights_refusal
    from attnlab.tasks.sources import default_weights

    if weights is None:
        return default_weights(model, stored, fused=fused)
    refusal = weights_refusal(model, weights)
    if refusal is None:
        return weights
    sys.stderr.write(f"attnlab {command}: {refusal}\n")
    return "fp32"
