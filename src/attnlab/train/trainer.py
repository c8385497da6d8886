"""One model-agnostic training loop (after minGPT's Trainer and nanoGPT's train.py).

The task supplies batches, the loss and the evaluation; the loop supplies AdamW, the warm-up +
cosine schedule, gradient accumulation and clipping, periodic evaluation and checkpoints, a
progress bar and metrics.csv; a step whose loss or gradient is not finite is skipped (guards.py),
and a SIGINT/SIGTERM stops the run after a checkpoint (signals.py). Seeded: the same config gives
the same losses on CPU, and a run resumed from a checkpoint continues bit-for-bit as if it had
never stopped.
"""

import csv
import math
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from attnlab.device import autocast, resolve_device
from attnlab.errors import CheckpointError, UserError
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
from attnlab.train.config import RunConfig, TrainConfig
from attnlab.train.guards import StepGuard, grad_norm
from attnlab.train.optim import adamw
from attnlab.train.schedules import inverse_sqrt, warmup_cosine
from attnlab.train.signals import StopRequest

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
]


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
    saved = None
    if resume:
        if not (run_dir / CONFIG).exists():
            raise CheckpointError(
                f"cannot resume: {run_dir} holds no run ({CONFIG} is missing); drop --resume to start one"
            )
        saved = read_config(run_dir)
        if saved.task != config.task:
            raise CheckpointError(f"cannot resume: {run_dir} is a {saved.task!r} run, not {config.task!r}")
        _check_same(run_dir, "data", saved.data, config.data)
    elif (run_dir / CONFIG).exists():
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, or choose another --out folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    return saved


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

    stop: once its signal has arrived, the loop saves a checkpoint after the current step and returns.
    """
    run_dir = Path(run_dir)
    tc = config.train
    saved = _prepare_run_dir(config, run_dir, resume)
    if resume and not has_checkpoint(run_dir):
        sys.stderr.write(f"{run_dir} has no complete checkpoint yet (stopped before its first): starting at step 0\n")
        resume = False
    device = resolve_device(tc.device)
    torch.manual_seed(tc.seed)
    task = TASKS[config.task](config.data, config.model, run_dir, resume=resume, batch_size=tc.batch_size)
    if saved is not None:
        # The task completes the model config (vocabulary size, label count, a pre-trained
        # encoder's shape), so the comparison is with what it made of the asked-for config.
        _check_same(run_dir, "model", saved.model, task.model_config)
    config = RunConfig(config.task, task.model_config, config.data, tc)
    write_config(run_dir, config)

    model = task.build_model()
    if not resume and hasattr(task, "initialize"):
        task.initialize(model)  # e.g. a pre-trained encoder's weights for fine-tuning
    model = model.to(device)
    if device.type == "cuda":
        # TF32 tensor cores for the float32 matmuls that autocast leaves (and all of them in fp32 runs).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    step_model = _compiled(model) if tc.compile else model  # what the training loss runs through
    optimizer = adamw(
        model, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay, device=device
    )
    batches = torch.Generator().manual_seed(tc.seed)
    selection = task.selection  # (metric, "min" | "max") that picks the best checkpoint, or None
    step, elapsed, best = 0, 0.0, None
    if resume:
        load_weights(run_dir, model)
        state = load_train_state(run_dir)
        optimizer.load_state_dict(state["optimizer"])
        batches.set_state(state["batch_rng"])
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng"):
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        step, elapsed, best = state["step"], state["elapsed_sec"], state.get("best")
    metrics = MetricsLog(run_dir / "metrics.csv", step if resume else None)

    def evaluate(at_step: int) -> dict[str, float]:
        model.eval()
        with torch.no_grad(), autocast(device, tc.dtype):
            out = task.evaluate_during_training(model, device, step=at_step, eval_iters=tc.eval_iters, seed=tc.seed)
        model.train()
        return out

    def is_better(results: dict[str, float]) -> bool:
        if selection is None:
            return False
        value = results[selection[0]]
        return best is None or (value < best if selection[1] == "min" else value > best)

    def checkpoint(best_record: dict[str, Any] | None = None) -> None:
        state = {
            **guard.state_dict(),
            "step": step,
            "elapsed_sec": elapsed,
            "best": best,
            "optimizer": optimizer.state_dict(),
            "batch_rng": batches.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
        }
        save_checkpoint(run_dir, model, state, best=best_record, keep_last=tc.keep_last)

    write = sys.stderr.write
    # The bar redraws in place, which only a terminal shows well; logs get the eval lines alone.
    show_bar = progress and sys.stderr.isatty()
    bar = tqdm(total=tc.max_iters, initial=step, disable=not show_bar, dynamic_ncols=True, unit="it", file=sys.stderr)
    log = bar.write if show_bar else (lambda s: write(s + "\n"))
    guard = StepGuard(tc.max_bad_steps, tc.spike_factor, log)  # skips non-finite steps, warns of spikes
    if resume:
        guard.load_state_dict(state)
    results: dict[str, float] = {}
    if step == 0 and tc.max_iters > 0:
        results = evaluate(0)
        metrics.write(step=0, kind="eval", elapsed_sec=0.0, **results)
        log(f"step 0: {_describe(results)}")

    if tc.compile:
        log("torch.compile: " + ("on" if step_model is not model else "not available here; training without it"))
    model.train()
    window_start, window_tokens = time.perf_counter(), 0
    tokens_per_sec = math.nan
    while step < tc.max_iters:
        lr = _learning_rate(tc, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for micro in range(tc.gradient_accumulation_steps):
            batch = task.train_batch(step * tc.gradient_accumulation_steps + micro, batches)
            window_tokens += task.batch_tokens(batch)
            if device.type == "cuda":
                batch = _pinned(batch)  # so the task's non_blocking copy overlaps the GPU's work
            with autocast(device, tc.dtype):
                try:
                    loss = task.loss(step_model, batch, device, tc.label_smoothing)
                except Exception as e:
                    if step_model is model:
                        raise
                    # Compilation happens at the first call; whatever breaks it, eager still works
                    # (and an error that is not the compiler's is raised again by the eager call).
                    log(
                        f"torch.compile failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); "
                        "training without it"
                    )
                    step_model = model
                    loss = task.loss(model, batch, device, tc.label_smoothing)
                loss = loss / tc.gradient_accumulation_steps
            loss.backward()
            loss_sum += loss.detach()
        # One host sync per step: a non-finite loss or gradient norm must skip the update.
        step_loss, norm = torch.stack([loss_sum, grad_norm(model, tc.grad_clip)]).tolist()
        if guard.admit(step + 1, step_loss, norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        if step % tc.log_interval == 0 or step == tc.max_iters:
            last_loss = step_loss
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

        if step % tc.eval_interval == 0 or step == tc.max_iters:
            pause = time.perf_counter()
            results = evaluate(step)
            metrics.write(step=step, kind="eval", lr=lr, elapsed_sec=elapsed, **results)
            improved = is_better(results)
            if improved:
                best = results[selection[0]]
            log(f"step {step}: {_describe(results)}{' (best)' if improved else ''}")
            checkpoint({"step": step, selection[0]: best} if improved else None)
            window_start += time.perf_counter() - pause  # evaluation is not training time
        if stop is not None and stop.signal_name is not None:
            if step % tc.eval_interval != 0 and step != tc.max_iters:  # not saved just now
                elapsed += time.perf_counter() - window_start
                checkpoint()
            break
    bar.close()
    return TrainResult(
        run_dir,
        step,
        results,
        best,
        elapsed,
        tokens_per_sec,
        compiled=step_model is not model,
        stopped_by=stop.signal_name if stop is not None and step < tc.max_iters else None,
    )


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
