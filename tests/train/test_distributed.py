"""Distributed data parallel: real torchrun processes (gloo on CPU) against a one-process run."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.checkpoints import WEIGHTS
from attnlab.config import merge, parse_overrides, read_toml
from attnlab.data.parallel import TranslationBatch
from attnlab.errors import ConfigError, UserError
from attnlab.train import resolve, train
from attnlab.train.distributed import Distributed, Ranks, shard
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow

# The same global batch in 1 or 2 processes differs only in the order of the gradient sums (and
# in per-rank dropout, off here): the measured gap on this tiny model is < 1e-6 in 6 steps.
LOSS_TOLERANCE = 1e-4

# A fixed schedule length, so that the run stopped at step 3 and resumed to 6 follows the same
# learning rates as the 6-step run.
SETTINGS = ("train.lr_decay_iters=6", "train.log_interval=1", "train.eval_interval=3", "model.dropout=0.0")


def metric_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def run(command: list[str]) -> None:
    # One thread per process, as torchrun sets it: two processes on a 2-core machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_two_gloo_processes_match_one_process_and_resume(tiny_toml, tmp_path):
    """2 processes (`attnlab train --nproc 2` for 3 steps, then `torchrun -m attnlab train --resume`
    to 6) reach the losses and weights of one process trained for 6 steps on the same batches."""
    doc = merge(read_toml(tiny_toml), parse_overrides([*SETTINGS, "train.max_iters=6"]))
    train(resolve(doc), tmp_path / "one", progress=False)

    two = tmp_path / "two"
    attnlab = [sys.executable, "-m", "attnlab", "train", str(tiny_toml), "--out", str(two), "--quiet"]
    run([*attnlab, "--nproc", "2", *sets(*SETTINGS, "train.max_iters=3")])
    assert [r["step"] for r in metric_rows(two)][-1] == "3"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
    run([*torchrun, *attnlab[2:], "--resume", *sets(*SETTINGS, "train.max_iters=6")])

    one_rows, two_rows = metric_rows(tmp_path / "one"), metric_rows(two)
    # The same rows in the same order: rank 0 alone wrote them (two writers would double each).
    assert [(r["step"], r["kind"]) for r in two_rows] == [(r["step"], r["kind"]) for r in one_rows]
    assert len(one_rows) == 1 + 6 + 2  # the step-0 evaluation, 6 train rows, evaluations at 3 and 6
    for a, b in zip(one_rows, two_rows, strict=True):
        for key in ("train_loss", "val_loss", "lr"):
            if a[key]:
                assert float(b[key]) == pytest.approx(float(a[key]), abs=LOSS_TOLERANCE), (a["step"], key)
    # The losses moved: a run that silently skipped its steps would not match the one above.
    assert float(one_rows[-1]["train_loss"]) < float(one_rows[0]["train_loss"]) - 0.1
    one_w, two_w = load_file(tmp_path / "one" / WEIGHTS), load_file(two / WEIGHTS)
    for name, tensor in one_w.items():
        torch.testing.assert_close(two_w[name], tensor, atol=1e-4, rtol=1e-4, msg=name)


def test_shard_splits_rows_of_tuples_and_dataclasses():
    x, y = torch.arange(12).view(6, 2), torch.arange(6)
    assert torch.equal(shard((x, y), 0, 2)[0], x[:3]) and torch.equal(shard((x, y), 1, 2)[1], y[3:])
    # Rows that do not divide evenly: the first ranks take one more.
    assert [len(shard(y, r, 4)) for r in range(4)] == [2, 2, 1, 1]
    batch = TranslationBatch(src=x, tgt_in=x + 1, tgt_out=x + 2, pad_id=0)
    part = shard(batch, 1, 3)
    assert isinstance(part, TranslationBatch) and part.pad_id == 0
    assert torch.equal(part.src, x[2:4]) and torch.equal(part.tgt_out, x[2:4] + 2)
    # Every rank's rows together are the batch, once each.
    assert torch.equal(torch.cat([shard(x, r, 3) for r in range(3)]), x)


def test_a_rank_trains_on_its_own_rows_and_refuses_an_empty_share():
    x, y = torch.arange(12).view(6, 2), torch.arange(6)
    second = Distributed(Ranks(rank=1, world_size=2, local_rank=1, launched=True))  # shard needs no process group
    part = second.shard((x, y))
    assert torch.equal(part[0], x[3:]) and torch.equal(part[1], y[3:])
    with pytest.raises(UserError, match="fewer rows than the 4 processes"):
        Distributed(Ranks(rank=3, world_size=4, local_rank=3, launched=True)).shard(y[:3])


def test_nproc_mistakes_are_one_line_before_launching(capsys, tiny_toml, tmp_path):
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "run", "--nproc", "3")
    assert_user_error(result, "train.batch_size = 4", "3 processes", "multiple of 3")
    assert not (tmp_path / "run").exists()  # nothing launched, nothing written
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "run", "--nproc", "2", "--resume")
    assert_user_error(result, "cannot resume", "holds no run")


def test_float16_on_cpu_is_a_config_error_naming_bfloat16(tiny_toml, tmp_path):
    doc = merge(read_toml(tiny_toml), parse_overrides(["train.dtype=float16", "train.device=cpu"]))
    with pytest.raises(ConfigError, match="bfloat16"):
        train(resolve(doc), tmp_path / "run", progress=False)


@pytest.mark.parametrize("fast_bf16", [False, True])
def test_bf16_on_a_cpu_without_bf16_kernels_trains_with_a_one_line_warning(tiny_toml, tmp_path, capsys, fast_bf16):
    import attnlab.device

    attnlab.device.cpu_has_bf16_matmul.cache_clear()
    original = torch.ops.mkldnn._is_mkldnn_bf16_supported
    try:
        torch.ops.mkldnn._is_mkldnn_bf16_supported = lambda: fast_bf16  # what PyTorch's dispatch asks
        doc = merge(read_toml(tiny_toml), parse_overrides(["train.dtype=bfloat16", "train.max_iters=2"]))
        train(resolve(doc), tmp_path / "run", progress=False)
    finally:
        torch.ops.mkldnn._is_mkldnn_bf16_supported = original
        attnlab.device.cpu_has_bf16_matmul.cache_clear()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "bfloat16" in line]
    if fast_bf16:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "train.dtype=float32" in warnings[0]
    assert (tmp_path / "run" / WEIGHTS).exists()  # a warning, not a refusal: the run trained


def test_sigterm_to_the_launcher_stops_every_rank_at_one_step_and_saves(tiny_toml, tmp_path):
    """`attnlab train --nproc 2` sent SIGTERM: the workers finish the same step, rank 0 saves, the
    job exits 0 with one line naming the resume command (no torchrun traceback)."""
    import signal

    from attnlab.checkpoints import has_checkpoint, load_train_state

    out = tmp_path / "job"
    command = [sys.executable, "-m", "attnlab", "train", str(tiny_toml), "--out", str(out), "--nproc", "2"]
    command += sets("train.max_iters=100000", "train.eval_interval=100000", "model.dropout=0.0")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:  # the step-0 evaluation: both ranks are in the training loop
        if line.startswith("step 0:"):
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, rest
    assert "Traceback" not in rest and "SignalException" not in rest
    stopped = [line for line in rest.splitlines() if line.startswith("attnlab train: stopped at step")]
    assert len(stopped) == 1 and "(SIGTERM)" in stopped[0] and "--nproc 2" in stopped[0] and "--resume" in stopped[0]
    step = int(stopped[0].split("step ")[1].split()[0])
    assert has_checkpoint(out) and load_train_state(out)["step"] == step > 0


def test_a_worker_under_a_launcher_writes_all_its_output_before_it_leaves():
    """A process with torchrun's RANK and WORLD_SIZE leaves as any other does: what it printed to a
    pipe arrives whole, with its exit status."""
    command = [sys.executable, "-m", "attnlab", "data", "list"]
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a pipe is by default
    alone = subprocess.run(command, capture_output=True, text=True, env=buffered, timeout=120)
    worker_env = {**buffered, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    worker = subprocess.run(command, capture_output=True, text=True, env=worker_env, timeout=120)
    assert alone.returncode == worker.returncode == 0
    assert worker.stdout == alone.stdout and "tinyshakespeare" in worker.stdout
    download = [*command[:3], "data", "download", "no-such-set"]
    refused = subprocess.run(download, capture_output=True, text=True, env=worker_env, timeout=120)
    assert refused.returncode == 2 and "no-such-set" in refused.stderr
