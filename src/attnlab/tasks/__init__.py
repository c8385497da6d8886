"""The glue for one kind of job: which model, which data, which loss, which metric.

A task class provides: `data_config_class`; `model_config_class(values) -> type` (the model
section's dataclass, which may depend on `model.kind`); `build_model_from_config(config)`;
`selection` (the validation metric that picks the best checkpoint, and "min" or "max"; None
keeps no best checkpoint); and, once
constructed for a run folder, `model_config`, `tokenizer`, `build_model()`,
`train_batch(index, generator)`, `batch_tokens(batch)`, `loss(model, batch, device, label_smoothing)`,
`evaluate_during_training(model, device, step=, eval_iters=, seed=, log=)` (eval_iters: the budget
of validation batches; log: a line-writer for what the task says while it evaluates) and
`evaluate(model, device, split=...)`; optionally
`initialize(model)`, called once on a new run's fresh model (fine-tuning copies a pre-trained
encoder in there); `uses_tokenizer = False` for a task whose run folder has no tokenizer.json
(node classification); `report_split`, the split `attnlab train --seeds` evaluates each run on.
"""

import importlib

from attnlab.names import TASKS as TASK_TABLE
from attnlab.tasks.audio_classification import AudioClassification, DigitsDataConfig
from attnlab.tasks.audio_density import AudioDataConfig, AudioDensity
from attnlab.tasks.chat import Chat, ChatDataConfig
from attnlab.tasks.image_classification import ImageClassification
from attnlab.tasks.image_density import ImageDensity, ImagesDataConfig
from attnlab.tasks.language_model import LanguageModel, LMDataConfig
from attnlab.tasks.masked_lm import MaskedLM, MLMDataConfig
from attnlab.tasks.node_classification import NodeClassification, NodesDataConfig
from attnlab.tasks.text_classification import ClassificationDataConfig, TextClassification
from attnlab.tasks.token_classification import TaggingDataConfig, TokenClassification
from attnlab.tasks.translation import Translation, TranslationDataConfig


def task_class(path: str) -> type:
    """The class of a task-table entry's `task_class`: "language_model:LanguageModel" -> `LanguageModel`
    of `attnlab.tasks.language_model`."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(f"attnlab.tasks.{module}"), name)


TASKS: dict[str, type] = {name: task_class(task.task_class) for name, task in TASK_TABLE.items()}
"""Every task's class by its name, read from the one table of tasks
(`attnlab.names.TASKS`, where a new task is registered)."""


def open_task(run):
    """The task object of a loaded run (what `attnlab.load` returns), ready to apply its model to new
    inputs: the run's tokenizer and labels, no data read."""
    return TASKS[run.config.task](run.config.data, run.config.model, run.path, resume=True, splits=())


__all__ = [
    "TASKS",
    "AudioDataConfig",
    "Chat",
    "ChatDataConfig",
    "AudioClassification",
    "DigitsDataConfig",
    "ImageClassification",
    "ImageDensity",
    "ImagesDataConfig",
    "AudioDensity",
    "TextClassification",
    "ClassificationDataConfig",
    "LMDataConfig",
    "LanguageModel",
    "MLMDataConfig",
    "MaskedLM",
    "NodeClassification",
    "NodesDataConfig",
    "TokenClassification",
    "TaggingDataConfig",
    "Translation",
    "TranslationDataConfig",
    "open_task",
]
