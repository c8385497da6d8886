"""The resolved configuration of a run: task, model, data, train.

A TOML document (a preset, a file, or a run folder's config.toml) plus `--set` overrides becomes
a `RunConfig`; the model and data sections are the task's own dataclasses. A run folder's config
is written and read back here (`write_config`, `read_config`).
"""

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.checkpoints import CONFIG, read_config_toml
from attnlab.config import as_dict, build, check_run_keys, dump_toml, merge
from attnlab.errors import CheckpointError, ConfigError
from attnlab.fileio import atomic_write_text
from attnlab.names import DEFAULT_TASK, kind_name, task_name, upgrade, with_model_fields
from attnlab.tasks import TASKS

CONFIG_FORMAT_VERSION = 1
OPTIMIZERS = ("adamw", "adam")


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters on a frozen base (Hu et al. 2021; `attnlab.nn.lora`, `attnlab.train.lora`):
    `[train.lora]`, or `--set train.lora.rank=8`."""

    rank: int = 8
    """r, the rank of each adapter (the paper finds r = 1..8 enough for GPT-3's q and v, §7.2)."""
    alpha: float = 16.0
    """α: the update B A is scaled by α / r."""
    dropout: float = 0.0
    """Dropout on the adapters' input (peft's lora_dropout)."""
    targets: tuple[str, ...] = ("query", "value")
    """The parts adapted in every block: query, key, value, output (attention's out projection),
    ff-in, ff-out, and gate (gated feed-forward layers). The paper's choice is query and value (§7.1)."""

    def __post_init__(self) -> None:
        from attnlab.nn.lora import PARTS  # torch: only where a LoRA config is built

        if self.rank < 1:
            raise ValueError(f"lora.rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.targets:
            raise ValueError(f"lora.targets must name at least one part of {', '.join(PARTS)}")
        for target in self.targets:
            if target not in PARTS:
                raise ValueError(f"lora.targets: {target!r} names no part; the parts are {', '.join(PARTS)}")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"lora.targets names a part twice: {list(self.targets)}")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation recipe. Names follow nanoGPT where it has one."""

    max_iters: int = 2000
    """Optimizer steps to run (training stops here; the schedule is set by lr_decay_iters)."""
    batch_size: int = 12
    """Sequences per micro-batch."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step."""
    learning_rate: float = 1e-3
    """Peak learning rate, reached at the end of warm-up."""
    min_lr: float = 1e-4
    """Learning rate at the end of the cosine decay."""
    warmup_iters: int = 100
    """Steps of linear warm-up."""
    lr_decay_iters: int | None = None
    """Step at which the cosine reaches min_lr; None means max_iters."""
    decay_lr: bool = True
    """False keeps the learning rate constant after warm-up."""
    weight_decay: float = 0.1
    """With optimizer "adamw": decoupled weight decay, on weight matrices only. With "adam": the
    coefficient of an L2 penalty on every parameter (see `attnlab.train.optim.adam_l2`)."""
    optimizer: str = "adamw"
    """"adamw" (Loshchilov & Hutter 2019; the Transformers' recipe) or "adam" (Adam with a coupled
    L2 penalty on all parameters: the GAT and GCN papers' recipe)."""
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables."""
    eval_interval: int = 250
    """Estimate train and val loss (and save a checkpoint) every this many steps."""
    eval_iters: int = 20
    """Batches per split for the loss estimate."""
    log_interval: int = 10
    """Steps between progress updates (each costs a host sync)."""
    seed: int = 1337
    device: str = "auto"
    """"auto", "cpu" or "cuda"."""
    dtype: str = "float32"
    """"float32"; "bfloat16" autocast with fp32 master weights (GPU, and CPUs with bf16 support);
    "float16" autocast with fp32 master weights and a gradient scaler (GPU only); "auto": bfloat16
    where the hardware runs it fast, float32 elsewhere (`attnlab.device.resolve_dtype`; the log
    says which)."""
    schedule: str = "cosine"
    """"cosine": linear warm-up then cosine to min_lr; "inverse_sqrt": the paper's warm-up then
    1/√step decay (Vaswani et al. Eq. 3), peaking at learning_rate."""
    label_smoothing: float = 0.0
    """Label smoothing ε of the training loss (Szegedy et al. 2016; the paper uses 0.1)."""
    compile: bool = False
    """Run the training forward pass through torch.compile. Where compilation is unavailable or
    fails, training goes on without it and says so; the result reports which path ran."""
    fused_kernels: bool | str = "auto"
    """Run the training steps' Transformer blocks, and the gradient clipping with the AdamW step
    (`attnlab.train.optim.ClippingAdamW`), through attnlab's C++ kernels (fp32 on a CPU:
    `attnlab.accel.kernels`); what they do not cover, and every step where they cannot be built, uses
    PyTorch's operators. "auto": on a CPU where `attnlab kernels build` (which `make` runs) has built
    them, so that no run waits a minute for a build; true: built on first use if need be; false:
    PyTorch's operators. A new run records what "auto" chose, so that a resumed run computes as the
    uninterrupted one would; the result reports whether they were on."""
    keep_last: int = 2
    """Checkpoints kept in the run folder's checkpoints/ (the newest K; best.safetensors is kept apart)."""
    max_bad_steps: int = 5
    """A step whose loss or gradient norm is not finite is skipped; this many in a row stop the run
    with an error, its last good checkpoint intact."""
    spike_factor: float = 2.0
    """Warn when a step's loss exceeds this multiple of its running average; 0 disables."""
    patience: int = 0
    """Early stopping: stop when this many evaluations in a row have not improved on the best
    (the task's selection metric); 0 trains to max_iters. GAT §3.3: 100 epochs."""
    watch_loss: bool = False
    """Judge evaluations by val_loss as well as the task's selection metric, as GAT's reference code
    does: an evaluation is progress (restarting the patience) when either reaches its best so far,
    ties included, and its weights become the best when both do. For small validation sets, where
    accuracy ties are common (500 nodes: steps of 0.2%)."""
    ties_count: bool = False
    """Without watch_loss: an evaluation that ties the best selection metric counts as progress
    (restarting the patience) and its weights become the best, where by default only a strict
    improvement does. GAT's reference code stops this way on Citeseer: on validation accuracy
    alone, ties included (its author, in PetarV-/GAT issue 14)."""
    checkpoint_interval: int = 0
    """Save a checkpoint every this many steps; 0: at every evaluation. Either way one is saved
    whenever the selection metric improves (the best weights) and when training stops. For runs
    that evaluate every step (node classification), where writing a checkpoint costs more than
    the step."""
    lora: LoRAConfig | None = None
    """Fine-tune low-rank adapters on the frozen model instead of all its weights (`[train.lora]`;
    None: every weight trains). See docs/training.md, "Fine-tuning with LoRA"."""

    def __post_init__(self) -> None:
        for name in ("max_iters", "warmup_iters"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0 or self.min_lr < 0:
            raise ValueError("learning_rate must be > 0 and min_lr >= 0")
        if self.lr_decay_iters is not None and self.lr_decay_iters < 1:
            raise ValueError(f"lr_decay_iters must be >= 1, got {self.lr_decay_iters}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("grad_clip and weight_decay must be >= 0")
        if self.schedule not in ("cosine", "inverse_sqrt"):
            raise ValueError(f"schedule must be 'cosine' or 'inverse_sqrt', got {self.schedule!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        for name in ("keep_last", "max_bad_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.spike_factor != 0 and self.spike_factor <= 1:
            raise ValueError(f"spike_factor must be > 1 (or 0 to disable), got {self.spike_factor}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.ties_count and self.watch_loss:
            raise ValueError("ties_count is for the selection metric alone; watch_loss already counts ties: set one")
        for name in ("patience", "checkpoint_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if isinstance(self.fused_kernels, str) and self.fused_kernels != "auto":
            raise ValueError(f"fused_kernels must be true, false or 'auto', got {self.fused_kernels!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {self.dtype!r}")

    @property
    def decay_steps(self) -> int:
        return self.max_iters if self.lr_decay_iters is None else self.lr_decay_iters


@dataclass(frozen=True)
class LogConfig:
    """What a run records besides metrics.csv, which it always writes."""

    tensorboard: bool = False
    """Also write TensorBoard event files into the run folder (needs `pip install tensorboard`)."""


@dataclass(frozen=True)
class RunConfig:
    task: str
    model: Any
    data: Any
    train: TrainConfig
    log: LogConfig = field(default_factory=LogConfig)

    def to_doc(self) -> dict[str, Any]:
        return {
            "format_version": CONFIG_FORMAT_VERSION,
            "task": self.task,
            "model": as_dict(self.model),
            "data": as_dict(self.data),
            "train": as_dict(self.train),
            "log": as_dict(self.log),
        }

    def to_toml(self) -> str:
        return dump_toml(self.to_doc())


def resolve(doc: dict[str, Any]) -> RunConfig:
    """Check a TOML document and build its RunConfig. Unknown sections or keys are errors."""
    check_run_keys(doc)
    version = doc.get("format_version", CONFIG_FORMAT_VERSION)
    if version != CONFIG_FORMAT_VERSION:
        raise ConfigError(
            f"config format_version {version!r} is not supported (this attnlab reads {CONFIG_FORMAT_VERSION})"
        )
    doc = upgrade(doc, TASKS)  # today's task and kind names, whichever a saved config was written with
    task = TASKS[doc["task"]]
    return RunConfig(
        task=doc["task"],
        model=build(task.model_config_class(doc.get("model", {})), doc.get("model", {}), "model"),
        data=build(task.data_config_class, doc.get("data", {}), "data"),
        train=build(TrainConfig, doc.get("train", {}), "train"),
        log=build(LogConfig, doc.get("log", {}), "log"),
    )


def write_config(run_dir: Path, config: RunConfig) -> None:
    """Save `config` as the run folder's config.toml (atomically)."""
    atomic_write_text(run_dir / CONFIG, config.to_toml())


def read_config(run_dir: Path) -> RunConfig:
    """The `RunConfig` a run folder saved, checked as `resolve` checks any config; a
    `CheckpointError` where the folder holds no run or its config.toml is not a valid one."""
    try:
        return resolve(read_config_toml(run_dir))
    except ConfigError as e:
        raise CheckpointError(f"{run_dir / CONFIG}: {e}") from None


def absolute_path(value: str) -> str:
    """`value` as `train` stores a config's path: `~` expanded, made absolute against the current folder."""
    return os.path.abspath(os.path.expanduser(value))


def absolute_paths(data: Any) -> Any:
    """`data` with its `path_fields` made absolute against the current folder (`~` expanded): what
    `train` stores, so that a run folder's config.toml names the same files from any folder. (A
    config as written, e.g. an ablation spec, keeps its relative paths until a run starts; a run
    folder written before this holds relative ones, which name the same files as they did from
    the folder it was trained in.)"""
    changes = {}
    for name in getattr(data, "path_fields", ()):
        value = getattr(data, name)
        if value and (absolute := absolute_path(value)) != value:
            changes[name] = absolute
    return dataclasses.replace(data, **changes) if changes else data


def apply_overrides(doc: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`merge`, except that changing `model.kind` starts the model section from that kind's
    defaults (plus the overrides' other model keys): a Transformer's keys mean nothing to an RNN.
    A kind's old name is the same kind (`--set model.kind=transformer` on a translation preset)."""
    doc, overrides = with_model_fields(doc), with_model_fields(overrides)  # `--set model.n_embd=` too
    merged = merge(doc, overrides)
    if "kind" in overrides.get("model", {}):
        task = merged.get("task", DEFAULT_TASK)
        if _kind(task, merged) != _kind(task, doc):
            merged = merge({**doc, "model": {}}, overrides)
    return merged


def _kind(task: Any, doc: dict[str, Any]) -> Any:
    """The document's model.kind by today's name in `task` (as written where it is no kind the task knows)."""
    kind = doc.get("model", {}).get("kind")
    try:
        return kind_name(task_name(task), kind)
    except ConfigError:
        return kind
