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
from attnlab.tasks.audio import AudioDataConfig, SpeechDensity
from attnlab.tasks.chat import Chat, ChatDataConfig
from attnlab.tasks.classification import Classification, ClassificationDataConfig
from attnlab.tasks.digits import DigitClassification, DigitsDataConfig
from attnlab.tasks.images import ImageDensity, ImagesDataConfig
from attnlab.tasks.lm import LanguageModeling, LMDataConfig
from attnlab.tasks.mlm import MaskedLM, MLMDataConfig
from attnlab.tasks.nodes import NodeClassification, NodesDataConfig
from attnlab.tasks.tagging import Tagging, TaggingDataConfig
from attnlab.tasks.translation import Translation, TranslationDataConfig
from attnlab.tasks.vision import ImageClassification


def task_class(path: str) -> type:
    """The class of a task-table entry's `task_class`: "lm:LanguageModeling" -> `LanguageModeling`
    of `attnlab.tasks.lm`."""
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
    "DigitClassification",
    "DigitsDataConfig",
    "ImageClassification",
    "ImageDensity",
    "ImagesDataConfig",
    "SpeechDensity",
    "Classification",
    "ClassificationDataConfig",
    "LMDataConfig",
    "LanguageModeling",
    "MLMDataConfig",
    "MaskedLM",
    "NodeClassification",
    "NodesDataConfig",
    "Tagging",
    "TaggingDataConfig",
    "Translation",
    "TranslationDataConfig",
    "open_task",
]
