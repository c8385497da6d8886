"""Which commands use which runs: one table, and the one error every command gives for a run of
the wrong kind (what the run is, and the commands that fit it). A path that is no run folder (a
Hugging Face folder, a GGUF file, nothing) is `attnlab.sources.refusal`'s to refuse."""

from pathlib import Path
from typing import Any

from attnlab.errors import UserError

# The commands that apply a trained run of each task (every run also fits plot and report).
TASK_COMMANDS = {
    "language-model": ("sample", "eval", "attention"),
    "translation": ("translate", "eval", "attention"),
    "text-classification": ("classify", "eval", "embed", "attention"),
    "token-classification": ("tag", "eval", "embed", "attention"),
    "masked-lm": ("embed", "eval", "attention", "train --init-from"),
    "node-classification": ("eval", "attention --node"),
    "image-density": ("sample", "eval"),
    "audio-density": ("sample", "eval"),
    "image-classification": ("eval", "attention --image"),
    "audio-classification": ("eval",),
}
# The words of the error, where they say more than the task's name.
TASK_NAMES = {
    "masked-lm": "masked-lm (BERT pre-training)",
    "audio-density": "audio-density (WaveNet)",
    "audio-classification": "audio-classification (spoken digits)",
}
# What each command needs, in the words of its error.
NEEDS = {
    "sample": "language model",
    "translate": "translation model",
    "classify": "classification model",
    "tag": "tagging model",
    "embed": "BERT encoder",
}
NO_ATTENTION = ("gru", "bilstm", "gcn")  # model kinds with no attention weights to draw
NOT_BERT = ("bilstm",)  # encoder-task model kinds that `attnlab embed` cannot read


def commands_for(config: Any) -> list[str]:
    """The commands that use a run of this RunConfig, e.g. ["sample", "eval", "attention"]."""
    kind = getattr(config.model, "kind", None)
    return [
        c
        for c in TASK_COMMANDS.get(config.task, ("eval",))
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
    what = TASK_NAMES.get(config.task, config.task) + " run" + (f" ({kind})" if kind else "")
    article = "an" if what[0] in "aeiou" else "a"  # an image-density run
    raise UserError(
        f"{run_dir} is {article} {what}, not a {NEEDS.get(command, command)}; use it with "
        + ", ".join(f"attnlab {c}" for c in fits)
    )
