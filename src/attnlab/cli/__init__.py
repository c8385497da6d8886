"""The `attnlab` command. Each subcommand parses its arguments and calls a library function that a
user could call from Python too; heavy imports happen inside the subcommand."""

import argparse
import difflib
import re
import sys
from pathlib import Path

from attnlab import __version__
from attnlab.errors import ConfigError, UserError

SUBCOMMANDS = (
    "train",
    "sample",
    "chat",
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
    "data",
    "kernels",
    "export",
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit code 2, with a "did you mean"
    for a mistyped subcommand, choice or option."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if m := re.match(r"argument .*: invalid choice: '(.*?)' \(choose from (.*)\)$", message):
            message += _did_you_mean(m[1], re.findall(r"'([^']*)'", m[2]))
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # argparse reports unknown options from the top-level parser, which does not know the
        # subcommand's options; the subcommand's parser says it, with its close matches.
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._chosen_subparser(namespace)
            options = [o for action in parser._actions for o in action.option_strings]
            unknown = next((e.partition("=")[0] for e in extras if e.startswith("-")), extras[0])
            parser.error(f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(unknown, options)}")
        return namespace

    def _chosen_subparser(self, namespace: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(getattr(namespace, action.dest, None), self)
        return self


def _did_you_mean(word: str, choices: list[str]) -> str:
    """' (did you mean 'sample'?)' for a close match among `choices`, else ''."""
    # 0.7, not difflib's 0.6: at 0.6 every short option sharing the "--" prefix and a letter or
    # two comes along ('--promt' suggested '--out' beside '--prompt').
    matches = difflib.get_close_matches(word, choices, n=3, cutoff=0.7)
    return f" (did you mean {', '.join(repr(m) for m in matches)}?)" if matches else ""


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
        check_before_imports(args)
        return args.run(args) or 0
    except UserError as e:
        sys.stderr.write(f"attnlab {args.command}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"attnlab {args.command}: interrupted\n")
        return 130


def check_before_imports(args: argparse.Namespace) -> None:
    """The argument mistakes found before a subcommand imports PyTorch (seconds), so that they cost
    none: a checkpoint path (`run_dir`, embed's `source`) that the subcommand cannot take
    (`attnlab.sources.refuse`: missing, a file or folder of another kind, a family it does not
    take), and what the subcommand's own `check` (registered beside its `run`) finds. The
    subcommand checks the rest, after its imports."""
    from attnlab.sources import refuse

    for name in ("run_dir", "source"):
        if getattr(args, name, None) is not None:
            refuse(getattr(args, name), args.command)
    check = getattr(args, "check", None)
    if check is not None:
        check(args)


def check_overrides(overrides: list[str]) -> None:
    """`--set` values in key=value form under the config's sections, and a task named by a name it
    has (today's or an old one), checked before PyTorch is imported; the other keys and values are
    checked against the config dataclasses when the subcommand resolves the config."""
    from attnlab.config import check_run_keys, parse_overrides
    from attnlab.names import check_section_keys, task_name

    for item in overrides:
        doc = parse_overrides([item])
        try:
            check_run_keys(doc)
            check_section_keys(doc)
        except ConfigError as e:
            raise ConfigError(f"--set {item}: {e} (a key is SECTION.NAME, e.g. train.max_iters=500)") from None
        if "task" in doc:
            try:
                task_name(doc["task"])
            except ConfigError as e:
                raise ConfigError(f"--set {item}: {e}") from None


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


def open_task_run(run_dir: str, task_name: str, device: str = "auto", checkpoint: str | int = "best"):
    """A trained run of `task_name` and its task object, loaded for use on new text (no data read)."""
    from attnlab import load
    from attnlab.cli.kinds import require_kind
    from attnlab.device import resolve_device
    from attnlab.tasks import open_task

    dev = resolve_device(device)
    run = load(run_dir, device=dev, checkpoint=checkpoint)
    require_kind(
        run_dir,
        run.config,
        {"text-classification": "classify", "token-classification": "tag"}.get(task_name, task_name),
    )
    return run, open_task(run), dev


def add_text_arguments(p: argparse.ArgumentParser, task_name: str) -> None:
    """The arguments of the commands that apply a trained encoder run to sentences."""
    from attnlab.cli.arguments import add_checkpoint_argument, add_device_argument

    p.add_argument("run_dir", metavar="RUN", help=f"a {task_name} run folder written by `attnlab train`")
    p.add_argument("text", nargs="*", metavar="TEXT", help="sentences, one per argument")
    p.add_argument("--input", help="a UTF-8 file with one sentence per line (- for stdin)")
    add_checkpoint_argument(p)
    add_device_argument(p)


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
