"""The `attnlab` command. Each subcommand parses its arguments and calls a library function that a
user could call from Python too; heavy imports happen inside the subcommand."""

import argparse
import sys
from pathlib import Path

from attnlab import __version__
from attnlab.errors import UserError

SUBCOMMANDS = (
    "train",
    "sample",
    "translate",
    "classify",
    "tag",
    "embed",
    "eval",
    "demo",
    "bench",
    "attention",
    "positions",
    "plot",
    "report",
    "cost",
    "ablate",
    "scale",
    "serve",
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> ArgumentParser:
    from importlib import import_module

    parser = ArgumentParser(prog="attnlab", description="Train, use and inspect Transformer models.")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name in SUBCOMMANDS:
        import_module(f"attnlab.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for a command that relaunches itself (train --nproc)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args) or 0
    except UserError as e:
        sys.stderr.write(f"attnlab {args.command}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"attnlab {args.command}: interrupted\n")
        return 130


def positive_int(text: str) -> int:
    return _bounded_int(text, 1)


def non_negative_int(text: str) -> int:
    return _bounded_int(text, 0)


def _bounded_int(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def open_task_run(run_dir: str, task_name: str, device: str, checkpoint: str = "best"):
    """A trained run of `task_name` and its task object, loaded for use on new text (no data read)."""
    from attnlab import load
    from attnlab.device import resolve_device
    from attnlab.tasks import open_task

    dev = resolve_device(device)
    run = load(run_dir, device=dev, checkpoint=checkpoint)
    if run.config.task != task_name:
        raise UserError(f"{run_dir} is a {run.config.task!r} run, not a {task_name} model")
    return run, open_task(run), dev


def add_text_arguments(p: argparse.ArgumentParser, task_name: str) -> None:
    """The arguments of the commands that apply a trained encoder run to sentences."""
    p.add_argument("run_dir", metavar="RUN", help=f"a {task_name} run folder written by `attnlab train`")
    p.add_argument("text", nargs="*", metavar="TEXT", help="sentences, one per argument")
    p.add_argument("--input", help="a UTF-8 file with one sentence per line (- for stdin)")
    p.add_argument("--checkpoint", choices=["best", "last"], default="best", help="which weights (default best)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")


def read_text_arguments(texts: list[str], input_path: str | Path | None, verb: str) -> list[str]:
    """Sentences from TEXT arguments or an --input file (`-` = stdin), one per line; `verb` says
    what the command would do with them, for the error when there are none."""
    from attnlab.data.parallel import read_lines
    from attnlab.fileio import decode_utf8

    if input_path is not None and texts:
        raise UserError("give sentences as TEXT arguments or with --input, not both")
    if input_path is None and not texts:
        raise UserError(f"no text given: nothing to {verb}; pass TEXT arguments or --input FILE")
    if input_path is None:
        return list(texts)
    if str(input_path) == "-":
        return decode_utf8(sys.stdin.buffer.read(), "stdin").splitlines()
    return read_lines(input_path)


def print_json(obj: object) -> None:
    import json

    print(json.dumps(obj, indent=2, sort_keys=True))
