"""Training: the run configuration, one loop, checkpoints."""

from attnlab.train.config import RunConfig, TrainConfig, resolve
from attnlab.train.load import Run, load_run
from attnlab.train.trainer import TrainResult, train

__all__ = ["Run", "RunConfig", "TrainConfig", "TrainResult", "load_run", "resolve", "train"]
