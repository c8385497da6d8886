"""`attnlab train --seeds N`: every task family's series reports its validation score (and its test
score where the task reports one) for each seed and as mean ± sd, in text and in --json. Each run
is tiny (a few steps); the expected numbers are read back from the runs' own metrics.csv and from
`attnlab eval`, not from the series' code."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from attnlab.config import dump_toml
from helpers import MEDIA_IMAGE_DATA, _tiny_doc, cli

pytestmark = pytest.mark.slow

SEEDS = (1337, 1338)
FEW_STEPS = {"max_iters": 4, "eval_interval": 2, "log_interval": 2}


def evaluations(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return [row for row in csv.DictReader(f) if row["kind"] == "eval"]


def tiny_toml(tmp_path: Path, name: str) -> Path:
    """One of the tests' tiny configs (`helpers._tiny_doc`) cut to four steps, as a TOML file."""
    doc = _tiny_doc(name, tmp_path)
    doc["train"].update(FEW_STEPS)
    path = tmp_path / f"{name}.toml"
    path.write_text(dump_toml(doc), encoding="utf-8")
    return path


def series(capsys, *args) -> tuple[dict, str]:
    """The --json summary and the text output of the same series (the second call reads the
    finished runs back with --resume)."""
    code, out, err = cli(capsys, "train", *args, "--seeds", len(SEEDS), "--quiet", "--json")
    assert code == 0, err
    code, text, err = cli(capsys, "train", *args, "--seeds", len(SEEDS), "--quiet", "--resume")
    assert code == 0, err
    return json.loads(out), text


def check_summary(summary: dict, text: str, scores: dict[str, list[float]]) -> None:
    """Each score of `scores` (name -> one value per seed, in seed order) is in each run's row and
    its mean and sample sd in the summary; the text names each score and ends with mean ± sd."""
    assert [row["seed"] for row in summary["runs"]] == list(SEEDS)
    for name, values in scores.items():
        reported = [row[name] for row in summary["runs"]]
        assert reported == pytest.approx(values, rel=1e-5), name  # (metrics.csv keeps 6 significant digits)
        assert summary["mean"][name] == pytest.approx(np.mean(reported), rel=1e-12)
        assert summary["sd"][name] == pytest.approx(np.std(reported, ddof=1), rel=1e-9, abs=1e-15)
        words = name.replace("_", " ")
        lines = text.strip().splitlines()
        assert all(f"{words} " in line for line in lines), text
        shown = re.search(rf"{words} (\S+) ± ", lines[-1])
        assert shown is not None, text
        assert float(shown[1]) == pytest.approx(np.mean(values), abs=1e-4)  # (printed with 4 decimals)


def test_a_language_models_series_reports_its_validation_loss(tmp_path, capsys):
    out = tmp_path / "series"
    summary, text = series(capsys, tiny_toml(tmp_path, "lm"), "--out", out)
    # No best checkpoint for a language model: its score is the last evaluation's, as metrics.csv has it.
    val_losses = [float(evaluations(out / f"seed-{s}")[-1]["val_loss"]) for s in SEEDS]
    assert val_losses[0] != val_losses[1]  # two seeds, two models
    check_summary(summary, text, {"val_loss": val_losses})


def test_a_text_classifiers_series_reports_its_best_validation_accuracy(tmp_path, capsys):
    out = tmp_path / "series"
    summary, text = series(capsys, tiny_toml(tmp_path, "sst2-bilstm"), "--out", out)
    best = [max(float(r["val_accuracy"]) for r in evaluations(out / f"seed-{s}")) for s in SEEDS]
    check_summary(summary, text, {"best_val_accuracy": best})


def test_an_image_classifiers_series_reports_validation_and_test_accuracy(tmp_path, capsys):
    out = tmp_path / "series"
    vit = ["--set", "model.n_layers=1", "--set", "model.d_model=16", "--set", "model.d_ff=16"]
    steps = [f"--set=train.{k}={v}" for k, v in FEW_STEPS.items()]
    summary, text = series(capsys, "fashion-vit", *MEDIA_IMAGE_DATA, *vit, *steps, "--out", out)
    best = [max(float(r["val_accuracy"]) for r in evaluations(out / f"seed-{s}")) for s in SEEDS]
    tests = []
    for s in SEEDS:
        code, scored, err = cli(capsys, "eval", out / f"seed-{s}", "--split", "test", "--json")
        assert code == 0, err
        tests.append(json.loads(scored)["accuracy"])
    check_summary(summary, text, {"best_val_accuracy": best, "test_accuracy": tests})


def test_a_translation_series_reports_its_best_validation_bleu(tmp_path, capsys):
    out = tmp_path / "series"
    summary, text = series(capsys, tiny_toml(tmp_path, "mt-transformer"), "--out", out)
    best = [max(float(r["val_bleu"]) for r in evaluations(out / f"seed-{s}")) for s in SEEDS]
    check_summary(summary, text, {"best_val_bleu": best})
