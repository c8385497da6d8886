"""Where a sweep's runs train: this machine (`studies.sweep.LocalBackend`, the default) or a Ray
cluster (`RayBackend`), chosen by name with `make_backend` (`--backend local|ray`).

On Ray each run is one task (`@ray.remote`): the task trains the same `PlannedRun` into the same
folder as the local backend would, so the folders must be on a file system every machine of the
cluster sees at the same path (NFS, a cluster file system), and each machine needs the same Python
environment. Ray retries a task whose worker died (a killed process, a lost machine) up to
`max_retries` times; the retry finds the run's folder and continues from its last checkpoint, and
the trainer's resume is bit-for-bit, so the losses are those of an uninterrupted run.

References: Moritz et al. 2018, "Ray: A Distributed Framework for Emerging AI Applications";
Ray's task API (`ray.remote`, `ray.wait`, `ray.get`, `max_retries`).
"""

import contextlib
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.checkpoints import has_checkpoint, latest_checkpoint
from attnlab.errors import UserError
from attnlab.studies.sweep import LOG, Backend, LocalBackend, PlannedRun, RunOutcome, end_line, train_one
from attnlab.train.signals import StopRequest

BACKENDS = ("local", "ray")
CONNECT_TIMEOUT_S = 10.0
"""How long an --address may take to accept a connection before the sweep gives up."""
GCS_PORT, CLIENT_PORT = 6379, 10001  # Ray's default ports: `ray start --head`, and its ray:// client server


def make_backend(name: str, *, jobs: int = 1, address: str | None = None) -> Backend:
    """The backend `--backend NAME` asks for: "local" (`jobs` runs at once on this machine) or
    "ray" (the cluster at `address`; a new one on this machine where None)."""
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "local":
        if address is not None:
            raise UserError("--address is the Ray cluster's: add --backend ray, or drop --address")
        return LocalBackend(jobs)
    if jobs != 1:
        raise UserError("--jobs is for the local backend; on Ray every run gets its own worker: drop --jobs")
    return RayBackend(address)


def import_ray() -> Any:
    """Ray, or a `UserError` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--backend ray needs Ray: pip install 'attnlab[ray]' (or pip install ray)") from None
    return ray


def check_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A `UserError` unless something accepts a TCP connection at `address` ("host:port",
    "ray://host:port", or a bare host on Ray's default port) within `timeout` seconds; "auto" (the
    cluster this machine belongs to) is left to Ray. Ray itself would retry for a minute or more."""
    if address == "auto":
        return
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        host, port = address.removeprefix("ray://"), str(CLIENT_PORT if client else GCS_PORT)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        why = f"no answer within {timeout:.0f} s" if isinstance(e, TimeoutError) else (e.strerror or str(e)).lower()
        raise UserError(
            f"no Ray cluster answers at {address} ({why}): start one with "
            "`ray start --head --port 6379` and pass its address, e.g. --address HEAD_IP:6379"
        ) from None


@contextlib.contextmanager
def _c_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block: Ray's C++ core writes a warning a second to it
    while it retries a cluster that refuses this process, which the one-line error replaces."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def join_error(address: str, error: BaseException) -> str:
    """What to do where `ray.init(address)` failed: a cluster that asks for a token this process
    lacks (Ray's token authentication), or anything else that answers at the address."""
    chain = []
    while error is not None:
        chain.append(f"{type(error).__name__}: {error}")
        error = error.__cause__
    if any("uthenticat" in link for link in chain):
        return (
            f"the Ray cluster at {address} refused this process's token: give it the head's "
            "(~/.ray/auth_token on the head, as RAY_AUTH_TOKEN or that file here) and RAY_AUTH_MODE=token"
        )
    first = chain[0].splitlines()[0]
    return f"cannot join a Ray cluster at {address} ({first}); pass the address `ray start --head` printed"


@dataclasses.dataclass(frozen=True)
class RayBackend:
    """A Ray cluster: every run is a task of `cpus_per_run` CPUs (its torch threads), retried up to
    `max_retries` times where its worker dies. `address`: the cluster's head ("host:6379") or
    "auto"; None starts a Ray instance on this machine, unless this process is already
    connected (`ray.init` called by the caller), which is then used as it is."""

    address: str | None = None
    cpus_per_run: int = 1
    max_retries: int = 3

    def run(self, todo: Sequence[PlannedRun], say: Callable[[str], None]) -> dict[str, RunOutcome]:
        """See `studies.sweep.Backend.run`: every run is submitted at once; Ray schedules them as
        CPUs free up, and a line is said as each one ends."""
        ray = import_ray()
        connected_here = self._connect(ray)
        try:
            return self._run(ray, todo, say)
        finally:
            if connected_here:
                ray.shutdown()

    def _connect(self, ray: Any) -> bool:
        """Connect to the cluster unless already connected; True where this call connected."""
        if ray.is_initialized():
            return False
        if self.address is not None:
            check_address(self.address)
        try:
            # Quiet: the workers' output is in each run's train.log, and the sweep says what happens.
            with _c_stderr_silenced():
                ray.init(address=self.address, log_to_driver=False, logging_level="warning", include_dashboard=False)
        except ConnectionError as e:
            raise UserError(join_error(self.address or "auto", e)) from None
        return True

    def _run(self, ray: Any, todo: Sequence[PlannedRun], say: Callable[[str], None]) -> dict[str, RunOutcome]:
        task = ray.remote(train_on_worker).options(
            num_cpus=self.cpus_per_run, max_retries=self.max_retries, retry_exceptions=False
        )
        # Absolute folders, and the task works in this folder: relative paths in a config (data.path)
        # mean on the worker what they mean here, and the saved configs are the local backend's.
        cwd = os.getcwd()
        pending = {
            task.remote(dataclasses.replace(run, folder=run.folder.absolute()), cwd, self.cpus_per_run): run
            for run in todo
        }
        cpus, nodes = ray.cluster_resources().get("CPU", 0), len([n for n in ray.nodes() if n["Alive"]])
        say(f"{len(todo)} runs sent to Ray ({nodes} node(s), {cpus:.0f} CPUs, {self.cpus_per_run} per run)")
        outcomes: dict[str, RunOutcome] = {}
        with StopRequest() as stop:
            while pending:
                if stop.signal_name is not None:
                    outcomes.update(_cancel(ray, pending, say))
                    break
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
                for ref in ready:
                    run = pending.pop(ref)
                    outcomes[run.name] = self._outcome(ray, ref, run, pending)
                    say(f"[{len(outcomes)}/{len(todo)}] {end_line(outcomes[run.name])}")
        return outcomes

    def _outcome(self, ray: Any, ref: Any, run: PlannedRun, pending: dict[Any, PlannedRun]) -> RunOutcome:
        """The task's outcome; where it failed, the other runs are cancelled and a user's mistake
        (a `UserError` in the run) or a worker that kept dying is raised as one line."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            _cancel(ray, pending, lambda line: None)
            if isinstance(e.cause, UserError):
                raise e.cause from None
            raise
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError) as e:
            _cancel(ray, pending, lambda line: None)
            raise UserError(
                f"{run.name}: its worker died ({type(e).__name__}) on each of {self.max_retries + 1} tries, "
                f"{run.folder / LOG} says where; the run keeps its last checkpoint and the same command continues it"
            ) from None


def _cancel(ray: Any, pending: dict[Any, PlannedRun], say: Callable[[str], None]) -> dict[str, RunOutcome]:
    """Stop the runs in flight at once (force: a worker stops mid-step); each keeps its last
    checkpoint, where the same command continues it."""
    for ref in pending:
        ray.cancel(ref, force=True)
    outcomes = {}
    for run in pending.values():
        step = latest_checkpoint(run.folder).step if has_checkpoint(run.folder) else 0
        outcomes[run.name] = RunOutcome(run.name, "stopped" if step else "pending", step)
        if step:
            say(end_line(outcomes[run.name]))
    pending.clear()
    return outcomes


def train_on_worker(run: PlannedRun, cwd: str, threads: int) -> RunOutcome:
    """The Ray task: train or continue `run` in the driver's folder `cwd`, with `threads` torch threads."""
    if not Path(cwd).is_dir():
        raise UserError(
            f"{socket.gethostname()} has no folder {cwd}: every machine of the cluster must see the driver's "
            "folders at the same paths (a shared file system)"
        )
    os.chdir(cwd)
    torch.set_num_threads(threads)
    run.folder.mkdir(parents=True, exist_ok=True)
    with open(run.folder / LOG, "a", encoding="utf-8") as f:
        # Which machine and process trained it: a retried run has one line per attempt.
        f.write(f"ray: {time.strftime('%Y-%m-%d %H:%M:%S')} on {socket.gethostname()}, pid {os.getpid()}\n")
    return train_one(run, _NeverStop())  # the local backend's own, so that both train alike


class _NeverStop:
    """A worker's stop request: the driver stops Ray tasks by cancelling them."""

    signal_name = None


__all__ = ["BACKENDS", "RayBackend", "check_address", "import_ray", "make_backend", "train_on_worker"]
