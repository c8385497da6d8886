"""The glue for one kind of job: which model, which data, which loss, which metric."""

from attnlab.tasks.lm import TASKS, LanguageModeling, LMDataConfig

__all__ = ["TASKS", "LanguageModeling", "LMDataConfig"]
