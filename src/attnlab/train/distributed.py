"""Data-parallel training on torch.distributed: one process per device, launched by torchrun.

Every process draws the same global batch from the same seeded generator and keeps its own slice
of the rows (`shard`); the gradients are averaged across processes during the backward pass. With
`train.batch_size` divisible by the number of processes and a loss that is a mean over equally
many tokens per row (language modelling), N processes therefore take the steps one process takes
on the whole batch, up to the order of the floating-point sums. Rank 0 alone writes the run
folder, metrics.csv and the progress bar; the others wait where they must.

Two strategies. DistributedDataParallel ("ddp", the default) keeps a whole copy of the model, its
gradients and the optimizer's moments in every process and all-reduces the gradients. Fully
sharded data parallel ("fsdp", PyTorch's `fully_shard`) keeps 1/N of each in each process, gathers
a Transformer block's weights just before its forward and its backward and frees them after, and
reduce-scatters the gradients: N processes hold the training state of a model that one would not.
Checkpoints are the same files either way: a sharded run gathers its weights and optimizer state
onto rank 0, which writes the one-file checkpoint a single process writes, so that `attnlab
sample`, export, and a resume with either strategy and any number of processes read it.

The launcher's contract (torchrun sets these): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT. Backend gloo on CPU, nccl on CUDA with `cuda:LOCAL_RANK`.

References: Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training" (VLDB); Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC20; sharding stage 3); Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling
Fully Sharded Data Parallel" (VLDB); https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html;
https://pytorch.org/docs/stable/elastic/run.html (torchrun).
"""

import collections
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor

from attnlab.errors import ConfigError, UserError
from attnlab.nn.blocks import DecoderBlock, TransformerBlock
from attnlab.train.config import RunConfig
from attnlab.train.precision import check_dtype
from attnlab.train.tensorboard import require_tensorboard

STRATEGIES = ("ddp", "fsdp")
"""How the processes of a job share the training: whole replicas (DDP) or shards (FSDP)."""

T = TypeVar("T")


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


def preflight(config: RunConfig, world_size: int, device: torch.device, strategy: str = "ddp") -> None:
    """The checks each rank makes before it starts, which the `--nproc` launcher makes once too:
    a bad setting is then one line, not one traceback per process through torchrun."""
    check_batch_size(config.train.batch_size, world_size)
    if strategy == "fsdp" and config.train.fused_kernels is True:
        # The kernels read whole weight matrices through data pointers; FSDP holds 1/N of each.
        raise ConfigError(
            "train.fused_kernels = true computes on whole weight matrices, which FSDP splits across "
            "processes; set train.fused_kernels=false (or auto) with --strategy fsdp"
        )
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

    def run(self, work: Callable[[], T]) -> T:
        """`work()`: under FSDP a forward method of the root (`_fully_shard` registers it), so that
        an evaluation, which calls the model directly, finds the root's weights gathered."""
        return work()


class Distributed:
    """One process's part in a data-parallel job: the process group, the DDP or FSDP wrapper and
    the collectives the training loop needs. For a single unlaunched process every method is the
    single-process operation (no process group, no wrapper), so the loop has one code path."""

    def __init__(self, ranks: Ranks, strategy: str = "ddp") -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.ranks, self.strategy = ranks, strategy
        self._owns_group = False
        self._root: _TaskLoss | None = None
        """The sharded loss module under FSDP: evaluations run through it (`evaluation`)."""

    @property
    def shards(self) -> bool:
        """Whether the weights, gradients and optimizer moments are split across the ranks (FSDP
        under a launcher); False for DDP and for a single unlaunched process."""
        return self.strategy == "fsdp" and self.ranks.launched

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
            # gloo's worker threads drop a finished collective's tensors after its wait() returns,
            # and need the GIL for it. The group's destructor, which runs later on whatever frees
            # the DDP wrapper, joins those threads holding the GIL: with one still waiting for it,
            # the process never exits (pytorch/pytorch#56297). Sleeping hands them the GIL now.
            time.sleep(0.1)
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
        """The per-micro-batch training loss `batch -> loss`, gradient-synchronised across ranks.
        Under FSDP this shards `model` in place: build the optimizer after it."""
        inner = _TaskLoss(loss, model, compiled)
        if self.shards:
            self._root = _fully_shard(inner, model)
            return StepLoss(inner, inner)
        # device_ids=None: the task moves its own batch to the device (non-blocking, from pinned memory).
        outer = nn.parallel.DistributedDataParallel(inner) if self.ranks.launched else inner
        return StepLoss(inner, outer)

    def evaluation(self, work: Callable[[], T]) -> T:
        """Rank 0's result of `work` (an evaluation of the model) on every rank. Rank 0 alone runs
        it while the others wait (N copies of the same estimate would share the CPU), except under
        FSDP: there every forward gathers each block's weights from all ranks, so all run it, as a
        forward of the root module, whose hooks gather the weights outside the blocks."""
        if self._root is not None:
            out = self._root.run(work)
            self._root.reshard()  # (the root keeps its weights gathered after a forward, for the backward)
        else:
            out = work() if self.is_main else None
        return self.broadcast(out)

    def whole_weights(self, model: nn.Module, *, gather: bool) -> nn.Module:
        """The module whose weights a checkpoint saves or loads (`attnlab.checkpoints`): the model
        itself, or under FSDP its weights whole on the CPU (`WholeWeights`): with `gather`, the
        model's gathered onto rank 0 (a collective: every rank calls it; the others get an empty
        stand-in), else zeros for `load_weights` to fill and `scatter_weights` to shard."""
        if not self.shards:
            return model
        return WholeWeights(_whole_tensors(model, self.is_main if gather else None))

    def scatter_weights(self, whole: nn.Module, model: nn.Module) -> None:
        """Each rank's shard of the loaded `whole_weights` into the sharded model (nothing to do
        where `whole` is the model itself). Every rank read the same file: no communication."""
        if whole is model:
            return
        assert isinstance(whole, WholeWeights)
        with torch.no_grad():
            for name, tensor in model.state_dict(keep_vars=True).items():
                tensor.copy_(_like(whole.tensors[name], tensor))

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """`optimizer.state_dict()` as one process would hold it: under FSDP each moment gathered
        whole onto rank 0's CPU (a collective), so that the checkpoint resumes under any strategy."""
        state = optimizer.state_dict()
        return _gathered(state, self.is_main) if self.shards else state

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load an `optimizer_state`: under FSDP each moment is sharded as its parameter is."""
        optimizer.load_state_dict(state)
        if not self.shards:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                moments = optimizer.state.get(p, {})
                for key, value in moments.items():
                    if isinstance(p, DTensor) and not isinstance(value, DTensor) and value.shape == p.shape:
                        moments[key] = _like(value, p)

    def sharding_line(self, model: nn.Module) -> str | None:
        """The log's line on what FSDP sharded (None under DDP): the units, and the share of the
        parameters this rank holds."""
        if not self.shards:
            return None
        params = list(model.parameters())  # a tied weight once
        mine = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
        return (
            f"FSDP: {len(_blocks(model))} Transformer blocks and the rest of the model sharded across "
            f"{self.world_size} processes; rank 0 holds {mine:,} of {sum(p.numel() for p in params):,} parameters"
        )

    def full(self, value: torch.Tensor) -> torch.Tensor:
        """A plain tensor of `value`'s whole value: a DTensor (FSDP's gradient norm is one,
        reduced over the ranks' shards) is gathered; anything else is returned as it is."""
        return value.full_tensor() if isinstance(value, DTensor) else value

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
        """Around a micro-batch's forward and backward: gradients are reduced across ranks only
        on the last micro-batch of a step (DDP's no_sync, FSDP's requires_gradient_sync), the
        earlier ones accumulate locally."""
        if isinstance(self._outer, FSDPModule):
            self._outer.set_requires_gradient_sync(last)
            yield
        elif last or not isinstance(self._outer, nn.parallel.DistributedDataParallel):
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


def _fully_shard(root: _TaskLoss, model: nn.Module) -> _TaskLoss:
    """Shard `model` under `root` with FSDP2's `fully_shard`, in place: each Transformer block
    its own unit (its weights gathered for its forward and backward, freed after), then the root,
    which takes the rest (embeddings, final norm, head; a block shared by several layers). Every
    rank starts from rank 0's weights, as DDP's constructor makes them (the ranks' initialisations
    can differ: rank 0 alone prepared the data)."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
    for block in _blocks(model):
        fully_shard(block)
    fully_shard(root)
    register_fsdp_forward_method(root, "run")
    return root


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The model's Transformer blocks that appear once in it: a block shared by several layers
    (block_sharing) runs several forwards a step, and stays with the root's weights."""
    uses = collections.Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    return [m for m in model.modules() if isinstance(m, TransformerBlock | DecoderBlock) and uses[id(m)] == 1]


class WholeWeights(nn.Module):
    """A sharded model's weights as whole CPU tensors under the model's names, a tied weight one
    tensor under each of its names: the module that `attnlab.checkpoints` saves with safetensors'
    `save_model` and fills with `load_model`, which call only `state_dict` and `load_state_dict`.
    So a sharded run writes and reads the very file one process does."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.tensors = tensors

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return dict(self.tensors)

    def load_state_dict(  # type: ignore[override]
        self, state_dict: dict[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> tuple[list[str], list[str]]:
        for name, tensor in state_dict.items():
            mine = self.tensors.get(name)
            if mine is not None and mine.shape != tensor.shape:
                shapes = f"{tuple(tensor.shape)} in the file, {tuple(mine.shape)} here"
                raise RuntimeError(f"size mismatch for {name}: {shapes}")
            if mine is not None:
                mine.copy_(tensor)
        missing = [name for name in self.tensors if name not in state_dict]
        return missing, [name for name in state_dict if name not in self.tensors]


def _whole_tensors(model: nn.Module, keep: bool | None) -> dict[str, torch.Tensor]:
    """The model's state as whole CPU tensors, each tensor of the model once (a tied weight's
    names share it). keep None: zeros of each shape; True: the values, gathered (a collective);
    False: gathered too, so that the ranks' collectives pair up, but not kept (empty tensors)."""
    made: dict[int, torch.Tensor] = {}
    out = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in made:
            if keep is None:
                whole = torch.zeros(tensor.shape, dtype=tensor.dtype)
            else:
                whole = _gathered(tensor.detach(), keep)
            made[id(tensor)] = whole
        out[name] = made[id(tensor)]
    return out


def _gathered(value: Any, keep: bool) -> Any:
    """`value` (a tensor, or a dict or list of them) with every DTensor gathered whole onto the
    CPU where `keep`, else dropped (an empty tensor); every rank must call it in the same order."""
    if isinstance(value, dict):
        return {k: _gathered(v, keep) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_gathered(v, keep) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    whole = value.full_tensor() if isinstance(value, DTensor) else value
    # A copy with a storage of its own: a gathered shard that did not divide evenly is a view into
    # a padded buffer, which safetensors refuses to save for a tied weight.
    return whole.to("cpu", copy=True) if keep else torch.empty(0)


def _like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` placed as `like` is: this rank's shard where `like` is a DTensor (every rank holds
    the same whole tensor: no communication), on its device otherwise."""
    whole = whole.to(like.device, like.dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)
    return whole
