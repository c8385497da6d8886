"""A real `attnlab train` process, killed: SIGKILL in the middle of a checkpoint write (held there by
the writer's test hook) and at random moments, then resumed; and SIGTERM, which saves and exits 0.
After every kill the run folder must load, and the resumed run must end with the very weights of a
run that was never interrupted."""

import contextlib
import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import load
from attnlab.checkpoints import (
    CHECKPOINTS,
    MANIFEST,
    PAUSE_HOOK,
    WEIGHTS,
    complete_steps,
    file_sha256,
    read_manifest,
    step_dir,
)
from attnlab.config import merge, parse_overrides, read_toml
from attnlab.train import resolve, train

pytestmark = pytest.mark.slow

SETTINGS = ("model.dropout=0.1", "train.max_iters=10", "train.eval_interval=2", "train.lr_decay_iters=10")


def start(toml: Path, run_dir: Path, *settings: str, hook: str | None = None, resume: bool = True):
    """`attnlab train` in a child process (one thread, as the tests' own runs), stderr piped."""
    env = {k: v for k, v in os.environ.items() if k != PAUSE_HOOK} | {"OMP_NUM_THREADS": "1"}
    if hook is not None:
        env[PAUSE_HOOK] = hook
    command = [sys.executable, "-m", "attnlab", "train", str(toml), "--out", str(run_dir), "--quiet"]
    command += [f"--set={s}" for s in settings] + (["--resume"] if resume else [])
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def kill_when_paused(proc: subprocess.Popen) -> None:
    for line in proc.stderr:
        if "test hook: paused" in line:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return
    raise AssertionError(f"the writer never reached the hook (exit code {proc.wait()})")


def kill_after_first_row(proc: subprocess.Popen, metrics: Path, after_step: int, timeout: float = 300.0) -> None:
    """SIGKILL `proc` once metrics.csv has a row past `after_step` (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(FileNotFoundError):
            rows = list(csv.DictReader(metrics.read_text().splitlines()))
            if any(int(r["step"]) > after_step for r in rows if r.get("step")):
                proc.send_signal(signal.SIGKILL)
                break
        time.sleep(0.005)
    proc.wait()


def weights_equal(a: Path, b: Path) -> bool:
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigkill_anywhere_then_resume_ends_as_an_uninterrupted_run(tiny_toml, tmp_path):
    straight, run_dir = tmp_path / "straight", tmp_path / "run"
    train(resolve(merge(read_toml(tiny_toml), parse_overrides(list(SETTINGS)))), straight, progress=False)

    # Killed while writing the step-4 checkpoint: weights written, manifest not. Step 2 is what's left.
    kill_when_paused(start(tiny_toml, run_dir, *SETTINGS, hook="staging@4", resume=False))
    assert [p.name for p in (run_dir / CHECKPOINTS).glob(".staging-*/*")] == [WEIGHTS, "train_state.pt"]
    assert complete_steps(run_dir) == [2] and load(run_dir).step == 2

    # Killed while publishing step 6 at the top: model.safetensors is step 6's, checkpoint.json still
    # says 4 (the folder old attnlab left unloadable). The complete step-6 folder is what's loaded.
    kill_when_paused(start(tiny_toml, run_dir, *SETTINGS, hook="publish@6"))
    assert read_manifest(run_dir)["step"] == 4 and complete_steps(run_dir)[-1] == 6
    assert file_sha256(run_dir / WEIGHTS) == read_manifest(step_dir(run_dir, 6))["weights_sha256"]
    assert load(run_dir).step == 6

    # Killed while training, as soon as the resumed run logs its first metrics row (a fixed sleep
    # landed before training started on a busy machine; benchmarks/soak.py kills at random moments
    # many times): whatever was under way, the folder still loads.
    proc = start(tiny_toml, run_dir, *SETTINGS)
    kill_after_first_row(proc, run_dir / "metrics.csv", after_step=6)
    assert proc.returncode == -signal.SIGKILL  # killed mid-run, not after it finished
    assert load(run_dir).step >= 6

    proc = start(tiny_toml, run_dir, *SETTINGS)
    assert proc.wait() == 0, proc.stderr.read()
    assert weights_equal(run_dir / WEIGHTS, straight / WEIGHTS)
    assert complete_steps(run_dir) == [8, 10] and not list((run_dir / CHECKPOINTS).glob(".*"))
    for step in complete_steps(run_dir):
        manifest = read_manifest(step_dir(run_dir, step))
        assert file_sha256(step_dir(run_dir, step) / WEIGHTS) == manifest["weights_sha256"]
    assert json.loads((run_dir / MANIFEST).read_text())["step"] == 10


def test_sigterm_saves_and_exits_0_with_the_command_that_continues(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    common = ("model.dropout=0.1", "train.eval_interval=1000", "train.lr_decay_iters=50")
    settings = (*common, "train.max_iters=100000")
    proc = start(tiny_toml, run_dir, *settings, resume=False)
    deadline = time.monotonic() + 120
    while not _train_rows(run_dir) >= 3 and time.monotonic() < deadline:  # under way
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out == ""
    last = err.strip().splitlines()[-1]
    found = re.fullmatch(
        r"attnlab train: stopped at step (\d+) \(SIGTERM\); checkpoint saved, continue with: (.*)", last
    )
    assert found, last
    step = int(found.group(1))
    assert shlex.split(found.group(2)) == [
        "attnlab",
        "train",
        str(tiny_toml),
        *(w for s in settings for w in ("--set", s)),
        "--out",
        str(run_dir),
        "--resume",
    ]
    assert complete_steps(run_dir) == [step] and load(run_dir).step == step  # saved though no eval step

    # The saved state continues exactly: two steps more equal a straight run of step + 2.
    config = resolve(merge(read_toml(tiny_toml), parse_overrides([*common, f"train.max_iters={step + 2}"])))
    train(config, run_dir, resume=True, progress=False)
    train(config, tmp_path / "straight", progress=False)
    assert weights_equal(run_dir / WEIGHTS, tmp_path / "straight" / WEIGHTS)


def _train_rows(run_dir: Path) -> int:
    path = run_dir / "metrics.csv"
    return path.read_text().count(",train,") if path.exists() else 0
