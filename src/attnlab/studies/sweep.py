"""Many training runs, one after another or several at once, resumably: what `attnlab ablate` and
`attnlab scale` share.

Each run is an ordinary run folder trained by `attnlab.train.train` (no second loop): a finished
run is left as it is, one stopped midway continues from its last checkpoint (the trainer's own
resume), one never started begins. With `jobs` > 1 the runs go to that many worker processes, each
with torch threads = cores / jobs: small models use threads poorly, so two one-thread runs side by
side finish sooner than the same two runs in a row with two threads each.

A run's folder also gets `train.log` (what the trainer reports as it goes) and the study reads its
`metrics.csv` afterwards (`eval_rows`, `train_rows`). SIGINT or SIGTERM: the runs in flight
finish their step, save a checkpoint and stop, no new run starts, and the same command continues.

Where the runs train is a `Backend`: `LocalBackend` (this machine: in this process, or a pool of
worker processes) is the default; `attnlab.studies.backends.RayBackend` sends each run to a Ray
cluster. A run does not know where it trains: the same `PlannedRun`, the same folder, the same losses.
"""

import contextlib
import csv
import math
import multiprocessing
import signal
import tempfile
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from attnlab.checkpoints import CONFIG, has_checkpoint, latest_checkpoint
from attnlab.config import flatten, nest
from attnlab.errors import UserError
from attnlab.names import upgrade
from attnlab.tasks import TASKS
from attnlab.train.config import RunConfig, absolute_path, read_config
from attnlab.train.load import load_run
from attnlab.train.signals import StopRequest
from attnlab.train.trainer import TrainResult, train

LOG = "train.log"
NEW, PARTIAL, DONE = "new", "partial", "done"
# Settings a run may change between sessions without becoming another run.
UNCOMPARED = ("format_version", "train.device")


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study: its name (e.g. "swiglu/seed1"), folder and resolved config, and the
    document it was resolved from (dotted keys: what the study set, to compare with a folder
    that holds a run already)."""

    name: str
    folder: Path
    config: RunConfig
    settings: dict[str, Any]


@dataclass(frozen=True)
class RunOutcome:
    """What became of a planned run: "done" (finished before this call), "trained" (finished
    now), "stopped" (a signal stopped it after a checkpoint) or "pending" (not started)."""

    name: str
    status: str
    step: int = 0
    elapsed_sec: float = math.nan
    result: TrainResult | None = None
    """The trainer's result where the run trained in this call ("trained", "stopped")."""


class Backend(Protocol):
    """Where a sweep's runs train. `run` trains or continues every run of `todo` (none of them
    finished) and returns an outcome per run it got to, by name; it calls `say` with one line as each
    run starts and ends. A signal stops it: the runs keep their last checkpoint, and the ones it did
    not get to are left out."""

    def run(self, todo: Sequence[PlannedRun], say: Callable[[str], None]) -> dict[str, RunOutcome]: ...


@dataclass(frozen=True)
class LocalBackend:
    """This machine: `jobs` = 1 trains the runs one after another in this process, with its torch
    threads as they are; more start that many worker processes (spawned, so a script that uses them
    needs Python's `if __name__ == "__main__":` guard), each with `threads_per_job(jobs)` threads."""

    jobs: int = 1

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")

    def run(self, todo: Sequence[PlannedRun], say: Callable[[str], None]) -> dict[str, RunOutcome]:
        """See `Backend.run`."""
        if self.jobs > 1:
            return _run_in_workers(list(todo), self.jobs, say)
        outcomes = {}
        with StopRequest() as stop:
            for i, run in enumerate(todo):
                if stop.signal_name is not None:
                    break
                say(start_line(run, i, len(todo)))
                outcomes[run.name] = train_one(run, stop)
                say(end_line(outcomes[run.name]))
        return outcomes


def run_status(run: PlannedRun) -> str:
    """NEW (no run in the folder), PARTIAL (a run that has not reached max_iters; it may have no
    checkpoint yet) or DONE."""
    if not (run.folder / CONFIG).exists():
        return NEW
    if has_checkpoint(run.folder) and latest_checkpoint(run.folder).step >= run.config.train.max_iters:
        return DONE
    return PARTIAL


def check_existing(run: PlannedRun) -> None:
    """A `UserError` when `run.folder` holds a run trained with other settings than the planned
    ones (the study's spec changed since): its results would be reported under the wrong name."""
    if not (run.folder / CONFIG).exists():
        return
    saved = flatten(read_config(run.folder).to_doc())
    settings = run.settings
    if "task" in settings:  # a spec may use the old task and kind names; the saved config has today's
        settings = flatten(upgrade(nest(settings.items())))
    # a run folder keeps its data paths absolute (`absolute_path`); the study may give them relative
    paths = {f"data.{name}" for name in getattr(run.config.data, "path_fields", ())}
    for key, value in settings.items():
        if key not in UNCOMPARED and not same_setting(saved.get(key), value, path=key in paths):
            raise UserError(
                f"{run.folder} holds a run with {key} = {saved.get(key)!r}, but this study sets {value!r}; "
                "choose another --out folder (or delete that run to train it again)"
            )


def same_setting(saved: Any, planned: Any, *, path: bool = False) -> bool:
    """Whether a run folder's setting is the study's; a `path` compared as absolute paths."""
    if path and isinstance(saved, str) and isinstance(planned, str):
        return absolute_path(saved) == absolute_path(planned)
    return saved == planned


def threads_per_job(jobs: int) -> int:
    """Torch threads for each of `jobs` runs at once: the cores torch would use (OMP_NUM_THREADS
    where set), shared out, at least one."""
    return max(1, torch.get_num_threads() // jobs)


def run_all(
    runs: Sequence[PlannedRun],
    *,
    jobs: int = 1,
    backend: Backend | None = None,
    log: Callable[[str], None] | None = None,
) -> list[RunOutcome]:
    """Train every run of `runs` that is not finished, on `backend` (default: `LocalBackend(jobs)`,
    this machine, `jobs` at a time); one outcome per run, in order.

    Before any run starts, each folder is checked: a run trained with other settings, or a place
    that cannot be written, is a `UserError` and nothing is written. `log` gets one line as each run
    starts and ends, and a summary at the end."""
    backend = backend if backend is not None else LocalBackend(jobs)
    say = log or (lambda line: None)
    check_writable([run.folder for run in runs])
    outcomes: dict[str, RunOutcome] = {}
    todo = []
    for run in runs:
        check_existing(run)
        if run_status(run) == DONE:
            outcomes[run.name] = RunOutcome(run.name, DONE, run.config.train.max_iters)
        else:
            todo.append(run)
    if outcomes:
        say(f"{len(outcomes)} of {len(runs)} runs finished already; {len(todo)} to train")
    if todo:
        outcomes.update(backend.run(todo, say))
    ordered = [outcomes.get(run.name, RunOutcome(run.name, "pending")) for run in runs]
    say(summary_line(ordered))
    return ordered


def check_writable(folders: Sequence[Path]) -> None:
    """A `UserError` unless every folder of `folders` exists as a writable folder or can be made
    one: its nearest existing parent is a folder where a file can be created (tried, and removed).
    Nothing is left behind either way."""
    tried = set()
    for folder in folders:
        place = Path(folder).absolute()
        while not place.exists() and place != place.parent:
            place = place.parent
        if place in tried:
            continue
        tried.add(place)
        if not place.is_dir():
            raise UserError(
                f"cannot write the results to {folder}: {place} is a file, not a folder; choose another --out"
            )
        try:
            with tempfile.TemporaryFile(dir=place):
                pass
        except OSError as e:
            raise UserError(
                f"cannot write the results to {folder}: {place} is not writable ({e.strerror}); choose another --out"
            ) from None


def summary_line(outcomes: Sequence[RunOutcome]) -> str:
    """One line for a whole sweep: how many runs, how many trained now and finished before, and the
    seconds of training."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    words = {"trained": "trained now", DONE: "finished before", "stopped": "stopped (checkpoint saved)"}
    parts = [f"{n} {words.get(status, status)}" for status, n in counts.items()]
    seconds = [o.elapsed_sec for o in outcomes if o.status == "trained" and not math.isnan(o.elapsed_sec)]
    return f"{len(outcomes)} runs: {', '.join(parts)}" + (f" ({sum(seconds):.1f} s of training)" if seconds else "")


def _run_in_workers(todo: list[PlannedRun], jobs: int, say: Callable[[str], None]) -> dict[str, RunOutcome]:
    context = multiprocessing.get_context("spawn")  # a fork would copy torch's thread pools mid-use
    stop_all = context.Event()
    threads = threads_per_job(jobs)
    say(f"{min(jobs, len(todo))} processes at once, {threads} torch thread(s) each")
    outcomes: dict[str, RunOutcome] = {}
    queue, running = deque(enumerate(todo)), {}
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(threads, stop_all))
    try:
        with StopRequest() as stop:
            while queue or running:
                if stop.signal_name is not None:
                    stop_all.set()  # the workers ignore signals themselves: this asks them all once
                    queue.clear()
                while queue and len(running) < jobs:
                    i, run = queue.popleft()
                    say(start_line(run, i, len(todo)))
                    running[pool.submit(_train_in_worker, run)] = run
                finished, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
                for future in finished:
                    run = running.pop(future)
                    outcomes[run.name] = future.result()
                    say(end_line(outcomes[run.name]))
    except BaseException:
        stop_all.set()  # a failed run (or a second Ctrl-C): the others save and stop, then it is raised
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return outcomes


_WORKER_STOP: Any = None
"""In a worker process: the event the parent sets to stop every run (see `_start_worker`)."""


class _SharedStop:
    """The trainer's stop request (`signal_name`), read from the parent's event in a worker."""

    def __init__(self, event: Any) -> None:
        self.event = event

    @property
    def signal_name(self) -> str | None:
        return "a stop request" if self.event.is_set() else None


def _start_worker(threads: int, stop_all: Any) -> None:
    global _WORKER_STOP
    # Ctrl-C reaches the whole process group; the parent alone decides, and tells every worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(threads)
    _WORKER_STOP = stop_all


def _train_in_worker(run: PlannedRun) -> RunOutcome:
    return train_one(run, _SharedStop(_WORKER_STOP))


def train_one(run: PlannedRun, stop: Any) -> RunOutcome:
    """Train or continue one run; the trainer's messages go to the folder's train.log."""
    resume = (run.folder / CONFIG).exists()
    run.folder.mkdir(parents=True, exist_ok=True)
    with open(run.folder / LOG, "a", encoding="utf-8") as f, contextlib.redirect_stderr(f):
        result = train(run.config, run.folder, resume=resume, progress=False, stop=stop)
    status = "stopped" if result.stopped_by is not None else "trained"
    return RunOutcome(run.name, status, result.step, result.elapsed_sec, result)


def start_line(run: PlannedRun, i: int, n: int) -> str:
    """'[i+1/n] NAME: starting (S steps)', or 'continuing at step K' where it has a checkpoint."""
    step = latest_checkpoint(run.folder).step if has_checkpoint(run.folder) else 0
    how = f"continuing at step {step}" if step else "starting"
    return f"[{i + 1}/{n}] {run.name}: {how} ({run.config.train.max_iters} steps)"


def end_line(outcome: RunOutcome) -> str:
    """The line a sweep prints as a run ends: its steps and training time, or where it stopped."""
    if outcome.status == "stopped":
        return f"{outcome.name}: stopped at step {outcome.step}, checkpoint saved"
    return f"{outcome.name}: {outcome.step} steps in {outcome.elapsed_sec:.1f} s of training"


def eval_rows(run_dir: Path) -> list[dict[str, float]]:
    """The evaluation rows of a run's metrics.csv, as numbers (empty cells left out), in step order."""
    return [_numbers(r) for r in _rows(run_dir) if r["kind"] == "eval"]


def train_rows(run_dir: Path) -> list[dict[str, float]]:
    """The training-log rows of a run's metrics.csv (train_loss, elapsed_sec, ...), as numbers."""
    return [_numbers(r) for r in _rows(run_dir) if r["kind"] == "train"]


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return sorted(csv.DictReader(f), key=lambda r: int(r["step"]))


def _numbers(row: dict[str, str]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k != "kind" and v not in ("", None)}


def steps_per_sec(run_dir: Path) -> float:
    """Optimizer steps per second of training time (evaluation excluded), over the whole run."""
    rows = train_rows(run_dir)
    if not rows or not rows[-1].get("elapsed_sec"):
        return math.nan
    return rows[-1]["step"] / rows[-1]["elapsed_sec"]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a plain-text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
    return [
        "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(line, widths, strict=True)))
        for line in (header, *rows)
    ]


def si(x: float) -> str:
    """A count in three digits: 1234567 -> '1.23M', 20480 -> '20.5k', 512 -> '512'."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def validation_loss(run_dir: Path, *, max_tokens: int | None = None) -> float:
    """A language model run's loss over every block of its validation split (its last weights, on
    the CPU), or over the split's first `max_tokens` tokens: the same text for every run, where
    metrics.csv holds the trainer's estimate from a few random batches."""
    run = load_run(run_dir, checkpoint="last")
    config = run.config
    task = TASKS[config.task](config.data, config.model, run.path, resume=True, batch_size=config.train.batch_size)
    return task.evaluate(run.model, torch.device("cpu"), split="val", max_tokens=max_tokens)["val_loss"]
