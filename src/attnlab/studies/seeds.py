"""One configuration trained with several seeds, and the mean ± sample standard deviation of its scores.

The graph papers report test accuracy as a mean over runs (GAT: 100 runs; GCN: 100 random
initialisations): on 140 labelled nodes a single seed can move the test accuracy by a point.
Each run gets its own folder, `OUT/seed-S`, with seeds `train.seed`, `train.seed + 1`, ...
"""

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.checkpoints import CONFIG
from attnlab.config import flatten
from attnlab.device import resolve_device
from attnlab.studies.sweep import Backend, PlannedRun, RunOutcome, check_writable, summary_line, train_rows
from attnlab.train.config import RunConfig
from attnlab.train.evaluate import evaluate_run
from attnlab.train.signals import StopRequest
from attnlab.train.trainer import TrainResult, check_run_dir, train


@dataclass(frozen=True)
class SeedRun:
    """One seed's run: its training result and, when a split was asked for, the best weights' metrics there."""

    seed: int
    result: TrainResult
    evaluation: dict[str, Any]


def seed_folder(out: Path, seed: int) -> Path:
    """Where the run of `seed` goes: `out/seed-S`. Example: ("runs/cora-gat", 1337) -> runs/cora-gat/seed-1337."""
    return Path(out) / f"seed-{seed}"


def train_seeds(
    config: RunConfig,
    out: str | Path,
    n_seeds: int,
    *,
    split: str | None = None,
    resume: bool = False,
    progress: bool = True,
    stop: StopRequest | None = None,
) -> list[SeedRun]:
    """Train `config` with `n_seeds` consecutive seeds from `config.train.seed`, one after the other,
    each into its own `seed_folder`; evaluate each run's best weights on `split` when given.

    resume: continue the seeds whose folder holds a run, start the others. A stop request ends
    the series after the run it stopped (its checkpoint saved); the runs so far are returned.
    """
    if n_seeds < 1:
        raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
    device = resolve_device(config.train.device)
    runs = []
    for k in range(n_seeds):
        seed = config.train.seed + k
        run_dir = seed_folder(Path(out), seed)
        seeded = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=seed))
        result = train(seeded, run_dir, resume=resume and (run_dir / CONFIG).exists(), progress=progress, stop=stop)
        evaluation = evaluate_run(run_dir, split, device=device)[1] if split else {}
        runs.append(SeedRun(seed, result, evaluation))
        if result.stopped_by is not None:
            break
    return runs


def train_seeds_on(
    backend: Backend,
    config: RunConfig,
    out: str | Path,
    n_seeds: int,
    *,
    split: str | None = None,
    resume: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[SeedRun]:
    """`train_seeds` with the runs on `backend` (e.g. `studies.backends.RayBackend`: every seed at
    once where the cluster has room), into the same folders with the same results; each run's best
    weights are then evaluated here on `split` when given. A stop request ends the series: the runs
    up to the first one it stopped are returned, that one with `stopped_by` set."""
    if n_seeds < 1:
        raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
    runs = []
    for k in range(n_seeds):
        seed = config.train.seed + k
        seeded = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=seed))
        run_dir = seed_folder(Path(out), seed)
        if not (resume and (run_dir / CONFIG).exists()):
            check_run_dir(run_dir, resume=False)
        runs.append(PlannedRun(run_dir.name, run_dir, seeded, flatten(seeded.to_doc())))
    check_writable([run.folder for run in runs])
    say = log or (lambda line: None)
    outcomes = backend.run(runs, say)
    say(summary_line([outcomes.get(run.name, RunOutcome(run.name, "pending")) for run in runs]))
    device = resolve_device(config.train.device)
    done = []
    for run in runs:
        outcome = outcomes.get(run.name)
        if outcome is None or outcome.result is None:  # stopped, or never started
            step = outcome.step if outcome is not None else 0
            logged = train_rows(run.folder) if (run.folder / "metrics.csv").exists() else []
            elapsed = logged[-1].get("elapsed_sec", 0.0) if logged else 0.0  # up to its last log line
            stopped = TrainResult(run.folder, step, {}, None, elapsed, math.nan, stopped_by="a stop request")
            done.append(SeedRun(run.config.train.seed, stopped, {}))
            break
        evaluation = evaluate_run(run.folder, split, device=device)[1] if split else {}
        done.append(SeedRun(run.config.train.seed, outcome.result, evaluation))
    return done


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0 for one value). Example: [1, 2, 3] -> (2.0, 1.0)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
