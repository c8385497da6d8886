"""The options many subcommands share are declared once, in `attnlab.cli.arguments`: no subcommand
module declares them itself, and every parser that has one has the same default and help."""

import argparse
import ast
import re
from pathlib import Path

import pytest

from attnlab.cli import SUBCOMMANDS, build_parser
from attnlab.cli.arguments import split_index

CLI = Path(__file__).resolve().parents[2] / "src" / "attnlab" / "cli"
SHARED = ("--device", "--checkpoint", "--json", "--seed", "--data-dir")


def declared_options(source: str) -> list[tuple[str, int]]:
    """(option, line) for every `*.add_argument("--x", ...)` call in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            found += [(a.value, node.lineno) for a in node.args if isinstance(a, ast.Constant)]
    return found


def test_the_check_sees_a_declaration_in_any_form():
    source = 'p.add_argument("--device", default="cpu")\ng.add_argument(\n    "-s", "--seed", type=int)\n'
    assert declared_options(source) == [("--device", 1), ("-s", 2), ("--seed", 2)]


def test_no_subcommand_declares_a_shared_option_itself():
    found = [
        f"{path.name}:{line} declares {option}; use attnlab.cli.arguments' add_{option[2:].replace('-', '_')}_argument"
        for path in sorted(CLI.glob("*.py"))
        if path.name != "arguments.py"
        for option, line in declared_options(path.read_text(encoding="utf-8"))
        if option in SHARED
    ]
    assert not found, "\n".join(found)


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def template(option: str, help: str) -> str:
    """The help without what --json prints or when --data-dir is read (each command says its own)."""
    if option == "--json":
        return re.sub(r"^print .+ as JSON", "print WHAT as JSON", help)
    return help.split(";")[0] if option == "--data-dir" else help


@pytest.mark.parametrize("option", SHARED)
def test_a_shared_option_means_the_same_in_every_subcommand(option):
    seen = {}
    for name, parser in subparsers().items():
        for action in parser._actions:
            if option in action.option_strings:
                seen[name] = (action.default, action.type, template(option, action.help))
    assert len(seen) >= 2, seen
    # --device has two forms: "auto" for the commands that use a run, and the config's train.device
    # (None) for the commands that train.
    assert len(set(seen.values())) <= (2 if option == "--device" else 1), seen


def test_device_defaults_to_auto_wherever_no_config_says_otherwise():
    defaults = {
        name: action.default
        for name, parser in subparsers().items()
        for action in parser._actions
        if "--device" in action.option_strings
    }
    training = {name for name, default in defaults.items() if default is None}
    assert training == {"train", "ablate", "scale"}, defaults
    assert {defaults[name] for name in set(defaults) - training} == {"auto"}
    assert {"sample", "eval", "translate", "serve", "bench"} <= set(defaults)
    assert set(defaults) <= set(SUBCOMMANDS)


def test_split_index_reads_split_and_index():
    assert split_index("test:5") == ("test", 5)
    for bad in ("test5", "test:", ":5", "test:-1", "test:five"):
        with pytest.raises(argparse.ArgumentTypeError, match="SPLIT:INDEX"):
            split_index(bad)
