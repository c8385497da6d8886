"""The early-stopping judge (`attnlab.train.selection.Selection`): which evaluations are progress
and which weights become the best, by the rule each setting names."""

import pytest

from attnlab.errors import ConfigError
from attnlab.train.config import TrainConfig
from attnlab.train.selection import Selection

ACCURACIES = [0.5, 0.6, 0.6, 0.55, 0.6, 0.7]


def judged(selection: Selection, accuracies: list[float]) -> tuple[list[bool], list[int]]:
    bests, stale = [], []
    for acc in accuracies:
        bests.append(selection.judge({"val_accuracy": acc, "val_loss": 1.0}))
        stale.append(selection.stale)
    return bests, stale


def test_alone_the_metric_must_improve_strictly():
    bests, stale = judged(Selection(("val_accuracy", "max"), 3, False, "nodes"), ACCURACIES)
    assert bests == [True, True, False, False, False, True]
    assert stale == [0, 0, 1, 2, 3, 0]


def test_with_ties_count_a_tie_is_progress_and_the_new_best():
    """GAT's reference code on Citeseer: `if val_acc >= vacc_mx: save; curr_step = 0`."""
    selection = Selection(("val_accuracy", "max"), 3, False, "nodes", ties_count=True)
    bests, stale = judged(selection, ACCURACIES)
    assert bests == [True, True, True, False, True, True]
    assert stale == [0, 0, 0, 1, 0, 0]
    assert selection.best == 0.7


def test_ties_count_for_a_metric_to_minimise():
    selection = Selection(("val_loss", "min"), 0, False, "lm", ties_count=True)
    assert [selection.judge({"val_loss": v}) for v in (2.0, 1.5, 1.5, 1.6, 1.4)] == [True, True, True, False, True]


def test_ties_count_with_watch_loss_is_refused():
    with pytest.raises(ValueError, match="watch_loss already counts ties"):
        TrainConfig(watch_loss=True, ties_count=True)


def test_watch_loss_needs_a_val_loss():
    with pytest.raises(ConfigError, match="needs a val_loss"):
        Selection(("val_accuracy", "max"), 0, True, "nodes").judge({"val_accuracy": 0.5})
