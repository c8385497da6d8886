"""The families' table (`attnlab.families`) is the one place that lists them: every help text and
message that names the families is written from it, and the importers cover exactly its rows.

A text "written from the table" is told from a hand-written one by building the parser over a table
whose families have other names: a help text that still names two of the real ones lists them by
hand. The strings of the source (not the docstrings, which may compare families in prose) are read
with `ast`, nothing imported."""

import argparse
import ast
import dataclasses
import re
from pathlib import Path

import pytest

from attnlab import families

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"
NAMES = [f.name for f in families.FAMILIES]


def named(text: str) -> list[str]:
    """The families of the table that `text` names, as whole words: "GPT-2, Llama" -> ["GPT-2", "Llama"]."""
    return [n for n in NAMES if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]


def test_named_finds_whole_names_only():
    assert named("a GPT-2 or Llama folder") == ["GPT-2", "Llama"]
    assert named("BertForMaskedLM, a Llama-shaped GPT, Qwen25") == []


def renamed(family: families.Family, i: int) -> families.Family:
    return dataclasses.replace(family, name=f"Family{i}")


def help_texts(parser: argparse.ArgumentParser) -> dict[str, str]:
    """`attnlab COMMAND --help` of every subcommand, by command."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p.format_help() for name, p in sub.choices.items()}


def test_no_help_text_lists_families_by_hand(monkeypatch):
    from attnlab.cli import build_parser

    monkeypatch.setattr(families, "FAMILIES", tuple(renamed(f, i) for i, f in enumerate(families.FAMILIES)))
    texts = help_texts(build_parser())
    assert "Family0" in texts["sample"]  # the control: the parser is written from the table
    by_hand = {command: named(text) for command, text in texts.items() if len(named(text)) >= 2}
    assert not by_hand, f"help texts naming families by hand (write them with attnlab.families.names): {by_hand}"


def strings(path: Path) -> list[str]:
    """The string literals of a module that are values, not docstrings (a string statement)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    constants = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [n.value for n in constants if id(n) not in docs]


def by_hand_strings() -> dict[tuple[str, str], list[str]]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "families.py":
            continue
        for text in strings(path):
            if len(named(text)) >= 2:
                found[(path.relative_to(SRC).as_posix(), text[:40])] = named(text)
    return found


def test_no_message_lists_families_by_hand():
    by_hand = by_hand_strings()
    assert not by_hand, f"strings naming families by hand (write them with attnlab.families.names): {by_hand}"


def test_the_string_scan_sees_f_strings_and_skips_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""GPT-2 and Llama."""\nx = f"{y} a GPT-2 or Llama folder"\n"""BERT, RoBERTa."""\n')
    assert [named(s) for s in strings(module)] == [["GPT-2", "Llama"]]


@pytest.mark.parametrize(
    "kind, table", [(families.CAUSAL_LM, "CAUSAL_LM_LOADERS"), (families.ENCODER, "ENCODER_LOADERS")]
)
def test_the_importers_cover_exactly_the_table(kind, table):
    from attnlab.models.hf import auto

    assert sorted(getattr(auto, table)) == families.model_types(kind)
