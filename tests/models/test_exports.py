"""Every model family is importable from `attnlab.models` and documented in the API reference.

A family is found the way a run folder uses it: a `torch.nn.Module` class under
src/attnlab/models/ (its top level: models/hf/ holds converters, not families) that keeps its
config dataclass as `self.config`. Its config class is the annotation of `__init__`'s `config`.
"""

import ast
import re
from importlib import import_module
from pathlib import Path

import pytest

import attnlab.models

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "src" / "attnlab" / "models"
API_PAGE = ROOT / "docs" / "reference" / "api" / "models.md"


def _is_module_subclass(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base) in ("nn.Module", "torch.nn.Module", "Module") for base in node.bases)


def _keeps_config(init: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Attribute) and ast.unparse(node) == "self.config" and isinstance(node.ctx, ast.Store)
        for node in ast.walk(init)
    )


def _config_annotation(init: ast.FunctionDef) -> str:
    (arg,) = [a for a in init.args.args if a.arg == "config"]
    text = ast.unparse(arg.annotation)
    return text.strip("'\"")


def families() -> list[tuple[str, str, str]]:
    """(module, class, config class) of every family, read from the source."""
    found = []
    for path in sorted(MODELS.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef) or not _is_module_subclass(node):
                continue
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is not None and _keeps_config(init):
                found.append((f"attnlab.models.{path.stem}", node.name, _config_annotation(init)))
    return found


FAMILIES = families()


def test_the_families_are_found():
    """The scan finds the families the issue names, so that an empty scan cannot pass the tests below."""
    names = {name for _, name, _ in FAMILIES}
    assert names >= {"GPT", "ViT", "PixelCNN", "GatedPixelCNN", "WaveNet", "GAT", "GCN", "NodeTransformer"}


@pytest.mark.parametrize(("module", "name", "config"), FAMILIES, ids=[name for _, name, _ in FAMILIES])
def test_each_family_and_its_config_is_exported(module, name, config):
    source = import_module(module)
    for exported in (name, config):
        assert exported in attnlab.models.__all__, f"attnlab.models does not export {exported} ({module})"
        assert getattr(attnlab.models, exported) is getattr(source, exported)


def _documented_members() -> list[str]:
    """The names the API page's `::: attnlab.models` block lists under `members:`."""
    text = API_PAGE.read_text()
    block = re.search(r"members:\n((?:\s+- \w+\n)+)", text)
    assert block, f"{API_PAGE} lists no members under `::: attnlab.models`"
    return re.findall(r"- (\w+)", block[1])


def test_the_api_reference_shows_every_export():
    """The page names each export once (mkdocstrings renders exactly those: a name missing there is
    missing from the site), and names nothing that is not exported."""
    documented = _documented_members()
    assert len(documented) == len(set(documented))
    assert sorted(documented) == sorted(attnlab.models.__all__)
    assert {name for _, name, _ in FAMILIES} | {config for _, _, config in FAMILIES} <= set(documented)
