"""Which commands use which runs, and the one error every command gives for a run of the wrong kind
(what the run is, and the commands that fit it), read from the one table of tasks
(`attnlab.names.TASKS`: each task's commands and the words of its refusals). A path that is no run
folder (a Hugging Face folder, a GGUF file, nothing) is `attnlab.sources.refusal`'s to refuse."""

from pathlib import Path
from typing import Any

from attnlab.errors import UserError
from attnlab.names import TASKS

# What each command needs, in the words of its error: a task's own command asks for a model of
# that task; `embed` reads any BERT encoder.
NEEDS = {task.commands[0]: task.needed_as for task in TASKS.values() if task.needed_as} | {"embed": "BERT encoder"}
NO_ATTENTION = ("gru", "bilstm", "gcn")  # model kinds with no attention weights to draw
NOT_BERT = ("bilstm",)  # encoder-task model kinds that `attnlab embed` cannot read


def commands_for(config: Any) -> list[str]:
    """The commands that use a run of this RunConfig, e.g. ["sample", "eval", "attention"]."""
    kind = getattr(config.model, "kind", None)
    task = TASKS.get(config.task)
    return [
        c
        for c in (task.commands if task else ("eval",))
        if not (c.startswith("attention") and kind in NO_ATTENTION)
        and not (c in ("embed", "train --init-from") and kind in NOT_BERT)
    ]


def require_kind(run_dir: str | Path, config: Any, command: str) -> None:
    """UserError unless `attnlab COMMAND` uses runs like this one; the error says what the run is
    and which commands fit it. Example: "runs/lm is a language-model run, not a BERT encoder; use it
    with attnlab sample, attnlab eval, attnlab attention"."""
    fits = commands_for(config)
    if command in fits:
        return
    kind = getattr(config.model, "kind", None)
    task = TASKS.get(config.task)
    what = ((task and task.described) or config.task) + " run" + (f" ({kind})" if kind else "")
    article = "an" if what[0] in "aeiou" else "a"  # an image-density run
    raise UserError(
        f"{run_dir} is {article} {what}, not a {NEEDS.get(command, command)}; use it with "
        + ", ".join(f"attnlab {c}" for c in fits)
    )
