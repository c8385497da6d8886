"""The `attnlab` command. Each subcommand parses its arguments and calls a library function that a
user could call from Python too; heavy imports happen inside the subcommand."""

import argparse
import sys

from attnlab import __version__
from attnlab.errors import UserError

SUBCOMMANDS = ("train", "sample", "translate", "eval", "demo")


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


def print_json(obj: object) -> None:
    import json

    print(json.dumps(obj, indent=2, sort_keys=True))
