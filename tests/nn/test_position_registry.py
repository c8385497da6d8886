"""The position schemes are listed once (`attnlab.names.POSITION_SCHEMES`, where the command line
reads them before PyTorch is imported): `attnlab.nn.positions`' classes cover exactly that list,
each where the list says it acts; `attnlab positions` takes and draws exactly its drawn schemes;
nn/variants.py reads the registry; and no second list of scheme names is written by hand.

The source is read with `ast`: a tuple, list, set or dict whose string items name three schemes or
more is a hand-written list of schemes."""

import argparse
import ast
from pathlib import Path

import pytest

from attnlab.cli import build_parser
from attnlab.names import DRAWN_SCHEMES, POSITION_SCHEMES
from attnlab.nn import positions, variants
from attnlab.viz import positions as viz_positions

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"
# The list, and code keyed by its names (the classes, the pictures), checked against it above.
REGISTRY = ("names.py", "nn/positions.py", "viz/positions.py")
KNOWN = {
    "models/bert.py": "BertConfig's check of the schemes at the input (issue 59 item 7 leaves it)",
}
"""Modules that keep a hand-written list of schemes, each a debt: a new one fails the test."""


def test_the_classes_cover_exactly_the_list_each_where_it_acts():
    inside = [n for n, s in POSITION_SCHEMES.items() if s.inside_attention]
    at_input = [n for n, s in POSITION_SCHEMES.items() if not s.inside_attention]
    assert list(positions.ATTENTION_POSITIONS) == inside
    assert list(positions.INPUT_POSITIONS) == at_input
    assert positions.POSITIONS == tuple(POSITION_SCHEMES)
    assert variants.INSIDE_ATTENTION == tuple(inside)


def test_the_schemes_on_the_scores_are_alibi_and_relative():
    """Written out here: RoPE rotates q and k, which Linformer's projection keeps; ALiBi and Shaw et
    al.'s vectors are terms on each score by its key's offset, which the projection loses."""
    assert variants.ON_THE_SCORES == ("alibi", "relative")


def test_positions_draws_exactly_the_drawn_schemes(tmp_path):
    assert set(viz_positions.PANELS) | {"sinusoidal"} == set(DRAWN_SCHEMES)
    assert viz_positions.SCHEMES_DRAWN == DRAWN_SCHEMES
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    kind_help = next(a.help for a in sub.choices["positions"]._actions if a.dest == "kind")
    assert kind_help == f"one of {', '.join(DRAWN_SCHEMES)} (default sinusoidal)"
    for kind in DRAWN_SCHEMES:
        drawn = viz_positions.draw_positions(kind, tmp_path / f"{kind}.png", d_model=8, n_positions=8)
        assert drawn.path.is_file()
    for kind in set(POSITION_SCHEMES) - set(DRAWN_SCHEMES):
        with pytest.raises(Exception, match="unknown --kind"):
            viz_positions.draw_positions(kind, tmp_path / f"{kind}.png")


def string_items(node: ast.AST) -> list[str]:
    items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def lists_of_schemes(path: Path) -> list[int]:
    """The lines of `path` where a literal names three schemes or more."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict)
        and len(set(string_items(node)) & set(POSITION_SCHEMES)) >= 3
    ]


def test_the_scan_finds_a_list_of_schemes(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('A = ("rope", "alibi", "relative")\nB = {"rope": 1, "alibi": 2}\n')
    assert lists_of_schemes(source) == [1]


def test_no_second_list_of_schemes_is_written_by_hand():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where not in REGISTRY and where not in KNOWN and (lines := lists_of_schemes(path)):
            found[where] = lines
    assert not found, f"hand-written lists of position schemes (read attnlab.names.POSITION_SCHEMES): {found}"
    for where in KNOWN:  # a debt paid is taken off the list
        assert lists_of_schemes(SRC / where), f"{where} no longer lists schemes: drop it from KNOWN"
