"""A run folder works from any folder: its config names the data by absolute paths (issue 32)."""

import shutil
from pathlib import Path

import pytest

from attnlab.config import read_toml
from attnlab.data.text import bundled_shakespeare
from helpers import cli

pytestmark = pytest.mark.slow

TINY = ["--quiet"] + [
    f"--set={kv}"
    for kv in (
        "train.max_iters=4",
        "train.eval_interval=2",
        "train.eval_iters=1",
        "model.block_size=16",
        "model.n_layers=1",
        "model.d_model=32",
        "model.n_heads=2",
    )
]


def test_a_run_trained_with_a_relative_path_is_used_and_resumed_from_another_folder(capsys, tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    (home / "mytext.txt").write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
    monkeypatch.chdir(home)
    code, _, err = cli(capsys, "train", "shakespeare-char-cpu", "--out", "run", "--set=data.path=mytext.txt", *TINY)
    assert code == 0, err
    assert read_toml(home / "run" / "config.toml")["data"]["path"] == str(home / "mytext.txt")

    monkeypatch.chdir(elsewhere)
    code, out, err = cli(capsys, "eval", home / "run")
    assert code == 0, err
    assert "val_loss" in out
    more = [a.replace("max_iters=4", "max_iters=6") for a in TINY]
    run = home / "run"
    code, out, err = cli(capsys, "train", run / "config.toml", "--out", run, "--resume", *more)
    assert code == 0, err
    assert "trained 6 steps" in out
    more = [a.replace("max_iters=4", "max_iters=8") for a in TINY]
    code, out, err = cli(capsys, "train", run, "--resume", *more)  # the run folder names its config and --out
    assert code == 0, err
    assert "trained 8 steps" in out and f"Run folder: {run}" in out


def test_an_old_run_with_a_relative_path_still_works_where_it_was_trained(capsys, tmp_path, monkeypatch):
    """Run folders written before paths were stored absolute hold the path as it was given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytext.txt").write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
    code, _, err = cli(capsys, "train", "shakespeare-char-cpu", "--out", "run", "--set=data.path=mytext.txt", *TINY)
    assert code == 0, err
    config = tmp_path / "run" / "config.toml"
    config.write_text(config.read_text().replace(str(tmp_path / "mytext.txt"), "mytext.txt"))
    shutil.rmtree(tmp_path / "run" / "data")  # the token cache too: the corpus is read again
    assert 'path = "mytext.txt"' in config.read_text()
    code, out, err = cli(capsys, "eval", Path("run"))
    assert code == 0, err
    assert "val_loss" in out
