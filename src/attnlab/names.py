"""The names of tasks and model kinds, and the older names that saved configs still use.

A task is named after what it learns: `image-density` (a probability for every image),
`text-classification` (a label for every text). A model kind names one model class, the same in
every task: `seq2seq-transformer` is the encoder–decoder, `node-transformer` the encoder over a
graph's nodes. Configs written by earlier versions named some tasks after their data (`images`,
`audio`, `digits`) and used `transformer` for two different models; `upgrade` maps those names to
today's when a config is read, so run folders, TOML files and `--set task=images` keep working.
This module is the one place that knows the old names (docs/training.md, "Tasks and model kinds",
has the table). It imports neither PyTorch nor the tasks, so a command can check a name before loading them.
"""

from collections.abc import Collection
from typing import Any

from attnlab.config import close_matches
from attnlab.errors import ConfigError

TASK_KINDS: dict[str, tuple[str, ...]] = {
    "language-model": (),  # always a GPT: its model section has no kind
    "chat": (),  # a GPT fine-tuned on conversations: no kind either
    "translation": ("seq2seq-transformer", "gru", "gru-attention"),
    "masked-lm": ("bert",),
    "text-classification": ("bert", "bilstm"),
    "token-classification": ("bert", "bilstm"),
    "node-classification": ("gat", "gcn", "node-transformer"),
    "image-density": ("pixelcnn", "gated-pixelcnn", "pixel-gpt"),
    "image-classification": ("vit", "cnn"),
    "audio-density": ("wavenet",),
    "audio-classification": ("spectrogram-cnn",),
}
"""Every task by its name, with the model kinds it trains (`model.kind`), the default first."""

OLD_TASKS: dict[str, str] = {
    "lm": "language-model",
    "mlm": "masked-lm",
    "classification": "text-classification",
    "tagging": "token-classification",
    "nodes": "node-classification",
    "images": "image-density",
    "audio": "audio-density",
    "digits": "audio-classification",
}
"""Earlier versions' task names -> today's. (`translation` and `image-classification` kept theirs.)"""

OLD_KINDS: dict[str, dict[str, str]] = {
    "translation": {"transformer": "seq2seq-transformer", "rnn": "gru", "rnn-attention": "gru-attention"},
    "node-classification": {"transformer": "node-transformer"},
    "image-density": {"gated_pixelcnn": "gated-pixelcnn", "gpt": "pixel-gpt"},
    "audio-classification": {"spectrogram_cnn": "spectrogram-cnn"},
}
"""Earlier versions' model kinds -> today's, by (today's) task: `transformer` meant a different model
in translation than in node classification, so an old kind is read only within its task."""

OLD_FIELDS: dict[str, str] = {
    "n_layer": "n_layers",
    "n_head": "n_heads",
    "n_embd": "d_model",
    "n_kv_head": "n_kv_heads",
}
"""Earlier versions' model keys -> today's: the GPT's config and the block parts once had a
vocabulary of their own (nanoGPT's), where every other family said n_layers, n_heads, d_model."""

DEFAULT_TASK = "language-model"
"""The task of a config that names none."""


def _old_names(table: dict[str, str]) -> str:
    return ", ".join(f"{old} -> {new}" for old, new in table.items())


def task_name(name: Any, registered: Collection[str] = ()) -> str:
    """Today's name of a task given by today's or its old name: `"images"` -> `"image-density"`;
    a `ConfigError` listing the tasks for anything else. `registered`: tasks added to the registry
    beyond this table (`attnlab.tasks.TASKS`), taken as they are named."""
    if isinstance(name, str) and (name in TASK_KINDS or name in registered):
        return name
    if isinstance(name, str) and name in OLD_TASKS:
        return OLD_TASKS[name]
    raise ConfigError(
        f"unknown task {name!r}{close_matches(str(name), [*TASK_KINDS, *OLD_TASKS])}; tasks are "
        f"{', '.join(TASK_KINDS)} (older names still read: {_old_names(OLD_TASKS)})"
    )


def kind_name(task: str, kind: Any) -> str:
    """Today's name of a model kind of `task` (today's task name), given by today's or its old
    name: ("translation", "transformer") -> "seq2seq-transformer"; a `ConfigError` listing the
    task's kinds for anything else."""
    kinds, old = TASK_KINDS[task], OLD_KINDS.get(task, {})
    if isinstance(kind, str) and kind in kinds:
        return kind
    if isinstance(kind, str) and kind in old:
        return old[kind]
    if not kinds:
        raise ConfigError(f"a {task} run trains a GPT, which has no model.kind: leave it out")
    accepted = f" (older names still read: {_old_names(old)})" if old else ""
    raise ConfigError(
        f"unknown model.kind {kind!r} for task {task}{close_matches(str(kind), [*kinds, *old])}; "
        f"choose one of {', '.join(kinds)}{accepted}"
    )


def upgrade(doc: dict[str, Any], registered: Collection[str] = ()) -> dict[str, Any]:
    """A run's config document with today's task name and model kind, whichever names it was
    written with: `{"task": "images", "model": {"kind": "gpt"}}` -> `{"task": "image-density",
    "model": {"kind": "pixel-gpt"}}`, and the model's keys by today's names (`with_model_fields`).
    A missing task is the language model's; a missing kind stays missing (the task's default). A
    `ConfigError` for an unknown task or kind. A task of `registered` beyond this table keeps its
    kind as written (its own model_config_class checks it)."""
    task = task_name(doc.get("task", DEFAULT_TASK), registered)
    out = {**with_model_fields(doc), "task": task}
    model = out.get("model")
    if isinstance(model, dict) and "kind" in model and task in TASK_KINDS:
        out["model"] = {**model, "kind": kind_name(task, model["kind"])}
    return out


def with_model_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """A config document (or a set of overrides) whose model section uses today's key names
    (`OLD_FIELDS`): `{"model": {"n_embd": 64}}` -> `{"model": {"d_model": 64}}`. A `ConfigError`
    where one field is given under both names."""
    model = doc.get("model")
    if not isinstance(model, dict) or not any(old in model for old in OLD_FIELDS):
        return doc
    renamed = dict(model)
    for old, new in OLD_FIELDS.items():
        if old in renamed:
            if new in renamed:
                raise ConfigError(f"model.{old} is the old name of model.{new}: give one of the two")
            renamed[new] = renamed.pop(old)
    return {**doc, "model": renamed}


def check_section_keys(doc: dict[str, Any]) -> None:
    """Raise ConfigError for a key of a section (`model`, `data`, `train`, `log`) that no task or
    model kind accepts, by today's or an old name: `{"model": {"n_layr": 2}}` -> "unknown config
    key model.n_layr (did you mean 'n_layers'?)". Made before PyTorch is imported, from the table
    `attnlab.config_keys` that scripts/config_keys.py writes; a key that some other family has is
    left to the dataclasses, which name what this run's family accepts."""
    from attnlab.config_keys import SECTION_KEYS

    for section, known in SECTION_KEYS.items():
        table = doc.get(section)
        if not isinstance(table, dict):
            continue
        accepted = known | set(OLD_FIELDS) if section == "model" else known
        for key in table:
            if key not in accepted:
                raise ConfigError(
                    f"unknown config key {section}.{key}{close_matches(key, known)}; "
                    f"no task's [{section}] has it (`attnlab train --help` lists the tasks)"
                )
