"""The names of tasks and model kinds, and the older names that saved configs still use; the one
table of tasks (`TASKS`: each task's kinds, class, commands and endpoint), the server's paths
(`API`) and the position schemes (`POSITION_SCHEMES`).

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
from dataclasses import dataclass
from typing import Any

from attnlab.config import close_matches
from attnlab.errors import ConfigError


@dataclass(frozen=True)
class Api:
    """The server's paths (`attnlab serve`), each written once: the router serves these, the page
    is handed them (`/static/api.js`), the task table below and the error messages name them."""

    models: str = "/v1/models"
    completions: str = "/v1/completions"
    chat: str = "/v1/chat/completions"
    responses: str = "/v1/responses"
    embeddings: str = "/v1/embeddings"
    translations: str = "/v1/translations"
    classifications: str = "/v1/classifications"
    tags: str = "/v1/tags"
    attention: str = "/v1/attention"


API = Api()


@dataclass(frozen=True)
class Task:
    """One task, every fact the layers above need of it in one record.

    kinds: the model kinds it trains (`model.kind`), the default first; none for a GPT-only task.
    task_class: its class, "module:Class" under `attnlab.tasks` (which imports it into `TASKS`), both
        named for the task: the module is the name in snake case, the class the name in CamelCase,
        "lm" written "LM" (`token-classification` is "token_classification:TokenClassification").
    commands: the commands that apply a trained run of it (every run also fits plot and report).
    needed_as: what its own command (`commands[0]`) asks for, in that command's refusal
        ("translation model"); None where the first command is not its own.
    described: how a refusal names a run of it, where that says more than the task's name.
    endpoint: the server's path of its own (`API`); None for one served without one.
    served_as: what the server calls a model of it ("classifier"); None: the server refuses its runs.
    """

    name: str
    kinds: tuple[str, ...]
    task_class: str
    commands: tuple[str, ...] = ("eval",)
    needed_as: str | None = None
    described: str | None = None
    endpoint: str | None = None
    served_as: str | None = None


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        # always a GPT: its model section has no kind
        Task(
            "language-model",
            (),
            "language_model:LanguageModel",
            ("sample", "eval", "attention"),
            needed_as="language model",
            endpoint=API.completions,
            served_as="language model",
        ),
        Task("chat", (), "chat:Chat"),  # a GPT fine-tuned on conversations: no kind either
        Task(
            "translation",
            ("seq2seq-transformer", "gru", "gru-attention"),
            "translation:Translation",
            ("translate", "eval", "attention"),
            needed_as="translation model",
            endpoint=API.translations,
            served_as="translation model",
        ),
        Task(
            "masked-lm",
            ("bert",),
            "masked_lm:MaskedLM",
            ("embed", "eval", "attention", "train --init-from"),
            described="masked-lm (BERT pre-training)",
            served_as="masked language model",  # it embeds and shows its attention
        ),
        Task(
            "replaced-token-detection",
            ("electra",),
            "replaced_token_detection:ReplacedTokenDetection",
            ("embed", "eval", "train --init-from"),  # its discriminator: embedded and fine-tuned
            described="replaced-token-detection (ELECTRA pre-training)",
        ),
        Task(
            "text-classification",
            ("bert", "bilstm"),
            "text_classification:TextClassification",
            ("classify", "eval", "embed", "attention"),
            needed_as="classification model",
            endpoint=API.classifications,
            served_as="classifier",
        ),
        Task(
            "token-classification",
            ("bert", "bilstm"),
            "token_classification:TokenClassification",
            ("tag", "eval", "embed", "attention"),
            needed_as="tagging model",
            endpoint=API.tags,
            served_as="tagger",
        ),
        Task(
            "node-classification",
            ("gat", "gcn", "node-transformer"),
            "node_classification:NodeClassification",
            ("eval", "attention --node"),
        ),
        Task(
            "image-density",
            ("pixelcnn", "gated-pixelcnn", "pixel-gpt"),
            "image_density:ImageDensity",
            ("sample", "eval"),
        ),
        Task(
            "image-classification",
            ("vit", "cnn"),
            "image_classification:ImageClassification",
            ("eval", "attention --image"),
        ),
        Task(
            "audio-density",
            ("wavenet",),
            "audio_density:AudioDensity",
            ("sample", "eval"),
            described="audio-density (WaveNet)",
        ),
        Task(
            "audio-classification",
            ("spectrogram-cnn",),
            "audio_classification:AudioClassification",
            described="audio-classification (spoken digits)",
        ),
    )
}
"""Every task by its name: the one table of tasks. `attnlab.tasks.TASKS` (the classes),
`attnlab.cli.kinds` (which commands take which runs) and `attnlab.serve.registry` (what the server
answers) are read from it."""

TASK_KINDS: dict[str, tuple[str, ...]] = {name: task.kinds for name, task in TASKS.items()}
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


@dataclass(frozen=True)
class PositionScheme:
    """A position scheme (`model.positions`): where it acts, at the input (vectors added to the
    token embeddings) or inside attention, and whether `attnlab positions` draws it (a learned table
    or no positions have no formula to draw)."""

    name: str
    inside_attention: bool
    drawn: bool = True


POSITION_SCHEMES: dict[str, PositionScheme] = {
    scheme.name: scheme
    for scheme in (
        PositionScheme("learned", inside_attention=False, drawn=False),
        PositionScheme("sinusoidal", inside_attention=False),
        PositionScheme("fourier", inside_attention=False),
        PositionScheme("none", inside_attention=False, drawn=False),
        PositionScheme("rope", inside_attention=True),
        PositionScheme("alibi", inside_attention=True),
        PositionScheme("relative", inside_attention=True),
    )
}
"""Every position scheme by name: the one list of them, here where the command line reads it before
PyTorch is imported. Their classes are `attnlab.nn.positions`' (`INPUT_POSITIONS`,
`ATTENTION_POSITIONS`: tests/nn/test_position_registry.py checks they match this table), and
`attnlab.viz.positions` draws those marked `drawn`."""

DRAWN_SCHEMES: tuple[str, ...] = tuple(name for name, scheme in POSITION_SCHEMES.items() if scheme.drawn)
"""The schemes `attnlab positions --kind` takes."""


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
