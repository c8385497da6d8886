"""What `attnlab train` says when it resumes (the step it resumed from; the steps in all and the new
ones), and that a refused command leaves nothing behind, the runs/ folder of its default --out
included (issue 59)."""

import csv
import json
from pathlib import Path

import pytest

from helpers import assert_user_error, cli, hf_bert_folder

pytestmark = pytest.mark.slow

SHAPE = [
    f"--set={kv}"
    for kv in ("train.eval_interval=3", "train.eval_iters=1", "model.block_size=16", "model.n_layers=1")
    + ("model.d_model=16", "model.n_heads=2")
]


def train_steps(run: Path) -> list[int]:
    with open(run / "metrics.csv", newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row["kind"] == "train"]


def train(capsys, corpus: Path, run: Path, max_iters: int, *extra: str) -> tuple[int, str, str]:
    args = ("shakespeare-char-cpu", "--out", run, f"--set=data.path={corpus}", f"--set=train.max_iters={max_iters}")
    return cli(capsys, "train", *args, *SHAPE, "--set=train.log_interval=1", "--quiet", *extra)


def test_a_resumed_run_says_where_it_resumed_and_how_many_steps_are_new(capsys, corpus, tmp_path):
    run = tmp_path / "run"
    code, out, err = train(capsys, corpus, run, 6)
    assert code == 0, err
    assert "resumed" not in err and out.startswith("trained 6 steps in "), out  # a new run: all its steps are new

    code, out, err = train(capsys, corpus, run, 10, "--resume")
    assert code == 0, err
    assert "resumed from step 6 of 10: 4 steps to train" in err.splitlines()[0], err
    assert out.startswith("trained 10 steps, 4 of them new, in "), out
    assert train_steps(run) == list(range(1, 11))  # the four new steps were trained after the six

    code, out, err = train(capsys, corpus, run, 12, "--resume", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["step"], summary["resumed_from"], summary["new_steps"]) == (12, 10, 2)

    code, out, err = train(capsys, corpus, run, 12, "--resume")  # nothing left: it says so and trains nothing
    assert code == 0, err
    assert "resumed from step 12: train.max_iters is 12, nothing left to train" in err, err
    assert out.startswith("trained 12 steps, 0 of them new, in "), out
    assert train_steps(run) == list(range(1, 13))


def test_a_new_runs_json_says_it_resumed_from_nothing(capsys, corpus, tmp_path):
    code, out, err = train(capsys, corpus, tmp_path / "run", 2, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["resumed_from"] is None and summary["new_steps"] == summary["step"] == 2


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory) -> Path:
    return hf_bert_folder(tmp_path_factory.mktemp("bert") / "bert")


@pytest.mark.parametrize("out", [None, "a/b/run"])
def test_a_refused_init_from_writes_no_folder(bert_folder, capsys, corpus, tmp_path, monkeypatch, out):
    """An encoder is no language model to fine-tune: refused, with neither the run folder nor the
    folders above it that the command would have made (runs/ of the default runs/finetune-lm)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["finetune-lm", "--init-from", bert_folder, f"--set=data.path={corpus}", *SHAPE]
    result = cli(capsys, "train", *args, *(["--out", out] if out else []))
    assert_user_error(result, "--init-from", "an encoder", "does not take")
    assert list(work.iterdir()) == []


def test_a_refused_run_keeps_the_folders_that_were_there(bert_folder, capsys, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "other.txt").write_text("kept", encoding="utf-8")
    result = cli(capsys, "train", "finetune-lm", "--init-from", bert_folder, f"--set=data.path={corpus}", *SHAPE)
    assert_user_error(result, "--init-from")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["other.txt"]


@pytest.mark.parametrize(
    ("path", "fragment"),
    [("no-such-run", "no-such-run does not exist"), ("input.txt", "input.txt is a file but not a checkpoint")],
)
def test_an_init_from_that_is_no_checkpoint_is_refused_before_torch_is_imported(path, fragment, tmp_path):
    from cli.test_early_errors import attnlab

    (tmp_path / "input.txt").write_text("hello\n")
    done = attnlab("train", "finetune-lm", "--init-from", path, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout.strip() == "torch not imported", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab train: error: ") and fragment in lines[0], lines
    assert not (tmp_path / "runs").exists()  # a refused command writes nothing
