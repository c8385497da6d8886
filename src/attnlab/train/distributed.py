"""Data-parallel training on torch.distributed: one process per device, launched by torchrun.

Every process draws the same global batch from the same seeded generator and keeps its own slice
of the rows (`shard`); DistributedDataParallel averages the gradients across processes during the
backward pass. With `train.batch_size` divisible by the number of processes and a loss that is a
mean over equally many tokens per row (language modelling), N processes therefore take the steps
one process takes on the whole batch, up to the order of the floating-point sums. Rank 0 alone
writes the run folder, metrics.csv and the progress bar; the others wait where they must.

The launcher's contract (torchrun sets these): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT. Backend gloo on CPU, nccl on CUDA with `cuda:LOCAL_RANK`.

References: Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training" (VLDB); https://pytorch.org/docs/stable/elastic/run.html (torchrun).
"""

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from attnlab.errors import ConfigError, UserError
from attnlab.train.config import RunConfig
from attnlab.train.precision import check_dtype
from attnlab.train.tensorboard import require_tensorboard


@dataclasses.dataclass(frozen=True)
class Ranks:
    """Where this process stands in the job. A process not launched by torchrun is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launched: bool = False
    """Whether a launcher (torchrun) started this process: then it joins a process group, even
    alone (WORLD_SIZE=1 exercises the same code path on one GPU)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and prints."""
        return self.rank == 0


def ranks_from_environment() -> Ranks:
    """The RANK / WORLD_SIZE / LOCAL_RANK that torchrun exports, or rank 0 of 1 without them."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return Ranks()
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise UserError(
            "RANK, WORLD_SIZE and LOCAL_RANK must be integers; launch with torchrun or attnlab train --nproc N"
        ) from None
    return Ranks(rank, world, local, launched=True)


def check_batch_size(batch_size: int, world_size: int) -> None:
    """Each process takes an equal share of the global batch, so it must divide evenly."""
    if batch_size % world_size:
        raise ConfigError(
            f"train.batch_size = {batch_size} does not divide among {world_size} processes (each takes an "
            f"equal share of the global batch); use a multiple of {world_size}"
        )


def preflight(config: RunConfig, world_size: int, device: torch.device) -> None:
    """The checks each rank makes before it starts, which the `--nproc` launcher makes once too:
    a bad setting is then one line, not one traceback per process through torchrun."""
    check_batch_size(config.train.batch_size, world_size)
    check_dtype(device, config.train.dtype)
    if config.log.tensorboard:
        require_tensorboard()
    if device.type == "cuda" and world_size > torch.cuda.device_count():
        raise ConfigError(
            f"{world_size} processes asked for, but this machine has {torch.cuda.device_count()} CUDA GPU(s); "
            "use one process per GPU, or train.device = 'cpu'"
        )


def launch(nproc: int, argv: list[str]) -> int:
    """Run `python -m attnlab ARGV` as `nproc` processes on this machine under torchrun (the
    arguments unchanged: each process finds its rank in the environment); its exit status.
    torchrun sets OMP_NUM_THREADS=1 in each process unless it is set already."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    # torchrun in a session of its own, so that Ctrl-C reaches this process alone: torchrun answers
    # a signal by SIGTERM-ing its workers and failing with a traceback, while the workers answer
    # one by finishing the step and saving (rank 0). So a signal here goes to the workers directly.
    child = subprocess.Popen([*command, "-m", "attnlab", *argv], start_new_session=True)

    def pass_on(signum: int, frame: object) -> None:
        for pid in _children(child.pid) or [child.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _children(pid: int) -> list[int]:
    """The child process ids of `pid` (Linux /proc; empty where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def shard(batch: Any, rank: int, world_size: int) -> Any:
    """Rank `rank`'s rows of a batch: every tensor (in a tuple, list or dataclass) split along
    dim 0 into `world_size` contiguous parts, as equal as they can be. Example: rows 0..5 for
    2 processes -> rank 0 gets rows 0..2, rank 1 rows 3..5. Non-tensor fields are kept."""
    if isinstance(batch, torch.Tensor):
        return batch.tensor_split(world_size)[rank]
    if isinstance(batch, tuple | list):
        return type(batch)(shard(b, rank, world_size) for b in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(
            batch,
            **{
                f.name: shard(getattr(batch, f.name), rank, world_size)
                for f in dataclasses.fields(batch)
                if isinstance(getattr(batch, f.name), torch.Tensor)
            },
        )
    return batch


class _TaskLoss(nn.Module):
    """The task's training loss as one module call, so that DistributedDataParallel sees exactly
    one forward per micro-batch whichever methods of the model the task calls (the masked-LM
    task calls `encode` and `head`, not `forward`). Holds the model (its parameters are the ones
    DDP synchronises) and, not as a submodule, its torch.compile wrapper."""

    def __init__(self, loss: Callable[[nn.Module, Any], torch.Tensor], model: nn.Module, compiled: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._loss = loss
        self._runs = {"eager": model, "compiled": compiled}
        self.compiled = compiled is not model

    def forward(self, batch: Any) -> torch.Tensor:
        return self._loss(self._runs["compiled" if self.compiled else "eager"], batch)


class Distributed:
    """One process's part in a data-parallel job: the process group, the DDP wrapper and the
    collectives the training loop needs. For a single unlaunched process every method is the
    single-process operation (no process group, no wrapper), so the loop has one code path."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self._owns_group = False

    @property
    def is_main(self) -> bool:
        return self.ranks.is_main

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    def start(self, device: torch.device) -> torch.device:
        """Join the process group (gloo on CPU, nccl on CUDA) and return this rank's device:
        `cuda:LOCAL_RANK` on GPUs, the given device otherwise."""
        if not self.ranks.launched:
            return device
        if device.type == "cuda":
            device = torch.device("cuda", self.ranks.local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():  # a caller may have joined a group already; then it owns it
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            self._owns_group = True
        return device

    def stop(self) -> None:
        """Leave the process group this object joined (after a barrier, so that no rank leaves
        while rank 0 is still writing the last checkpoint)."""
        if self._owns_group and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
            self._owns_group = False

    def main_first(self, work: Callable[[], Any], follow: Callable[[], Any]) -> Any:
        """Rank 0 runs `work` (which may write files) while the others wait; then the others run
        `follow` (which reads them). A UserError on rank 0 stops the others with the same message
        instead of leaving them waiting."""
        if not self.ranks.launched:
            return work()
        if self.is_main:
            try:
                out = work()
            except UserError as e:
                dist.broadcast_object_list([str(e)], src=0)
                raise
            dist.broadcast_object_list([None], src=0)
            return out
        message: list[str | None] = [None]
        dist.broadcast_object_list(message, src=0)
        if message[0] is not None:
            raise UserError(message[0])
        return follow()

    def wrap(self, loss: Callable[[nn.Module, Any], torch.Tensor], model: nn.Module, compiled: nn.Module) -> "StepLoss":
        """The per-micro-batch training loss `batch -> loss`, gradient-synchronised across ranks."""
        inner = _TaskLoss(loss, model, compiled)
        # device_ids=None: the task moves its own batch to the device (non-blocking, from pinned memory).
        outer = nn.parallel.DistributedDataParallel(inner) if self.ranks.launched else inner
        return StepLoss(inner, outer)

    def shard(self, batch: Any) -> Any:
        """This rank's rows of a global batch (the whole batch for one process)."""
        if self.world_size == 1:
            return batch
        part = shard(batch, self.ranks.rank, self.world_size)
        first = next(_tensors(part), None)
        if first is not None and first.shape[0] == 0:
            raise UserError(
                f"a training batch has fewer rows than the {self.world_size} processes; "
                "use fewer processes or larger batches"
            )
        return part

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a tensor over ranks (gloo has no AVG reduction: sum, then divide)."""
        if not self.ranks.launched:
            return value
        value = value.clone()
        dist.all_reduce(value)
        return value / self.world_size

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (e.g. the evaluation results only rank 0 computed)."""
        if not self.ranks.launched:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def rng_states(self, device: torch.device) -> dict[str, Any]:
        """Every rank's RNG state for the checkpoint (a collective: all ranks call it), so that a
        resumed run draws the same dropout masks on every rank as an uninterrupted one."""
        if not self.ranks.launched:
            return {}
        mine = [torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None]
        states: list[Any] = [None] * self.world_size
        dist.all_gather_object(states, mine)
        return {"rank_rng": states}

    def seed(self, seed: int, state: dict[str, Any] | None, device: torch.device) -> None:
        """This rank's dropout RNG: rank 0 keeps the single-process stream; the others take their
        own (the same masks on every rank would correlate their noise). On resume each rank takes
        its saved state, or, where the run had a different number of processes, a fresh seed."""
        if self.ranks.rank == 0:
            return
        saved = (state or {}).get("rank_rng", [])
        if len(saved) == self.world_size:
            cpu, cuda = saved[self.ranks.rank]
            torch.set_rng_state(cpu)
            if cuda is not None and device.type == "cuda":
                torch.cuda.set_rng_state(cuda, device)
            return
        step = (state or {}).get("step", 0)
        torch.manual_seed(seed + 1_000_003 * self.ranks.rank + step)


class StepLoss:
    """`batch -> loss` through the (possibly DDP-wrapped, possibly compiled) model."""

    def __init__(self, inner: _TaskLoss, outer: nn.Module) -> None:
        self._inner, self._outer = inner, outer

    def __call__(self, batch: Any) -> torch.Tensor:
        return self._outer(batch)

    @property
    def compiled(self) -> bool:
        """Whether the loss runs through torch.compile."""
        return self._inner.compiled

    def use_eager(self) -> None:
        """Run the uncompiled model from now on (compilation failed)."""
        self._inner.compiled = False

    @contextlib.contextmanager
    def accumulating(self, last: bool) -> Iterator[None]:
        """Around a micro-batch's forward and backward: gradients are all-reduced only on the
        last micro-batch of a step (DDP's no_sync), the earlier ones accumulate locally."""
        if last or not isinstance(self._outer, nn.parallel.DistributedDataParallel):
            yield
        else:
            with self._outer.no_sync():
                yield


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, tuple | list):
        for b in batch:
            yield from _tensors(b)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for f in dataclasses.fields(batch):
            yield from _tensors(getattr(batch, f.name))
