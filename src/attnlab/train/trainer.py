"""One model-agnostic training loop (after minGPT's Trainer and nanoGPT's train.py).

The task supplies batches, the loss and the evaluation; the loop supplies AdamW, the warm-up +
cosine schedule, gradient accumulation and clipping, periodic evaluation and checkpoints, a
progress bar and metrics.csv (and TensorBoard events); a step whose loss or gradient is not finite
is skipped (guards.py), and a SIGINT/SIGTERM stops the run after a checkpoint (signals.py). Seeded:
the same config gives the same losses on CPU, and a run resumed from a checkpoint continues
bit-for-bit as if it had never stopped. Launched by torchrun, each process trains on its share of
every batch (see `train.distributed`).
"""

import csv
import dataclasses
import math
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from attnlab.device import autocast, keep_freed_memory, resolve_device, resolve_dtype, slow_dtype_note
from attnlab.errors import CheckpointError, ConfigError, UserError
from attnlab.nn import collect_aux_loss, kernels, moe_stats
from attnlab.progress import ProgressLines
from attnlab.tasks import TASKS
from attnlab.train.checkpoint import (
    CONFIG,
    has_checkpoint,
    load_train_state,
    load_weights,
    read_config,
    save_checkpoint,
    write_config,
)
from attnlab.train.config import RunConfig, TrainConfig, absolute_paths
from attnlab.train.distributed import Distributed, preflight, ranks_from_environment
from attnlab.train.guards import StepGuard, grad_norm
from attnlab.train.optim import adam_l2, adamw
from attnlab.train.precision import Precision
from attnlab.train.schedules import inverse_sqrt, warmup_cosine
from attnlab.train.signals import StopRequest
from attnlab.train.tensorboard import MetricsSinks, TensorBoardLog

PROGRESS_EVERY_S = 30.0  # seconds between progress lines where no bar is drawn

METRICS_FIELDS = [
    "step",
    "kind",
    "train_loss",
    "val_loss",
    "val_bleu",
    "val_accuracy",
    "val_ppl",
    "lr",
    "tokens_per_sec",
    "elapsed_sec",
    "skipped_steps",
    "aux_loss",
    "dropped_tokens",
]


def _plus_aux(loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """The task's loss plus the auxiliary losses a mixture of experts gathered in this forward
    (the load-balancing and z-losses), which a task's loss does not know of."""
    aux = collect_aux_loss(model)
    return loss if aux is None else loss + aux


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    metrics: dict[str, float]
    """The last evaluation's results (e.g. train_loss, val_loss, val_bleu)."""
    best: float | None
    """Best value of the task's selection metric (val_loss for LM, val_bleu for translation)."""
    elapsed_sec: float
    tokens_per_sec: float
    compiled: bool = False
    """Whether the training steps ran through torch.compile (False where it was not asked for or failed)."""
    fused_kernels: bool = False
    """Whether attnlab's C++ kernels were on (train.fused_kernels, where they could be built)."""
    dtype: str = "float32"
    """The precision the steps ran in (what train.dtype = "auto" chose)."""
    stopped_by: str | None = None
    """The signal ("SIGINT", "SIGTERM") that stopped the run early, after saving; None if it finished."""

    @property
    def val_loss(self) -> float:
        return self.metrics.get("val_loss", math.nan)

    @property
    def train_loss(self) -> float:
        return self.metrics.get("train_loss", math.nan)


def _differences(saved: Any, wanted: Any) -> list[str]:
    return [
        f"{f.name}: {getattr(saved, f.name)!r} in the run, {getattr(wanted, f.name)!r} asked for"
        for f in fields(saved)
        if getattr(saved, f.name) != getattr(wanted, f.name)
    ]


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


class MetricsLog:
    """metrics.csv, appended to; on resume the rows after the checkpoint's step are dropped (that
    work is being redone)."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
            self._rewrite(rows)
        elif resume_step is None:
            self._rewrite([])

    def _rewrite(self, rows: list[dict]) -> None:
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, METRICS_FIELDS)
            writer.writeheader()
            writer.writerows(rows)

    def write(self, **row: Any) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, METRICS_FIELDS).writerow({k: _fmt(v) for k, v in row.items()})


def _last_evaluation(path: Path) -> dict[str, float]:
    """The results of the last evaluation metrics.csv records (val_loss, val_bleu, ...), or {}."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        evals = [r for r in csv.DictReader(f) if r["kind"] == "eval"]
    if not evals:
        return {}
    skip = {"step", "kind", "lr", "tokens_per_sec", "elapsed_sec", "skipped_steps"}
    return {k: float(v) for k, v in evals[-1].items() if k not in skip and v not in ("", None)}


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def train(
    config: RunConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop: StopRequest | None = None,
) -> TrainResult:
    """Train the model `config` describes into `run_dir` (created), or continue it with `resume`.

    stop: once its signal has arrived (on any rank), the loop saves a checkpoint after the current
    step and returns.
    Under torchrun (RANK, WORLD_SIZE in the environment) this is one rank of a data-parallel job:
    every rank returns the same result; rank 0 alone writes the run folder."""
    run_dir = Path(run_dir)
    config = dataclasses.replace(config, data=absolute_paths(config.data))  # a run folder works from anywhere
    tc = config.train
    ddp = Distributed(ranks_from_environment())
    # Killed before its first checkpoint: the folder has a config but nothing to resume from.
    restart = resume and (run_dir / CONFIG).exists() and not has_checkpoint(run_dir)
    device = resolve_device(tc.device)
    if device.type == "cpu":
        keep_freed_memory()  # large activations reused, not page-faulted in again at every step
    preflight(config, ddp.world_size, device)
    if (tc.patience > 0 or tc.watch_loss) and TASKS[config.task].selection is None:
        raise ConfigError(
            f"train.patience and train.watch_loss need a validation metric to watch; a {config.task!r} run has none"
        )
    device = ddp.start(device)  # cuda:LOCAL_RANK under torchrun on GPUs
    dtype, why = resolve_dtype(tc.dtype, device)  # "auto": bf16 where the hardware runs it fast
    precision = Precision(device, dtype)
    fused_kernels, kernels_line = choose_kernels(tc.fused_kernels, device, run_dir if resume else None)
    tc = dataclasses.replace(tc, fused_kernels=fused_kernels)
    config = dataclasses.replace(config, train=tc)  # the choice is saved with the run

    def prepare() -> Any:  # rank 0: checks the folder, writes tokenizer, data cache and config
        saved = _prepare_run_dir(config, run_dir, resume)
        if restart:
            sys.stderr.write(
                f"{run_dir} has no complete checkpoint yet (stopped before its first): starting at step 0\n"
            )
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

    def follow() -> Any:  # the other ranks: read what rank 0 wrote
        torch.manual_seed(tc.seed)
        return TASKS[config.task](config.data, config.model, run_dir, resume=True, batch_size=tc.batch_size)

    # A new run that fails while setting up (a missing corpus, a bad data folder or --init-from)
    # leaves its folder as it found it: absent, or empty.
    new_run = not resume and (not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir())))
    existed = run_dir.exists()
    try:
        task = ddp.main_first(prepare, follow)
    except BaseException:
        if new_run and ddp.is_main:
            _empty(run_dir, keep_folder=existed)
        raise
    config = dataclasses.replace(config, model=task.model_config)
    resume = resume and not restart

    model = task.build_model()
    if not resume and hasattr(task, "initialize"):
        task.initialize(model)  # e.g. a pre-trained encoder's weights for fine-tuning
    model = model.to(device)
    if device.type == "cuda":
        # TF32 tensor cores for the float32 matmuls that autocast leaves (and all of them in fp32 runs).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    step_model = _compiled(model) if tc.compile else model  # what the training loss runs through
    step_loss = ddp.wrap(
        lambda m, batch: _plus_aux(task.loss(m, batch, device, tc.label_smoothing), m), model, step_model
    )
    if tc.optimizer == "adam":
        optimizer = adam_l2(model, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay)
    else:
        optimizer = adamw(
            model,
            lr=tc.learning_rate,
            betas=(tc.beta1, tc.beta2),
            weight_decay=tc.weight_decay,
            device=device,
            kernel=tc.fused_kernels,  # the clipping and AdamW step as well as the blocks
        )
    batches = torch.Generator().manual_seed(tc.seed)
    selection = task.selection  # (metric, "min" | "max") that picks the best checkpoint, or None
    step, elapsed, best = 0, 0.0, None
    stale = 0  # evaluations in a row without progress (early stopping, train.patience)
    peaks: dict[str, float] = {}  # with train.watch_loss: the best selection metric and val_loss seen so far
    state: dict[str, Any] = {}
    if resume:
        load_weights(run_dir, model)
        state = load_train_state(run_dir)
        optimizer.load_state_dict(state["optimizer"])
        batches.set_state(state["batch_rng"])
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng"):
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        precision.load_state_dict(state.get("grad_scaler", {}))
        step, elapsed, best = state["step"], state["elapsed_sec"], state.get("best")
        stale, peaks = state.get("stale", 0), state.get("peaks", {})
    ddp.seed(tc.seed, state, device)
    metrics = _metrics_sinks(config, run_dir, step if resume else None) if ddp.is_main else MetricsSinks()

    def evaluate(at_step: int) -> dict[str, float]:
        out = None
        if ddp.is_main:  # the others wait for its results: N copies of the same estimate would share the CPU
            model.eval()
            with torch.no_grad(), autocast(device, dtype):
                out = task.evaluate_during_training(
                    model, device, step=at_step, eval_iters=tc.eval_iters, seed=tc.seed, log=log
                )
            model.train()
        return ddp.broadcast(out)

    def judge(results: dict[str, float]) -> tuple[bool, bool]:
        """Whether these weights are the new best, and whether the evaluation is progress (it
        restarts the patience). Alone, the selection metric decides both, strictly. With
        train.watch_loss, as GAT's reference code: progress when the metric or val_loss reaches
        its best so far (ties included), a new best when both do."""
        if selection is None:
            return False, False
        metric, mode = selection
        at_least = (lambda a, b: a <= b) if mode == "min" else (lambda a, b: a >= b)
        if not tc.watch_loss:
            better = best is None or (results[metric] < best if mode == "min" else results[metric] > best)
            return better, better
        if "val_loss" not in results:
            raise ConfigError(f"train.watch_loss needs a val_loss, which a {config.task!r} run does not report")
        reached = {
            metric: metric not in peaks or at_least(results[metric], peaks[metric]),
            "val_loss": "val_loss" not in peaks or results["val_loss"] <= peaks["val_loss"],
        }
        peaks.update({k: results[k] for k, hit in reached.items() if hit})
        return all(reached.values()), any(reached.values())

    def checkpoint(best_record: dict[str, Any] | None = None) -> None:
        state = {
            **guard.state_dict(),
            "step": step,
            "elapsed_sec": elapsed,
            "best": best,
            "stale": stale,
            "peaks": peaks,
            "optimizer": optimizer.state_dict(),
            "batch_rng": batches.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
            "grad_scaler": precision.state_dict(),
            **ddp.rng_states(device),
        }
        if ddp.is_main:
            save_checkpoint(run_dir, model, state, best=best_record, keep_last=tc.keep_last)

    write = sys.stderr.write if ddp.is_main else _silent
    if tc.dtype == "auto":
        write(f"train.dtype auto: {dtype} ({why})\n")
    if note := slow_dtype_note(device, dtype):
        write(note + "\n")
    # The bar redraws in place, which only a terminal shows well; logs get the eval lines alone.
    show_bar = progress and ddp.is_main and sys.stderr.isatty()
    bar = tqdm(total=tc.max_iters, initial=step, disable=not show_bar, dynamic_ncols=True, unit="it", file=sys.stderr)
    log = bar.write if show_bar else (lambda s: write(s + "\n"))
    # Without a bar (a log file, a pipe), a line every 30 s between the evaluations' lines.
    ticker = ProgressLines("training", tc.max_iters, "steps", every=PROGRESS_EVERY_S, write=log, done=step)
    ticking = progress and ddp.is_main and not show_bar
    guard = StepGuard(tc.max_bad_steps, tc.spike_factor, log)  # skips non-finite steps, warns of spikes
    if resume:
        guard.load_state_dict(state)
    # A resumed run that has nothing left to train reports what it last measured.
    results: dict[str, float] = _last_evaluation(run_dir / "metrics.csv") if resume else {}
    if step == 0 and tc.max_iters > 0:
        results = evaluate(0)
        metrics.write(step=0, kind="eval", elapsed_sec=0.0, **results)
        log(f"step 0: {_describe(results)}")

    if tc.compile:
        log("torch.compile: " + ("on" if step_model is not model else "not available here; training without it"))
    if kernels_line:
        log(kernels_line)
    uncovered = kernels.unsupported_parts(model) if fused_kernels else None
    if uncovered:
        log(f"attnlab's C++ kernels: {uncovered}: those blocks run on PyTorch's path")
    model.train()
    window_start, window_tokens = time.perf_counter(), 0
    tokens_per_sec = math.nan
    stopped_by = None

    def patience_spent() -> bool:
        return tc.patience > 0 and stale >= tc.patience

    stopped_early = False
    while step < tc.max_iters and not patience_spent():
        lr = _learning_rate(tc, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for micro in range(tc.gradient_accumulation_steps):
            # Every rank draws the same global batch (one seeded generator) and trains on its rows.
            batch = task.train_batch(step * tc.gradient_accumulation_steps + micro, batches)
            window_tokens += task.batch_tokens(batch)
            batch = ddp.shard(batch)
            if device.type == "cuda":
                batch = _pinned(batch)  # so the task's non_blocking copy overlaps the GPU's work
            last = micro == tc.gradient_accumulation_steps - 1
            with step_loss.accumulating(last=last), kernels.enabled(fused_kernels):
                with precision.autocast():
                    try:
                        loss = step_loss(batch)
                    except Exception as e:
                        if not step_loss.compiled:
                            raise
                        # Compilation happens at the first call; whatever breaks it, eager still works
                        # (and an error that is not the compiler's is raised again by the eager call).
                        log(
                            f"torch.compile failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); "
                            "training without it"
                        )
                        step_loss.use_eager()
                        loss = step_loss(batch)
                    loss = loss / tc.gradient_accumulation_steps
                precision.backward(loss)
            loss_sum += loss.detach()
        precision.unscale(optimizer)  # fp16: clip the true gradients, not the scaled ones
        # One collective and one host sync per step: a non-finite loss or gradient norm must skip
        # the update, and a stop request that reached any rank stops them all at this step. Loss
        # and stop flag are averaged over ranks (the flag's mean is above 0 when any rank was
        # asked); the gradients are all-reduced already. So every rank takes the same decisions.
        asked = float(stop is not None and stop.signal_name is not None)
        shared = ddp.mean(torch.stack([loss_sum, loss_sum.new_tensor(asked)]))
        loss_value, stop_votes, norm = torch.cat([shared, grad_norm(model, tc.grad_clip, optimizer)[None]]).tolist()
        # fp16 overflow: the scaler skips that update and lowers its scale; that is how fp16 training
        # finds its scale, not a sign of divergence, so the guard neither sees nor counts it.
        if (precision.scaling and not math.isfinite(norm)) or guard.admit(step + 1, loss_value, norm):
            precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        step += 1

        if step % tc.log_interval == 0 or step == tc.max_iters:
            last_loss = loss_value
            now = time.perf_counter()
            elapsed += now - window_start
            tokens_per_sec = window_tokens / (now - window_start)
            window_start, window_tokens = now, 0
            metrics.write(
                step=step,
                kind="train",
                train_loss=last_loss,
                lr=lr,
                tokens_per_sec=tokens_per_sec,
                elapsed_sec=elapsed,
                skipped_steps=guard.skipped,
            )
            bar.set_postfix(loss=f"{last_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}", refresh=False)
        bar.update(1)
        if ticking:
            ticker.update(1)

        saved = False
        if step % tc.eval_interval == 0 or step == tc.max_iters:
            pause = time.perf_counter()
            results = evaluate(step) | moe_stats(model)  # the experts' last training batch
            metrics.write(step=step, kind="eval", lr=lr, elapsed_sec=elapsed, **results)
            improved, progress = judge(results)
            if improved:
                best = results[selection[0]]
            stale = 0 if progress else stale + 1
            stopped_early = patience_spent()
            if stopped_early and step % tc.log_interval != 0:
                elapsed += pause - window_start  # the training since the last log row
            if improved or stopped_early or step % tc.log_interval == 0 or step == tc.max_iters:
                log(
                    f"step {step}: {_describe(results)}{' (best)' if improved else ''}"
                    + (f"; stopping: no progress in {tc.patience} evaluations" if stopped_early else "")
                )
            # With a checkpoint_interval, the evaluations in between save only a new best (the
            # weights early stopping picks) and the last step.
            if improved or stopped_early or step == tc.max_iters or _checkpoint_due(tc, step):
                checkpoint({"step": step, selection[0]: best} if improved else None)
                saved = True
            window_start += time.perf_counter() - pause  # evaluation is not training time
        if stop_votes > 0 and step < tc.max_iters and not stopped_early:  # (else the run has finished anyway)
            if not saved:
                elapsed += time.perf_counter() - window_start
                checkpoint()
            stopped_by = (stop.signal_name if stop is not None else None) or "a signal to another rank"
            break
    bar.close()
    metrics.close()
    ddp.stop()
    return TrainResult(
        run_dir,
        step,
        results,
        best,
        elapsed,
        tokens_per_sec,
        compiled=step_loss.compiled,
        fused_kernels=fused_kernels,
        dtype=dtype,
        stopped_by=stopped_by,
    )


def choose_kernels(setting: bool | str, device: torch.device, resumed: Path | None) -> tuple[bool, str | None]:
    """Whether the run's steps take attnlab's C++ kernels (`train.fused_kernels`), and the line
    that says so. "auto" takes them on a CPU where they are built already (a run never waits for a
    build); a resumed run (`resumed`: its folder) keeps what it chose when it started."""
    if resumed is not None and setting == "auto" and (resumed / CONFIG).exists():
        setting = read_config(resumed).train.fused_kernels  # a bool, or "auto" in a run from before it was saved
    if setting == "auto":
        if device.type != "cpu":
            return False, None
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


def _metrics_sinks(config: RunConfig, run_dir: Path, resume_step: int | None) -> MetricsSinks:
    """metrics.csv, and TensorBoard event files when the config asks for them."""
    csv_log = MetricsLog(run_dir / "metrics.csv", resume_step)
    if config.log.tensorboard:
        return MetricsSinks(csv_log, TensorBoardLog(run_dir, resume_step))
    return MetricsSinks(csv_log)


def _empty(run_dir: Path, keep_folder: bool) -> None:
    """Remove what a failed set-up wrote into a new run folder (the folder too unless it was there before)."""
    if keep_folder:
        for child in run_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    else:
        shutil.rmtree(run_dir, ignore_errors=True)


def _silent(text: str) -> None:
    """stderr of the ranks other than 0: rank 0 speaks for the job."""


def _compiled(model: torch.nn.Module) -> torch.nn.Module:
    """torch.compile(model), or the model itself where this Python/PyTorch cannot compile. The
    original keeps the parameters: checkpoints and evaluation use it, never the wrapper."""
    try:
        return torch.compile(model)
    except Exception:  # e.g. a Python version that TorchDynamo does not support yet
        return model


def _pinned(batch: Any) -> Any:
    """A tuple or list of CPU tensors in page-locked memory (anything else as it is)."""
    if isinstance(batch, tuple | list) and all(isinstance(t, torch.Tensor) for t in batch):
        return type(batch)(t.pin_memory() if t.device.type == "cpu" else t for t in batch)
    return batch


def _checkpoint_due(tc: TrainConfig, step: int) -> bool:
    """Whether the evaluation at `step` saves a checkpoint even when it brings no new best."""
    return tc.checkpoint_interval == 0 or step % tc.checkpoint_interval == 0


def _learning_rate(tc: TrainConfig, step: int) -> float:
    if tc.schedule == "inverse_sqrt":
        return inverse_sqrt(step, max_lr=tc.learning_rate, warmup=tc.warmup_iters)
    if not tc.decay_lr:
        return min(tc.learning_rate, tc.learning_rate * (step + 1) / (tc.warmup_iters + 1))
    return warmup_cosine(
        step, max_lr=tc.learning_rate, min_lr=tc.min_lr, warmup=tc.warmup_iters, decay_steps=tc.decay_steps
    )


def _describe(results: dict[str, float]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in results.items())
