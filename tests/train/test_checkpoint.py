"""The run folder's checkpoints: step folders pruned to train.keep_last, the top level as the newest,
the best kept apart, format-1 folders (before step folders) still read and resumed, and a crafted
pickle refused without running it."""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import load
from attnlab.checkpoints import (
    BEST_MANIFEST,
    BEST_WEIGHTS,
    CHECKPOINTS,
    MANIFEST,
    PAUSE_HOOK,
    TRAIN_STATE,
    WEIGHTS,
    complete_steps,
    file_sha256,
    read_manifest,
    step_dir,
)
from attnlab.config import dump_toml, merge, parse_overrides, read_toml
from attnlab.data.text import bundled_shakespeare
from attnlab.errors import CheckpointError, ConfigError
from attnlab.tasks.trained import saved_model_config
from attnlab.train import resolve, train
from attnlab.train.config import read_config
from helpers import SST2, assert_user_error, cli, encoder_doc, run_config

pytestmark = pytest.mark.slow

FORMAT1 = Path(__file__).parents[1] / "fixtures" / "run-format1"


def test_keep_last_prunes_the_step_folders_and_the_top_level_is_the_newest(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    train(
        run_config(tiny_toml, "train.max_iters=8", "train.eval_interval=2", "train.keep_last=2"),
        run_dir,
        progress=False,
    )
    assert complete_steps(run_dir) == [6, 8]
    assert sorted(p.name for p in (run_dir / CHECKPOINTS).iterdir()) == ["step-000006", "step-000008"]
    assert read_manifest(run_dir) == read_manifest(step_dir(run_dir, 8))
    for name in (WEIGHTS, TRAIN_STATE):  # the same file, not a copy
        assert os.path.samefile(run_dir / name, step_dir(run_dir, 8) / name)
    with pytest.raises(ConfigError, match="keep_last must be >= 1"):
        run_config(tiny_toml, "train.keep_last=0")


def test_corrupt_weights_in_a_step_folder_are_detected(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    train(run_config(tiny_toml, "train.max_iters=4"), run_dir, progress=False)
    (run_dir / MANIFEST).unlink()  # so the step folder is what is read
    path = step_dir(run_dir, 4) / WEIGHTS
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{path} is corrupt"):
        load(run_dir)


def classification_doc(tmp_path: Path) -> dict:
    doc = encoder_doc("classification", SST2, "bilstm")
    return merge(doc, {"model": {"d_embed": 8, "hidden": 8}, "train": {"max_iters": 6, "eval_interval": 2}})


def test_killed_between_the_best_weights_and_best_json_loads_the_new_best(tmp_path):
    """The best is published in two files: a kill between them must not leave an unloadable run."""
    run_dir, toml = tmp_path / "run", tmp_path / "cls.toml"
    toml.write_text(dump_toml(classification_doc(tmp_path)))
    env = {**os.environ, PAUSE_HOOK: "best@2", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "attnlab", "train", str(toml), "--out", str(run_dir), "--quiet"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        if "test hook: paused" in line:
            proc.send_signal(signal.SIGKILL)
            break
    assert proc.wait() == -signal.SIGKILL
    assert (run_dir / BEST_WEIGHTS).exists() and not (run_dir / BEST_MANIFEST).exists()
    assert load(run_dir).step == 2  # the best, from its step folder

    # Resumed, the run repairs its top level: best.json describes best.safetensors again.
    train(resolve(classification_doc(tmp_path)), run_dir, resume=True, progress=False)
    best = read_manifest(run_dir, BEST_MANIFEST)
    assert best == {**read_manifest(run_dir)["best"], "format_version": 2}
    assert file_sha256(run_dir / BEST_WEIGHTS) == best["weights_sha256"] and load(run_dir).step == best["step"]


def test_format1_run_folders_still_load_and_resume(tmp_path, monkeypatch):
    for name in ("lm", "classification"):
        shutil.copytree(FORMAT1 / name, tmp_path / name)
    cls = tmp_path / "classification"
    assert load(cls).step == 4 == load(cls, checkpoint="last").step
    (cls / BEST_WEIGHTS).write_bytes((cls / BEST_WEIGHTS).read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="best.safetensors is corrupt"):
        load(cls)  # best.json of format 1 still vouches for it

    run_dir = tmp_path / "lm"
    assert load(run_dir).step == 4 and not (run_dir / CHECKPOINTS).exists()
    monkeypatch.chdir(tmp_path)  # its data.path is "corpus.txt", relative
    Path("corpus.txt").write_text(bundled_shakespeare()[:4000], encoding="utf-8")
    doc = merge(read_toml(run_dir / "config.toml"), parse_overrides(["train.max_iters=6"]))
    train(resolve(doc), run_dir, resume=True, progress=False)
    assert complete_steps(run_dir) == [6] and read_manifest(run_dir)["format_version"] == 2
    assert load(run_dir).step == 6


class Payload:
    """What an attacker pickles: unpickling it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_every_reader_of_a_run_config_names_the_runs_in_a_study_folder(tmp_path):
    """One reader of config.toml (`checkpoints.read_config_toml`) under the full config, the model
    alone and `attnlab.load`: a study folder passed for a run gets the same pointer from each."""
    study = tmp_path / "study"
    shutil.copytree(FORMAT1 / "classification", study / "bilstm" / "seed0")
    messages = set()
    for read in (load, read_config, saved_model_config):
        with pytest.raises(CheckpointError, match=r"is not a run folder but holds 1 runs \(.*bilstm/seed0\)") as e:
            read(study)
        messages.add(str(e.value))
    assert len(messages) == 1
    assert read_config(study / "bilstm" / "seed0").model == saved_model_config(study / "bilstm" / "seed0")[1]


@pytest.mark.parametrize("container", ["torch.save", "raw pickle"])
def test_a_crafted_pickle_in_the_run_folder_is_refused_unrun(tiny_toml, tmp_path, capsys, container):
    run_dir, marker = tmp_path / "run", tmp_path / "pwned"
    train(run_config(tiny_toml, "train.max_iters=2"), run_dir, progress=False)
    # The attacker replaces the training state and fixes up both manifests, so checksums pass.
    evil = tmp_path / "evil.pt"
    state = {"step": 2, "optimizer": Payload(marker)}
    if container == "torch.save":
        torch.save(state, evil)
    else:
        evil.write_bytes(pickle.dumps(state))
    for folder in (run_dir, step_dir(run_dir, 2)):
        (folder / TRAIN_STATE).unlink()
        shutil.copyfile(evil, folder / TRAIN_STATE)
        manifest = read_manifest(folder)
        manifest["train_state_sha256"] = file_sha256(evil)
        (folder / MANIFEST).write_text(json.dumps(manifest))
    capsys.readouterr()
    result = cli(capsys, "train", tiny_toml, "--out", run_dir, "--resume", "--set", "train.max_iters=4")
    assert_user_error(result, f"{run_dir / TRAIN_STATE} holds pickled objects other than tensors", "refusing")
    if container == "torch.save":
        assert "posix.system" in result[2]
    assert not marker.exists()


def test_resume_before_the_first_checkpoint_starts_over(tiny_toml, tmp_path, capsys):
    """Killed before its first checkpoint, a run has nothing to lose: --resume trains from step 0."""
    run_dir = tmp_path / "run"
    train(run_config(tiny_toml, "train.max_iters=0"), run_dir, progress=False)  # config.toml, no checkpoint
    assert (run_dir / "config.toml").exists() and not complete_steps(run_dir)
    train(run_config(tiny_toml, "train.max_iters=4"), run_dir, resume=True, progress=False)
    assert "no complete checkpoint yet" in capsys.readouterr().err
    train(run_config(tiny_toml, "train.max_iters=4"), tmp_path / "straight", progress=False)
    a, b = (torch.load(d / TRAIN_STATE, weights_only=True)["optimizer"] for d in (run_dir, tmp_path / "straight"))
    assert all(torch.equal(a["state"][i]["exp_avg"], b["state"][i]["exp_avg"]) for i in a["state"])


def corrupt(path: Path) -> None:
    """Flip a byte in place: a hard link to the same file is corrupted with it, as on a real disk."""
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(bytes(data))


def test_corrupt_weights_name_the_intact_steps_and_a_step_loads(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    train(
        run_config(tiny_toml, "train.max_iters=8", "train.eval_interval=2", "train.keep_last=3"),
        run_dir,
        progress=False,
    )
    assert complete_steps(run_dir) == [4, 6, 8]
    corrupt(run_dir / WEIGHTS)  # the newest checkpoint's, also checkpoints/step-000008's (a hard link)
    with pytest.raises(CheckpointError) as error:
        load(run_dir, checkpoint="last")
    message = str(error.value)
    assert f"{run_dir / WEIGHTS} is corrupt" in message and "\n" not in message
    assert "intact checkpoints beside it: steps 4, 6 (load one with --checkpoint 6, or" in message
    run = load(run_dir, checkpoint=6)
    assert run.step == 6
    expected = load_file(str(step_dir(run_dir, 6) / WEIGHTS))
    assert all(torch.equal(run.model.state_dict()[k], v) for k, v in expected.items())
    assert load(run_dir, checkpoint=4).step == 4


def test_a_corrupt_best_names_the_other_steps(tmp_path):
    run_dir = tmp_path / "run"
    train(resolve(merge(classification_doc(tmp_path), {"train": {"keep_last": 5}})), run_dir, progress=False)
    best = read_manifest(run_dir, BEST_MANIFEST)["step"]
    corrupt(run_dir / BEST_WEIGHTS)  # and its step folder's file, the same one
    others = [s for s in complete_steps(run_dir) if s != best]
    assert len(others) >= 2
    with pytest.raises(CheckpointError, match=f"intact checkpoints beside it: steps {', '.join(map(str, others))} "):
        load(run_dir)
    assert load(run_dir, checkpoint=others[0]).step == others[0]


def test_a_step_that_is_not_there_names_those_that_are(tiny_toml, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(run_config(tiny_toml, "train.max_iters=4", "train.eval_interval=2"), run_dir, progress=False)
    capsys.readouterr()  # training's log
    result = cli(capsys, "eval", run_dir, "--checkpoint", "1500")
    assert_user_error(result, f"{run_dir} has no checkpoint at step 1500; its checkpoints are at steps 2, 4")
    assert "best" not in result[2]  # a language model keeps no best weights
    code, out, err = cli(capsys, "eval", run_dir, "--checkpoint", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["step"] == 2
    assert_user_error(cli(capsys, "eval", run_dir, "--checkpoint", "-3"), "expected best, last or a step number")
    with pytest.raises(ValueError, match="checkpoint must be 'best', 'last' or a step"):
        load(run_dir, checkpoint="1500")  # from Python a step is an int


def test_format1_run_folders_load_their_one_step(tmp_path):
    run_dir = shutil.copytree(FORMAT1 / "lm", tmp_path / "lm")
    assert load(run_dir, checkpoint=4).step == 4
    with pytest.raises(CheckpointError, match=r"has no checkpoint at step 5; its checkpoints are at step 4$"):
        load(run_dir, checkpoint=5)
