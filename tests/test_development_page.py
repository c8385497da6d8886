"""docs/development.md, the project's design page, names only what exists: every module or folder
path it quotes (`accel/fused.py`, `serve/`, `tests/accel/test_fused.py`) is a file or folder of the
repository or of src/attnlab, and every dotted name (`attnlab.accel.fused.by_default`) imports."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "development.md"
PACKAGE = ROOT / "src" / "attnlab"

QUOTED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*(/|\.py|\.cpp|\.h|\.toml|\.md)$")
DOTTED = re.compile(r"^attnlab(\.\w+)+")


def quoted() -> list[str]:
    return QUOTED.findall(PAGE.read_text())


def paths() -> list[str]:
    return sorted({q for q in quoted() if "/" in q and PATH.match(q) and not q.startswith(("..", "."))})


def dotted() -> list[str]:
    return sorted({m[0] for q in quoted() if (m := DOTTED.match(q))})


def resolve(name: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


def test_the_page_quotes_paths_and_names_at_all():
    # The patterns must keep finding what the page quotes, or the checks below pass on nothing.
    assert len(paths()) >= 10 and len(dotted()) >= 3


@pytest.mark.parametrize("path", paths())
def test_every_quoted_path_exists(path):
    where = [ROOT / path, PACKAGE / path, ROOT / "src" / path]
    assert any(p.exists() for p in where), (
        f"docs/development.md quotes `{path}`, which is neither under the repository nor src/attnlab"
    )


@pytest.mark.parametrize("name", dotted())
def test_every_dotted_name_imports(name):
    try:
        resolve(name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"docs/development.md quotes `{name}`, which does not import: {e}")
