"""attnlab: the Transformer family, readable and measured.

import attnlab
run = attnlab.load("runs/demo")      # .model, .tokenizer, .config
"""

from pathlib import Path

from attnlab.errors import CheckpointError, ConfigError, UserError

__version__ = "0.1.0"


def load(path: str | Path, *, device: str = "cpu", checkpoint: str = "best"):
    """A trained run folder -> a `Run` with `.model` (eval mode), `.tokenizer`, `.config`.

    checkpoint: "best" (best validation score; the last checkpoint when the run has no best) or "last".
    """
    from attnlab.train.checkpoint import load_run

    return load_run(path, device=device, checkpoint=checkpoint)


__all__ = ["CheckpointError", "ConfigError", "UserError", "__version__", "load"]
