"""The training loop's guards, on real runs: a step with a non-finite loss or gradient is skipped
(the weights and optimizer state stay exactly as before it), too many in a row stop the run with
its last good checkpoint intact, loss spikes are warned about, and SIGINT stops after a checkpoint.

Faults are injected in-process by a language-modelling task whose loss misbehaves at chosen
steps; the trainer itself is the real one."""

import csv
import math
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import load
from attnlab.checkpoints import TRAIN_STATE, WEIGHTS, complete_steps
from attnlab.config import merge, parse_overrides, read_toml
from attnlab.tasks import TASKS, LanguageModel
from attnlab.train import resolve, train
from attnlab.train.guards import StepGuard, TrainingDiverged
from attnlab.train.signals import StopRequest
from helpers import cli

pytestmark = pytest.mark.slow


class FaultyLM(LanguageModel):
    """Language modelling whose step N (1-based) misbehaves as FAULTS[N] says."""

    name = "lm-faulty"
    FAULTS: dict[int, str] = {}

    def train_batch(self, index: int, generator: torch.Generator):
        self.step = index + 1  # one micro-batch per step in these tests
        return super().train_batch(index, generator)

    def loss(self, model, batch, device, label_smoothing=0.0):
        loss = super().loss(model, batch, device, label_smoothing)
        fault = self.FAULTS.get(self.__dict__.pop("step", None))  # evaluation draws no train_batch
        if fault == "nan_loss":
            return loss * math.nan
        if fault == "spike":
            return loss * 10
        if fault == "inf_grad":
            weight = model.lm_head.weight
            handle = weight.register_hook(lambda g: torch.full_like(g, math.inf))
            weight.register_hook(lambda g: handle.remove())  # once only
        if fault == "sigint":
            signal.raise_signal(signal.SIGINT)
        return loss


@pytest.fixture
def faulty(monkeypatch):
    monkeypatch.setitem(TASKS, FaultyLM.name, FaultyLM)

    def set_faults(faults: dict[int, str]):
        monkeypatch.setattr(FaultyLM, "FAULTS", faults)

    return set_faults


def config(toml: Path, *overrides: str):
    # A fixed schedule (lr_decay_iters), so runs of different lengths share their first steps.
    doc = merge(read_toml(toml), parse_overrides(['task="lm-faulty"', "train.lr_decay_iters=16", *overrides]))
    return resolve(doc)


def train_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["kind"] == "train"]


@pytest.mark.parametrize(
    ("fault", "message"), [("nan_loss", "non-finite loss nan"), ("inf_grad", "non-finite gradient norm inf")]
)
def test_a_non_finite_step_is_skipped_and_changes_nothing(faulty, tiny_toml, tmp_path, capsys, fault, message):
    # Five good steps, against the same five plus a bad sixth: the sixth must not move anything.
    faulty({})
    train(config(tiny_toml, "train.max_iters=5", "train.log_interval=1"), tmp_path / "good", progress=False)
    faulty({6: fault})
    train(config(tiny_toml, "train.max_iters=6", "train.log_interval=1"), tmp_path / "bad", progress=False)
    assert f"step 6: {message}; step skipped (1 in a row, 1 in all)" in capsys.readouterr().err
    good, bad = load_file(tmp_path / "good" / WEIGHTS), load_file(tmp_path / "bad" / WEIGHTS)
    for name in good:
        assert torch.equal(good[name], bad[name]), name
    states = [torch.load(tmp_path / d / TRAIN_STATE, weights_only=True)["optimizer"] for d in ("good", "bad")]
    for slot in states[0]["state"]:
        for key, value in states[0]["state"][slot].items():
            assert torch.equal(value, states[1]["state"][slot][key]), (slot, key)  # incl. Adam's step count
    assert [r["skipped_steps"] for r in train_rows(tmp_path / "bad")] == ["0"] * 5 + ["1"]


def test_bad_steps_in_a_row_stop_the_run_and_keep_the_last_good_checkpoint(faulty, tiny_toml, tmp_path, capsys):
    faulty({5: "nan_loss", 6: "nan_loss", 7: "nan_loss"})
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"3 steps in a row \(steps 5-7\).*last good checkpoint"):
        train(config(tiny_toml, "train.max_iters=12", "train.max_bad_steps=3"), run_dir, progress=False)
    assert complete_steps(run_dir) == [4] and load(run_dir).step == 4

    # The command line: the same stop is a one-line error and exit code 2.
    faulty({1: "nan_loss", 2: "nan_loss"})
    code, _, err = cli(capsys, "train", config_toml(tmp_path, tiny_toml), "--out", tmp_path / "cli", "--quiet")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("attnlab train: error: training diverged: 2 steps in a row")


def config_toml(tmp_path: Path, tiny_toml: Path) -> Path:
    path = tmp_path / "faulty.toml"
    path.write_text(
        tiny_toml.read_text()
        .replace('task = "lm"', 'task = "lm-faulty"')
        .replace("[train]", "[train]\nmax_bad_steps = 2")
    )
    return path


def test_a_loss_spike_is_warned_about_and_ordinary_training_is_not(faulty, tiny_toml, tmp_path, capsys):
    faulty({26: "spike"})
    train(config(tiny_toml, "train.max_iters=28", "train.eval_interval=28"), tmp_path / "run", progress=False)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "loss spike" in line]
    assert len(warnings) == 1 and warnings[0].startswith("step 26: loss spike: "), warnings


def test_step_guard_spike_threshold_against_a_hand_computed_average():
    lines: list[str] = []
    guard = StepGuard(max_bad_steps=3, spike_factor=2.0, log=lines.append)
    for step in range(1, 21):
        assert guard.admit(step, 1.0, 0.5)
    # The running average of twenty 1.0s is 1.0: 1.9 is below twice that, 2.5 above.
    assert guard.admit(21, 1.9, 0.5) and lines == []
    average = 1.0 + (1.9 - 1.0) * 2 / 21  # one step of the exponential average (span 20)
    assert guard.admit(22, 2.5, 0.5)
    assert lines == [f"step 22: loss spike: 2.5000 is {2.5 / average:.1f}x its running average {average:.4f}"]


def test_sigint_finishes_the_step_saves_and_resumes_bit_identically(faulty, tiny_toml, tmp_path):
    common = ("model.dropout=0.1", "train.max_iters=8")
    faulty({3: "sigint"})
    # Python's own handler, even where the suite runs with SIGINT ignored (nohup, a background job).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopRequest() as stop:
            result = train(config(tiny_toml, *common), tmp_path / "split", progress=False, stop=stop)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.stopped_by == "SIGINT" and result.step == 3
    assert complete_steps(tmp_path / "split") == [3]  # saved although 3 is no evaluation step
    faulty({})
    train(config(tiny_toml, *common), tmp_path / "split", resume=True, progress=False)
    train(config(tiny_toml, *common), tmp_path / "straight", progress=False)
    a, b = load_file(tmp_path / "split" / WEIGHTS), load_file(tmp_path / "straight" / WEIGHTS)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_signal_ignored_at_start_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with StopRequest() as stop:
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            signal.raise_signal(signal.SIGTERM)
        assert stop.signal_name is None
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- fp16 with a gradient scaler (the GPU recipe), through the same trainer code on the CPU ---------
# `train.dtype = "float16"` is refused on CPU for users (slow kernels there); these tests lift that
# check, and everything else is what a GPU run executes: autocast to float16, the loss scaled before
# backward, gradients unscaled before clipping, an overflowing step skipped by the scaler (and not
# counted as a bad step by the guard), the scaler's state saved and restored on resume.
INITIAL_SCALE = 2.0**16  # torch.amp.GradScaler's default


@pytest.fixture
def fp16_on_cpu(monkeypatch):
    from attnlab.train import distributed, precision

    monkeypatch.setattr(precision, "check_dtype", lambda device, dtype: None)
    monkeypatch.setattr(distributed, "check_dtype", lambda device, dtype: None)


def test_fp16_overflow_is_the_scalers_to_skip_not_a_bad_step(faulty, fp16_on_cpu, tiny_toml, tmp_path):
    from attnlab.checkpoints import load_train_state

    faulty({3: "inf_grad"})
    fp16 = ("train.dtype=float16", "train.device=cpu", "train.max_bad_steps=1", "train.eval_interval=6")
    run = tmp_path / "run"
    result = train(config(tiny_toml, *fp16, "train.max_iters=6"), run, progress=False)
    # max_bad_steps = 1: had the guard counted the overflow, the run would have stopped at step 3.
    assert result.step == 6 and all(r["skipped_steps"] == "0" for r in train_rows(run))
    scale = load_train_state(run)["grad_scaler"]["scale"]
    assert scale == INITIAL_SCALE / 2  # the injected overflow, skipped by the scaler, halved it
    faulty({})
    resumed = train(config(tiny_toml, *fp16, "train.max_iters=8"), run, resume=True, progress=False)
    assert resumed.step == 8
    # The resumed run carried on from the saved scale (a fresh scaler would be back at 2^16).
    assert load_train_state(run)["grad_scaler"]["scale"] == scale
    assert float(train_rows(run)[-1]["train_loss"]) < float(train_rows(run)[0]["train_loss"])
