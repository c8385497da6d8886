"""The table of tasks (`attnlab.names.TASKS`) is the one place that lists them: the task classes
(`attnlab.tasks.TASKS`), the commands that take each task's runs (`attnlab.cli.kinds`) and what the
server answers (`attnlab.serve.registry`) are read from it, every entry has its module and class,
and no second list of tasks is written by hand in the source.

The source is read with `ast`, nothing imported: a tuple, list, set or dict whose string items
name three tasks or more is a hand-written list of tasks."""

import argparse
import ast
import importlib
from pathlib import Path

from attnlab import names, tasks
from attnlab.cli import build_parser
from attnlab.cli import kinds as cli_kinds
from attnlab.serve import registry

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"

KNOWN_SUBSETS = {
    "export.py": "ENCODER_TASKS: the tasks whose model is a BERT encoder (issue 59 item 7 leaves it)",
    "train/lora.py": "LORA_TASKS: the tasks LoRA fine-tunes (issue 59 item 7 leaves it)",
    "cli/sample.py": "MEDIA_TASKS: the tasks `attnlab sample` draws media for (issue 59 item 7 leaves it)",
    "cli/attention.py": "the media tasks `--text` refuses (issue 59 item 7 leaves it)",
    "viz/report.py": "EXAMPLES: the report's section of each task, code by task name rather than a list",
}
"""Modules that keep a hand-written subset of the tasks, each a debt (or code keyed by task, which
is no table of facts): a new one fails the test."""


def test_every_task_of_the_table_has_its_module_and_class():
    for name, task in names.TASKS.items():
        module, _, cls = task.task_class.partition(":")
        assert (SRC / "tasks" / f"{module}.py").is_file(), f"{name}: no module attnlab/tasks/{module}.py"
        found = getattr(importlib.import_module(f"attnlab.tasks.{module}"), cls, None)
        assert found is not None, f"{name}: attnlab.tasks.{module} has no class {cls}"
        assert found.name == name, f"{name}: {task.task_class} says its name is {found.name!r}"
        assert tasks.TASKS[name] is found
    assert list(tasks.TASKS) == list(names.TASKS) == list(names.TASK_KINDS)


def named_for(task: str) -> str:
    """The "module:Class" a task's name gives (`attnlab.names.Task.task_class`): "masked-lm" ->
    "masked_lm:MaskedLM"."""
    words = task.split("-")
    camel = "".join(word.upper() if word == "lm" else word.capitalize() for word in words)
    return f"{'_'.join(words)}:{camel}"


def test_each_task_s_module_and_class_are_named_for_the_task():
    """timm's rule (file = family = class): the task `token-classification` lives in
    tasks/token_classification.py as `TokenClassification`."""
    for name, task in names.TASKS.items():
        assert task.task_class == named_for(name), f"{name}: {task.task_class}, not {named_for(name)}"


def test_the_command_line_reads_each_task_s_commands_from_the_table():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, task in names.TASKS.items():
        for command in task.commands:
            assert command.split()[0] in sub.choices, f"{name}: no command attnlab {command.split()[0]}"
        if task.needed_as:
            assert cli_kinds.NEEDS[task.commands[0]] == task.needed_as
    owners = [task.commands[0] for task in names.TASKS.values() if task.needed_as]
    assert len(owners) == len(set(owners)), f"two tasks claim one command as their own: {owners}"


def test_the_server_reads_each_task_s_endpoint_from_the_table():
    paths = set(vars(names.API).values())
    for name, task in names.TASKS.items():
        assert task.endpoint is None or task.endpoint in paths, f"{name}: {task.endpoint} is no path of API"
        assert task.endpoint is None or task.served_as, f"{name}: an endpoint but the server refuses its runs"
        if task.served_as:
            assert registry.ENDPOINTS[name] == task.endpoint and registry.KINDS[name] == task.served_as
        else:
            assert name not in registry.ENDPOINTS and name not in registry.KINDS
    assert set(registry.ENDPOINTS) - set(names.TASKS) == {registry.SENTENCE_EMBEDDING}


def test_the_refusal_names_a_run_by_the_table_s_words():
    """One entry's words, checked in the error they go into (`attnlab.cli.kinds.require_kind`)."""
    from attnlab.errors import UserError
    from attnlab.train import resolve

    config = resolve({"task": "audio-classification", "model": {"kind": "spectrogram-cnn"}})
    try:
        cli_kinds.require_kind("runs/digits", config, "translate")
    except UserError as e:
        message = str(e)
    assert message == (
        "runs/digits is an audio-classification (spoken digits) run (spectrogram-cnn), not a translation "
        "model; use it with attnlab eval"
    )


def string_items(node: ast.AST) -> list[str]:
    """The string constants a tuple, list, set or dict literal holds (a dict's keys)."""
    items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def lists_of(names_: set[str], path: Path, at_least: int = 3) -> list[int]:
    """The lines of `path` where a literal names `at_least` of `names_`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict)
        and len(set(string_items(node)) & names_) >= at_least
    ]


def test_the_scan_finds_a_list_of_tasks(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('A = ("translation", "masked-lm", "chat")\nB = {"chat": 1, "x": 2}\nC = ["lm", "chat"]\n')
    assert lists_of(set(names.TASKS), source) == [1]


def test_no_second_list_of_tasks_is_written_by_hand():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where != "names.py" and where not in KNOWN_SUBSETS and (lines := lists_of(set(names.TASKS), path)):
            found[where] = lines
    assert not found, f"hand-written lists of tasks (read attnlab.names.TASKS instead): {found}"
    for where in KNOWN_SUBSETS:  # a debt paid is taken off the list
        assert lists_of(set(names.TASKS), SRC / where), f"{where} no longer lists tasks: drop it from KNOWN_SUBSETS"
