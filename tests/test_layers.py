"""The layers of docs/development.md hold: no module of attnlab imports from a layer above its own.

Every `import attnlab...` and `from attnlab... import` counts, at module level or inside a
function (a function-level import is still a dependency, only a later one), parsed with `ast`
so nothing is imported. Modules of one layer may import each other; a cycle between two
top-level packages fails too, whatever their layers.
"""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"

LAYERS: list[tuple[str, ...]] = [
    # the ground floor: what every layer may use
    ("errors", "fileio", "device", "progress", "config", "config_keys", "names", "families", "sources", "checkpoints"),
    ("nn",),  # building blocks
    ("data",),  # tokenizers, data sets, batching (data/graphs.py uses nn's edge-index helpers)
    ("models",),  # the families
    ("accel",),  # the tuned code, applied to models by one explicit call
    ("decode", "eval"),  # decoding and metrics: pure functions of models, tensors and token ids
    ("tasks",),  # which model, which data, which loss, which metric
    ("train",),  # the loop
    ("studies", "export", "viz"),  # measurements, pictures and exports built on the verbs
    ("cli", "serve", "chat", "__main__", "__init__"),  # the faces (`attnlab.load`, `attnlab.Chat`: the Python API)
]
"""Bottom to top, as docs/development.md ("Layout") draws them: the shared helpers at the bottom,
the studies, exports and pictures (studies, export, viz) under the faces, and decode and eval
under the tasks rather than beside train, since a task scores with them (perplexity, BLEU by beam
search) while they import nothing above models."""

RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}

ALLOWED: dict[tuple[str, str], str] = {
    # (importing module, imported module): why it is allowed for now. Keep this list short; each
    # entry is a debt. A new upward import fails the test.
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported attnlab module, line) for every import in `path`, relative ones resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.append((".".join([*base, *([node.module] if node.module else [])]), node.lineno))
            else:
                found.append((node.module or "", node.lineno))
    return [(name, line) for name, line in found if name == "attnlab" or name.startswith("attnlab.")]


def part(module: str) -> str:
    """The layer-bearing part of a module: attnlab.train.load -> "train"; attnlab -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def edges() -> list[tuple[str, str, int]]:
    return [
        (module_name(path), imported, line) for path in sorted(SRC.rglob("*.py")) for imported, line in imports(path)
    ]


def test_every_part_of_attnlab_has_a_layer():
    parts = {
        p.stem if p.is_file() else p.name for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    missing = sorted(parts - set(RANK))
    assert not missing, f"give these a row in LAYERS: {missing}"


def test_no_layer_imports_from_a_layer_above_it():
    upward = [
        f"{module}:{line} imports {imported} ({part(module)} is below {part(imported)})"
        for module, imported, line in edges()
        if RANK[part(imported)] > RANK[part(module)] and (module, imported) not in ALLOWED
    ]
    assert not upward, "\n".join(upward)


def test_the_allowed_upward_imports_still_exist():
    """An entry of ALLOWED that the code no longer needs is removed, so the list stays honest."""
    present = {(module, imported) for module, imported, _ in edges()}
    assert not set(ALLOWED) - present


def test_the_reference_code_never_imports_the_tuned_code():
    """nn/ and models/ are reference PyTorch: the tuned code (accel/) is applied to them from above
    (`attnlab.accel.for_training`, `for_decoding`), never asked for from inside, ALLOWED or not."""
    asked = [
        f"{module}:{line} imports {imported}"
        for module, imported, line in edges()
        if part(module) in ("nn", "models") and part(imported) == "accel"
    ]
    assert not asked, "\n".join(asked)


def test_no_cycle_between_the_top_level_packages():
    graph = defaultdict(set)
    for module, imported, _ in edges():
        if part(module) != part(imported) and (module, imported) not in ALLOWED:
            graph[part(module)].add(part(imported))
    cycles = []
    for start in list(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(" -> ".join([*path, start]))
                elif nxt not in path:
                    stack.append((nxt, [*path, nxt]))
    assert not cycles, "\n".join(sorted(set(cycles)))


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from attnlab.train.load import load_run", ["attnlab.train.load"]),
        ("def f():\n    import attnlab.tasks\n", ["attnlab.tasks"]),
        ("from . import kernels", ["attnlab.nn"]),
        ("from .masks import causal_mask", ["attnlab.nn.masks"]),
        ("import torch", []),
    ],
)
def test_imports_finds_module_and_function_level_and_relative_imports(tmp_path, monkeypatch, source, expected):
    fake = tmp_path / "attnlab" / "nn" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(source, encoding="utf-8")
    monkeypatch.setitem(globals(), "SRC", tmp_path / "attnlab")
    assert [name for name, _ in imports(fake)] == expected
