"""TensorBoard event files, read back with TensorBoard's own reader."""

import csv
import sys

import pytest

from attnlab.config import merge, parse_overrides, read_toml
from attnlab.train import resolve, train
from attnlab.train.tensorboard import TENSORBOARD_DIR, tensorboard_tag
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar event in the run's event files: tag -> [(step, value), ...] in file order."""
    acc = event_accumulator.EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_hold_the_metrics_csv_values_and_resume_appends(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    settings = ["log.tensorboard=true", "train.log_interval=1", "train.eval_interval=2", "train.lr_decay_iters=6"]
    doc = merge(read_toml(tiny_toml), parse_overrides([*settings, "train.max_iters=4"]))
    train(resolve(doc), run_dir, progress=False)
    doc = merge(read_toml(tiny_toml), parse_overrides([*settings, "train.max_iters=6"]))
    train(resolve(doc), run_dir, resume=True, progress=False)

    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    events = scalars(run_dir)
    assert {"train/train_loss", "train/lr", "train/tokens_per_sec", "eval/train_loss", "eval/val_loss"} <= set(events)
    for row in rows:
        for key in ("train_loss", "val_loss", "lr"):
            if row[key]:
                tag = tensorboard_tag(row["kind"], key)
                assert dict(events[tag])[int(row["step"])] == pytest.approx(float(row[key]), rel=1e-5), (tag, row)
    # Both runs' steps, each once and in order: 1..6 trained, evaluated at 0, 2, 4, 6.
    assert [step for step, _ in events["train/train_loss"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in events["eval/val_loss"]] == [0, 2, 4, 6]


def test_missing_tensorboard_is_one_line_naming_pip_install(capsys, tiny_toml, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what `import tensorboard` sees when not installed
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "run", "--set", "log.tensorboard=true")
    assert_user_error(result, "pip install tensorboard")
    assert not (tmp_path / "run").exists()
