"""Sweeps on Ray (`--backend ray`): the same runs, losses and weights as the local backend; a run
whose worker is killed mid-run is retried by Ray from its last checkpoint and ends as if never
stopped; the command line against a cluster at an address. One Ray head for the module, on
loopback with 2 CPUs: starting one takes seconds."""

import csv
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from attnlab.checkpoints import has_checkpoint, latest_checkpoint
from attnlab.config import flatten
from attnlab.data.text import bundled_shakespeare
from attnlab.errors import UserError
from attnlab.studies.backends import RayBackend
from attnlab.studies.sweep import LOG, LocalBackend, PlannedRun, run_all
from attnlab.train import resolve
from helpers import ONE_LAYER_LM, cli, losses

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'attnlab[ray]')")

TINY = {
    "task": "lm",
    "model": {"block_size": 16, "n_layers": 1, "n_heads": 2, "d_model": 32},
    "data": {"path": "corpus.txt", "tokenizer": "char"},
    "train": {
        "max_iters": 20,
        "batch_size": 4,
        "learning_rate": 3e-3,
        "min_lr": 3e-4,
        "warmup_iters": 2,
        "eval_interval": 5,
        "eval_iters": 2,
        "log_interval": 5,
        "device": "cpu",
    },
}


@pytest.fixture(scope="module")
def cluster() -> str:
    """A Ray head in this process, on 127.0.0.1 with 2 CPUs; its address (host:port) for a second driver."""
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """A folder with corpus.txt, made the current one: the configs name their data relatively, which a
    Ray worker (another process, in another folder) must read as this process does."""
    (tmp_path / "corpus.txt").write_text(bundled_shakespeare()[:20_000], encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def plan(root: Path, seeds: list[int], **train) -> list[PlannedRun]:
    """One tiny run per seed, in root/seed-S (a relative folder, as a user's --out usually is)."""
    runs = []
    for seed in seeds:
        doc = {**TINY, "train": {**TINY["train"], **train, "seed": seed}}
        runs.append(PlannedRun(f"seed-{seed}", root / f"seed-{seed}", resolve(doc), flatten(doc)))
    return runs


def assert_same_run(a: Path, b: Path) -> None:
    """The same losses at every logged step and the same final weights, bit for bit."""
    assert losses(a) == losses(b)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(wa[k].equal(wb[k]) for k in wa)


def test_ray_trains_each_run_as_the_local_backend_does(cluster, here):
    lines = []
    on_ray = run_all(plan(Path("ray"), [1, 2]), backend=RayBackend(), log=lines.append)
    local = run_all(plan(Path("local"), [1, 2]), backend=LocalBackend(1))
    assert [(o.name, o.status, o.step) for o in on_ray] == [(o.name, o.status, o.step) for o in local]
    assert [o.status for o in on_ray] == ["trained", "trained"]
    for seed in (1, 2):
        assert_same_run(here / "ray" / f"seed-{seed}", here / "local" / f"seed-{seed}")
        assert re.match(r"ray: .* pid \d+$", (here / "ray" / f"seed-{seed}" / LOG).read_text().splitlines()[0])
    assert losses(here / "ray" / "seed-1") != losses(here / "ray" / "seed-2")  # the seeds differ
    assert lines[0].startswith("2 runs sent to Ray (1 node(s), 2 CPUs")
    ends = [re.match(r"\[(\d)/2\] (seed-\d): 20 steps in [\d.]+ s of training$", line) for line in lines[1:3]]
    assert sorted((m[1], m[2]) for m in ends)[0][0] == "1" and {m[2] for m in ends} == {"seed-1", "seed-2"}
    assert re.match(r"2 runs: 2 trained now \([\d.]+ s of training\)$", lines[3])
    assert len(lines) == 4


def kill_after_a_checkpoint(folder: Path) -> tuple[threading.Thread, dict[str, int]]:
    """A started thread that SIGKILLs the Ray worker training into `folder` (its pid is in the
    folder's train.log) once the run has a checkpoint; what it killed, when, is in the dict."""
    killed: dict[str, int] = {}

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            pids = re.findall(r"pid (\d+)", (folder / LOG).read_text()) if (folder / LOG).exists() else []
            if pids and has_checkpoint(folder):
                killed["step"], killed["pid"] = latest_checkpoint(folder).step, int(pids[0])
                os.kill(killed["pid"], signal.SIGKILL)
            time.sleep(0.02)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread, killed


def test_a_killed_worker_is_retried_and_resumes_from_the_last_checkpoint(cluster, here):
    steps = 500
    run = plan(Path("ray"), [7], max_iters=steps, eval_interval=25)[0]
    killer, killed = kill_after_a_checkpoint(here / run.folder)
    [outcome] = run_all([run], backend=RayBackend(max_retries=2))
    killer.join()
    assert 0 < killed["step"] < steps, killed
    attempts = re.findall(r"pid (\d+)", (here / run.folder / LOG).read_text())
    assert len(attempts) == 2 and int(attempts[0]) == killed["pid"] != int(attempts[1])
    assert (outcome.status, outcome.step) == ("trained", steps)
    # The retry continued the run (no second step-0 evaluation) and ends where an unbroken run does.
    with open(here / run.folder / "metrics.csv", newline="") as f:
        assert [r["step"] for r in csv.DictReader(f)].count("0") == 1
    run_all(plan(Path("local"), [7], max_iters=steps, eval_interval=25))
    assert_same_run(here / "ray" / "seed-7", here / "local" / "seed-7")


def test_a_worker_that_dies_on_every_try_is_one_line_and_the_checkpoint_stays(cluster, here):
    run = plan(Path("ray"), [8], max_iters=500, eval_interval=25)[0]
    killer, killed = kill_after_a_checkpoint(here / run.folder)
    with pytest.raises(UserError, match=r"seed-8: its worker died \(WorkerCrashedError\) on each of 1 tries"):
        run_all([run], backend=RayBackend(max_retries=0))
    killer.join()
    assert latest_checkpoint(here / run.folder).step >= killed["step"] > 0


def test_a_users_mistake_inside_a_run_comes_back_as_itself(cluster, here):
    runs = plan(Path("ray"), [1])
    missing = dataclasses.replace(runs[0].config.data, path="no-such-corpus.txt")
    run = dataclasses.replace(runs[0], config=dataclasses.replace(runs[0].config, data=missing))
    with pytest.raises(UserError, match="no-such-corpus.txt") as caught:
        run_all([run], backend=RayBackend())
    assert type(caught.value).__module__.startswith("attnlab")  # not Ray's wrapper of it


def test_train_seeds_on_a_cluster_at_an_address_from_another_process(cluster, here, capsys):
    toml = here / "tiny.toml"
    toml.write_text(TOML, encoding="utf-8")
    # A second driver: the command line in its own process, connecting to the head by address.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    args = ["train", "tiny.toml", "--seeds", "2", "--out", "ray"]
    done = subprocess.run(
        [sys.executable, "-m", "attnlab", *args, "--backend", "ray", "--address", cluster],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith(("2 runs", "[1/2]", "[2/2]"))]
    assert len(progress) == 4, done.stderr  # sent, one line per run as it ends, the summary
    code, out, err = cli(capsys, *args[:-1], "local")
    assert code == 0, err

    def scores(stdout: str) -> list[str]:
        """Each seed's line without its training time: 'seed 1337: best val loss 3.1234'."""
        return [
            re.sub(r" \(step \d+, [\d.]+s\)$", "", line) for line in stdout.splitlines() if line.startswith("seed ")
        ]

    assert len(scores(out)) == 2 and scores(out) == scores(done.stdout)
    folders = sorted(p.name for p in (here / "ray").glob("seed-*"))
    assert len(folders) == 2 and folders == sorted(p.name for p in (here / "local").glob("seed-*"))
    for name in folders:
        assert_same_run(here / "ray" / name, here / "local" / name)


TOML = ONE_LAYER_LM.format(corpus="corpus.txt")


SPEC = """
base = "base.toml"
seeds = 1
[set]
"train.max_iters" = 16
[variants.narrow]
set = { "model.d_model" = 16 }
[variants.wide]
set = { "model.d_model" = 32 }
"""


def test_ablate_on_ray_gives_the_local_table(cluster, here, capsys):
    (here / "base.toml").write_text(TOML, encoding="utf-8")
    (here / "spec.toml").write_text(SPEC, encoding="utf-8")
    code, out, err = cli(capsys, "ablate", "spec.toml", "--out", "ray", "--backend", "ray")
    assert code == 0, err
    assert re.search(r"^2 runs: 2 trained now", err, re.M) and err.count("steps in") == 2, err
    code, _, err = cli(capsys, "ablate", "spec.toml", "--out", "local")
    assert code == 0, err
    ray_rows, local_rows = (list(csv.DictReader(open(here / d / "ablation.csv"))) for d in ("ray", "local"))
    timing = ("steps_per_sec",)
    assert len(ray_rows) == 2
    assert [{k: v for k, v in r.items() if k not in timing} for r in ray_rows] == [
        {k: v for k, v in r.items() if k not in timing} for r in local_rows
    ]
