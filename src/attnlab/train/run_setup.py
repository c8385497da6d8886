"""Setting up a training run: its folder (new, or resumed with the same data and model), the
ranks of a torchrun job, the device and precision, and the task the run trains.

Rank 0 checks the folder and lets the task write what it derives from the data (tokenizer, data
cache) and the resolved config.toml; the other ranks then read those. A new run whose set-up fails
(a missing corpus, a bad data folder or --init-from) leaves its folder as it found it.
"""

import dataclasses
import shutil
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.accel import kernels
from attnlab.checkpoints import CONFIG, has_checkpoint, latest_checkpoint
from attnlab.device import keep_freed_memory, resolve_device, resolve_dtype
from attnlab.errors import CheckpointError, ConfigError, UserError
from attnlab.tasks import TASKS
from attnlab.train.config import RunConfig, absolute_paths, read_config, write_config
from attnlab.train.distributed import Distributed, preflight, ranks_from_environment
from attnlab.train.precision import Precision


@dataclass
class RunSetup:
    """What a run trains with, once `set_up_run` has prepared it."""

    config: RunConfig
    """As asked for, with the data paths absolute and the model config the task completed."""
    run_dir: Path
    resume: bool
    """Whether the run continues from a checkpoint (False for a folder killed before its first)."""
    ddp: Distributed
    device: torch.device
    dtype: str
    dtype_reason: str
    """Why train.dtype = "auto" chose `dtype`."""
    precision: Precision
    task: Any
    kernels_choice: str | None = None
    """What `choose_kernels` said of attnlab's C++ kernels, if anything: `kernels_line` says it
    for the model."""
    finished: bool = False
    """A resumed run whose checkpoint is at train.max_iters already: nothing left to train."""

    def kernels_line(self, model: nn.Module) -> str | None:
        """The log's line on attnlab's C++ kernels for this run's `model`: "on" only where they
        compute its blocks; what they do compute where that is less; nothing for a finished run,
        or where they compute nothing of it (and a build would not help it)."""
        if self.kernels_choice is None or self.finished:
            return None
        parts = kernels.computed_parts(model)
        if not self.config.train.fused_kernels:  # not built: worth saying where they would compute
            return self.kernels_choice if parts else None
        if "Transformer blocks" in parts:
            return self.kernels_choice  # "on"
        if self.config.train.optimizer == "adamw":
            parts.append("the AdamW step")  # ClippingAdamW's kernel, whatever the model
        if not parts:
            return None
        return f"attnlab's C++ kernels: {' and '.join(parts)} only; the rest of the model on PyTorch's operators"


def set_up_run(config: RunConfig, run_dir: Path, resume: bool, strategy: str = "ddp") -> RunSetup:
    """Check the config against this machine and job, start the ranks (`strategy`: "ddp" or
    "fsdp", `attnlab.train.distributed`), and open the task in `run_dir` (created, or checked for
    --resume)."""
    config = dataclasses.replace(config, data=absolute_paths(config.data))  # a run folder works from anywhere
    tc = config.train
    ddp = Distributed(ranks_from_environment(), strategy)
    # Killed before its first checkpoint: the folder has a config but nothing to resume from.
    restart = resume and (run_dir / CONFIG).exists() and not has_checkpoint(run_dir)
    device = resolve_device(tc.device)
    if device.type == "cpu":
        keep_freed_memory()  # large activations reused, not page-faulted in again at every step
    preflight(config, ddp.world_size, device, strategy)
    if (tc.patience > 0 or tc.watch_loss or tc.ties_count) and TASKS[config.task].selection is None:
        raise ConfigError(
            "train.patience, watch_loss and ties_count need a validation metric to watch; "
            f"a {config.task!r} run has none"
        )
    device = ddp.start(device)  # cuda:LOCAL_RANK under torchrun on GPUs
    dtype, why = resolve_dtype(tc.dtype, device)  # "auto": bf16 where the hardware runs it fast
    precision = Precision(device, dtype)
    # FSDP splits the weight matrices the kernels read whole ("auto": off; true: refused in preflight).
    kernels_setting = False if ddp.shards else tc.fused_kernels
    fused_kernels, kernels_line = choose_kernels(kernels_setting, device, run_dir if resume else None)
    config = dataclasses.replace(
        config, train=dataclasses.replace(tc, fused_kernels=fused_kernels)
    )  # saved with the run
    task = _open_task(config, run_dir, resume, restart, ddp)
    config = dataclasses.replace(config, model=task.model_config)
    resumed = resume and not restart
    finished = resumed and latest_checkpoint(run_dir).step >= tc.max_iters
    return RunSetup(config, run_dir, resumed, ddp, device, dtype, why, precision, task, kernels_line, finished)


def choose_kernels(setting: bool | str, device: torch.device, resumed: Path | None) -> tuple[bool, str | None]:
    """Whether the run's steps take attnlab's C++ kernels (`train.fused_kernels`), and the line
    that says so. "auto" takes them on a CPU where they are built already (a run never waits for a
    build); a resumed run (`resumed`: its folder) keeps what it chose when it started."""
    if resumed is not None and setting == "auto" and (resumed / CONFIG).exists():
        setting = read_config(resumed).train.fused_kernels  # a bool, or "auto" in a run from before it was saved
    if device.type != "cpu":  # CPU kernels: on another device they would compute nothing
        return False, None if setting in (
            "auto",
            False,
        ) else f"attnlab's C++ kernels are for the CPU; on {device.type}, PyTorch's operators"
    if setting == "auto":
        if not kernels.is_built():
            return False, (
                "attnlab's C++ kernels: not built on this machine, so PyTorch's operators; "
                "`attnlab kernels build` (once, about a minute) makes CPU training steps faster"
            )
        setting = True
    if not setting:
        return False, None
    on = kernels.extension() is not None
    return on, "attnlab's C++ kernels: " + ("on" if on else "not built here; PyTorch's operators instead")


def _open_task(config: RunConfig, run_dir: Path, resume: bool, restart: bool, ddp: Distributed) -> Any:
    """The run's task: rank 0 prepares the folder, the other ranks follow; a new run that fails
    here leaves its folder as it found it (absent, or empty), and the folders above it that it made."""
    new_run = not resume and (not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir())))
    existed, missing = run_dir.exists(), _missing_parents(run_dir)
    try:
        return ddp.main_first(
            partial(_prepare_task, config, run_dir, resume, restart), partial(_follow_task, config, run_dir)
        )
    except BaseException:
        if new_run and ddp.is_main:
            _empty(run_dir, keep_folder=existed)
            for folder in missing:  # (deepest first) the runs/ of runs/NAME: a refused command writes nothing
                _remove_if_empty(folder)
        raise


def _missing_parents(path: Path) -> list[Path]:
    """The folders above `path` that do not exist yet, deepest first: ("a/b/run", only . there) -> [a/b, a]."""
    return [parent for parent in path.absolute().parents if not parent.exists()]


def _remove_if_empty(folder: Path) -> None:
    """Remove `folder` if it holds nothing (another process may have put something there since)."""
    try:
        folder.rmdir()
    except OSError:
        pass


def _prepare_task(config: RunConfig, run_dir: Path, resume: bool, restart: bool) -> Any:
    """Rank 0: checks the folder, lets the task write its tokenizer and data cache, writes the config."""
    saved = _prepare_run_dir(config, run_dir, resume)
    if restart:
        sys.stderr.write(f"{run_dir} has no complete checkpoint yet (stopped before its first): starting at step 0\n")
    tc = config.train
    torch.manual_seed(tc.seed)
    task = TASKS[config.task](
        config.data, config.model, run_dir, resume=resume and not restart, batch_size=tc.batch_size
    )
    if saved is not None:
        # The task completes the model config (vocabulary size, label count, a pre-trained
        # encoder's shape), so the comparison is with what it made of the asked-for config.
        _check_same(run_dir, "model", saved.model, task.model_config)
    write_config(run_dir, dataclasses.replace(config, model=task.model_config))
    return task


def _follow_task(config: RunConfig, run_dir: Path) -> Any:
    """The other ranks: read what rank 0 wrote."""
    torch.manual_seed(config.train.seed)
    return TASKS[config.task](config.data, config.model, run_dir, resume=True, batch_size=config.train.batch_size)


def _prepare_run_dir(config: RunConfig, run_dir: Path, resume: bool) -> RunConfig | None:
    """Check that `run_dir` can take this run (new, or resumable with the same data) and create
    it; returns the saved config of a run being resumed."""
    check_run_dir(run_dir, resume)
    saved = None
    if resume:
        saved = read_config(run_dir)
        if saved.task != config.task:
            raise CheckpointError(f"cannot resume: {run_dir} is a {saved.task!r} run, not {config.task!r}")
        _check_same(run_dir, "data", absolute_paths(saved.data), config.data)
    run_dir.mkdir(parents=True, exist_ok=True)
    return saved


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """A new run needs a folder without one; --resume needs one. (The `--nproc` launcher checks
    this too, so that the mistake is one line rather than one per process through torchrun.)"""
    if resume and not (run_dir / CONFIG).exists():
        raise CheckpointError(
            f"cannot resume: {run_dir} holds no run ({CONFIG} is missing); drop --resume to start one"
        )
    if not resume and (run_dir / CONFIG).exists():
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, or choose another --out folder")


def _check_same(run_dir: Path, section: str, saved: Any, wanted: Any) -> None:
    diffs = _differences(saved, wanted) if type(saved) is type(wanted) else [f"kind: {saved!r} vs {wanted!r}"]
    if diffs:
        raise CheckpointError(
            f"cannot resume {run_dir}: its {section} config differs ({'; '.join(diffs)}); "
            f"resume with the same {section} settings or train into a new --out folder"
        )


def _differences(saved: Any, wanted: Any) -> list[str]:
    return [
        f"{f.name}: {getattr(saved, f.name)!r} in the run, {getattr(wanted, f.name)!r} asked for"
        for f in dataclasses.fields(saved)
        if getattr(saved, f.name) != getattr(wanted, f.name)
    ]


def _empty(run_dir: Path, keep_folder: bool) -> None:
    """Remove what a failed set-up wrote into a new run folder (the folder too unless it was there before)."""
    if keep_folder:
        for child in run_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
