"""Every family trains on the GPU through the trainer, as `attnlab train PRESET --set ...` runs it:
in bf16 autocast with fp32 master weights (train.dtype). The GPT also trains in fp16 with its
gradient scaler and through torch.compile, paths that only a CUDA device takes, and resumes on
the device where it stopped."""

import csv
import math
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.train import train
from gpu.families import FAMILIES

pytestmark = pytest.mark.cuda

STEPS = 100  # the tiny BERT classifier's loss leaves ln 2 after about 50 (seconds on a GPU)
SHORT = (
    f"train.max_iters={STEPS}",
    f"train.eval_interval={STEPS}",
    "train.log_interval=10",
    "train.eval_iters=2",
    "train.warmup_iters=2",
)


def train_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["kind"] == "train"]


def check_learned(run_dir: Path, *, skips_allowed: bool = False) -> None:
    """Finite losses at every logged step, and the last three lower on average than the first three
    (tiny models on the fixtures learn that much in STEPS steps; a broken gradient does not)."""
    rows = train_rows(run_dir)
    losses = [float(r["train_loss"]) for r in rows]
    assert len(losses) == STEPS // 10 and all(math.isfinite(x) for x in losses), losses
    assert sum(losses[-3:]) < sum(losses[:3]), losses
    if not skips_allowed:  # a non-finite bf16 step is skipped by the guard, and counted
        assert int(rows[-1]["skipped_steps"]) == 0, rows[-1]


def train_family(name: str, device: torch.device, run_dir: Path, dtype: str, *more: str):
    config = FAMILIES[name].config(*SHORT, f"train.device={device}", f"train.dtype={dtype}", *more)
    return train(config, run_dir, progress=False)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_trains_in_bf16_on_the_device(name, device, tmp_path):
    result = train_family(name, device, tmp_path / "run", "bfloat16")
    assert result.step == STEPS and result.dtype == "bfloat16"
    assert result.best is None or math.isfinite(result.best)
    check_learned(tmp_path / "run")
    # Autocast computes in bf16, the weights stay fp32: the run folder loads onto the device in fp32.
    run = attnlab.load(tmp_path / "run", device=str(device))
    params = list(run.model.parameters())
    assert {p.dtype for p in params} == {torch.float32}
    assert {p.device.type for p in params} == {device.type}


def test_the_gpt_trains_in_fp16_with_a_gradient_scaler(device, tmp_path):
    if device.type != "cuda":
        pytest.skip("fp16 training is for CUDA GPUs (a CPU run is refused: tests/train)")
    result = train_family("gpt", device, tmp_path / "run", "float16")
    assert result.dtype == "float16"
    check_learned(tmp_path / "run", skips_allowed=True)  # the scaler skips overflowing steps as it finds its scale


def test_the_gpt_trains_through_torch_compile(device, tmp_path):
    if device.type != "cuda":
        pytest.skip("torch.compile on the CPU: tests/train/test_compile.py")
    result = train_family("gpt", device, tmp_path / "run", "bfloat16", "train.compile=true")
    assert result.compiled  # False when compilation failed and the trainer fell back to eager
    check_learned(tmp_path / "run")


def test_a_run_stopped_and_resumed_on_the_device_goes_on_as_if_uninterrupted(device, tmp_path):
    # fp32, dropout on (the preset's 0.2): the resumed half needs the optimizer's moments and the
    # device's random state back. Not bit for bit as on the CPU (CUDA's backward kernels add in
    # any order), but within 1e-2, where a lost moment or dropout mask moves the losses far more.
    def losses(name: str, steps: int, resume: bool = False) -> list[float]:
        config = FAMILIES["gpt"].config(
            f"train.max_iters={steps}",
            "train.log_interval=5",
            "train.eval_iters=2",
            f"train.device={device}",
            "train.dtype=float32",
        )
        train(config, tmp_path / name, resume=resume, progress=False)
        return [float(r["train_loss"]) for r in train_rows(tmp_path / name)]

    whole = losses("whole", 40)
    losses("halves", 20)
    resumed = losses("halves", 40, resume=True)
    assert len(resumed) == len(whole) == 8
    assert max(abs(a - b) for a, b in zip(resumed, whole, strict=True)) < 1e-2, (resumed, whole)
