"""One model-agnostic training loop (after minGPT's Trainer and nanoGPT's train.py).

The task supplies batches, the loss and the evaluation; the loop supplies AdamW, the warm-up +
cosine schedule, gradient accumulation and clipping, periodic evaluation and checkpoints, a
progress bar and metrics.csv (and TensorBoard events); a step whose loss or gradient is not finite
is skipped (guards.py), and a SIGINT/SIGTERM stops the run after a checkpoint (signals.py). Seeded:
the same config gives the same losses on CPU, and a run resumed from a checkpoint continues
bit-for-bit as if it had never stopped. Launched by torchrun, each process trains on its share of
every batch (see `train.distributed`).

`train` reads on one screen; each step it takes is a named piece with one job:
`run_setup.set_up_run` (folder, ranks, device, precision, task), `Checkpointer` (the training
state saved and restored), `Selection` (best checkpoint, early stopping), `Schedule` (when to log,
evaluate and save), `TrainingStep` (one optimizer step), `Evaluator`, `Console` (what the run says)
and `Clock` (training time and throughput); `metrics.metrics_sinks` writes metrics.csv.
"""

import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from attnlab.accel import Applied, for_training
from attnlab.accel.rules import prepare_for_training
from attnlab.device import autocast, slow_dtype_note
from attnlab.errors import UserError
from attnlab.nn import collect_aux_loss, moe_stats
from attnlab.progress import ProgressLines
from attnlab.train.checkpointer import Checkpointer
from attnlab.train.config import RunConfig, TrainConfig
from attnlab.train.distributed import StepLoss
from attnlab.train.guards import StepGuard, grad_norm
from attnlab.train.lora import LoRASetup, set_up_lora
from attnlab.train.lora import describe as describe_lora
from attnlab.train.metrics import METRICS_FIELDS, describe, last_evaluation, metrics_sinks
from attnlab.train.optim import adam_l2, adamw
from attnlab.train.run_setup import RunSetup, check_run_dir, choose_kernels, set_up_run
from attnlab.train.schedules import inverse_sqrt, warmup_cosine
from attnlab.train.selection import Selection
from attnlab.train.signals import StopRequest
from attnlab.train.tensorboard import MetricsSinks

__all__ = ["METRICS_FIELDS", "TrainResult", "check_run_dir", "choose_kernels", "train"]

PROGRESS_EVERY_S = 30.0  # seconds between progress lines where no bar is drawn


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
    """Training tokens per second over this invocation's training (evaluations excluded)."""
    compiled: bool = False
    """Whether the training steps ran through torch.compile (False where it was not asked for or failed)."""
    fused_kernels: bool = False
    """Whether attnlab's C++ kernels were on (train.fused_kernels, where they could be built)."""
    dtype: str = "float32"
    """The precision the steps ran in (what train.dtype = "auto" chose)."""
    stopped_by: str | None = None
    """The signal ("SIGINT", "SIGTERM") that stopped the run early, after saving; None if it finished."""
    resumed_from: int | None = None
    """The step of the checkpoint a resumed run continued from (`step` less it: the steps trained
    in this call); None for a run that started at step 0."""

    @property
    def val_loss(self) -> float:
        return self.metrics.get("val_loss", math.nan)

    @property
    def train_loss(self) -> float:
        return self.metrics.get("train_loss", math.nan)


def train(
    config: RunConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop: StopRequest | None = None,
    strategy: str = "ddp",
) -> TrainResult:
    """Train the model `config` describes into `run_dir` (created), or continue it with `resume`.

    stop: once its signal has arrived (on any rank), the loop saves a checkpoint after the current
    step and returns.
    Under torchrun (RANK, WORLD_SIZE in the environment) this is one rank of a data-parallel job:
    every rank returns the same result; rank 0 alone writes the run folder. strategy: "ddp" (a
    whole model per rank) or "fsdp" (the model sharded across the ranks; `train.distributed`)."""
    run = set_up_run(config, Path(run_dir), resume, strategy)  # the folder, the ranks, device and precision, the task
    tc, ddp, schedule = run.config.train, run.ddp, Schedule(run.config.train)
    model, step_loss, tuned, lora = _build_model(run)
    optimizer = _optimizer(model, tc, run.device)  # over the trainable parameters (LoRA: adapters and head)
    batches = torch.Generator().manual_seed(tc.seed)  # every rank draws the same global batches
    checkpointer = Checkpointer(
        run.run_dir, model, optimizer, batches, run.precision, ddp, run.device, tc.keep_last, lora
    )
    state = checkpointer.restore() if run.resume else {}
    step = state.get("step", 0)
    selection = Selection(run.task.selection, tc.patience, tc.watch_loss, run.config.task, tc.ties_count)
    selection.load_state_dict(state)
    ddp.seed(tc.seed, state, run.device)
    metrics = metrics_sinks(run.config, run.run_dir, step if run.resume else None) if ddp.is_main else MetricsSinks()
    console = Console(run, progress, done=step)
    guard = StepGuard(tc.max_bad_steps, tc.spike_factor, console.log)  # skips non-finite steps, warns of spikes
    guard.load_state_dict(state)
    evaluate = Evaluator(run, model, console.log)
    results = _first_results(run, step, evaluate, metrics, console.log)
    fused_kernels = _say_accelerations(run, model, tuned, step_loss, console.log, lora)
    model.train()
    clock = Clock(state.get("elapsed_sec", 0.0))
    one_step = TrainingStep(run, model, step_loss, optimizer, batches, guard, fused_kernels, clock, console.log)
    evaluations = Evaluations(evaluate, model, metrics, selection, schedule, checkpointer, guard, clock, console)
    stopped_by = None
    while step < tc.max_iters and not selection.patience_spent():
        lr, loss, stop_asked = one_step(step, stop)
        step += 1
        if schedule.logs_at(step):
            _log_train_row(step, loss, lr, clock, guard, metrics, console)
        console.advance()
        saved = False
        if schedule.evaluates_at(step):
            results, saved = evaluations.at(step, lr)
        if stop_asked and step < tc.max_iters and not selection.patience_spent():  # (else the run ends anyway)
            stopped_by = _stop_after(step, saved, stop, checkpointer, clock, guard, selection)
            break
    for sink in (console, metrics):
        sink.close()
    ddp.stop()
    timing, how = (clock.elapsed, clock.mean_tokens_per_sec), (step_loss.compiled, fused_kernels, run.dtype)
    resumed_from = state.get("step") if run.resume else None
    return TrainResult(run.run_dir, step, results, selection.best, *timing, *how, stopped_by, resumed_from)


def _first_results(
    run: RunSetup, step: int, evaluate: "Evaluator", metrics: MetricsSinks, log: Callable[[str], None]
) -> dict[str, float]:
    """What the run reports before its first step: a new run evaluates its initial weights (the
    step-0 eval row); a resumed run that has nothing left to train reports what it last measured."""
    results = last_evaluation(run.run_dir / "metrics.csv") if run.resume else {}
    if step == 0 and run.config.train.max_iters > 0:
        results = evaluate(0)
        metrics.write(step=0, kind="eval", elapsed_sec=0.0, **results)
        log(f"step 0: {describe(results)}")
    return results


def _log_train_row(
    step: int, loss: float, lr: float, clock: "Clock", guard: StepGuard, metrics: MetricsSinks, console: "Console"
) -> None:
    """A log step: close the clock's window, write the train row and show the loss on the bar."""
    clock.lap()
    metrics.write(step=step, kind="train", train_loss=loss, lr=lr, skipped_steps=guard.skipped, **clock.row())
    console.show(loss, lr, clock.tokens_per_sec)


def _stop_after(
    step: int,
    saved: bool,
    stop: StopRequest | None,
    checkpointer: Checkpointer,
    clock: "Clock",
    guard: StepGuard,
    selection: Selection,
) -> str:
    """Stop the run after `step` on a signal: save a checkpoint unless this step's evaluation did
    (`saved`); returns the signal's name, as TrainResult.stopped_by reports it."""
    if not saved:
        clock.settle(time.perf_counter())
        checkpointer.save(step, clock.elapsed, guard, selection)
    return (stop.signal_name if stop is not None else None) or "a signal to another rank"


@dataclass(frozen=True)
class Schedule:
    """When the loop logs a train row, evaluates, and saves a checkpoint."""

    config: TrainConfig

    def logs_at(self, step: int) -> bool:
        return step % self.config.log_interval == 0 or step == self.config.max_iters

    def evaluates_at(self, step: int) -> bool:
        return step % self.config.eval_interval == 0 or step == self.config.max_iters

    def saves_at(self, step: int, must: bool) -> bool:
        """Whether the evaluation at `step` saves a checkpoint: always at a new best or early stop
        (`must`) and at the last step; with a checkpoint_interval, the evaluations in between save
        only those (the weights early stopping picks)."""
        tc = self.config
        return must or step == tc.max_iters or tc.checkpoint_interval == 0 or step % tc.checkpoint_interval == 0


class TrainingStep:
    """One optimizer step: the learning rate, the micro-batches' forward and backward, clipping,
    the guard's verdict and the update. Returns (lr, mean loss, whether any rank was asked to stop)."""

    def __init__(
        self,
        run: RunSetup,
        model: nn.Module,
        step_loss: StepLoss,
        optimizer: torch.optim.Optimizer,
        batches: torch.Generator,
        guard: StepGuard,
        fused_kernels: bool,
        clock: "Clock",
        log: Callable[[str], None],
    ) -> None:
        self.run, self.tc = run, run.config.train
        self.model, self.step_loss, self.optimizer, self.batches = model, step_loss, optimizer, batches
        self.guard, self.fused_kernels, self.clock, self.log = guard, fused_kernels, clock, log

    def __call__(self, step: int, stop: StopRequest | None) -> tuple[float, float, bool]:
        tc, run, precision = self.tc, self.run, self.run.precision
        lr = learning_rate(tc, step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=run.device)
        for micro in range(tc.gradient_accumulation_steps):
            # Every rank draws the same global batch (one seeded generator) and trains on its rows.
            batch = run.task.train_batch(step * tc.gradient_accumulation_steps + micro, self.batches)
            self.clock.tokens += run.task.batch_tokens(batch)
            batch = run.ddp.shard(batch)
            if run.device.type == "cuda":
                batch = _pinned(batch)  # so the task's non_blocking copy overlaps the GPU's work
            last = micro == tc.gradient_accumulation_steps - 1
            with self.step_loss.accumulating(last=last):
                with precision.autocast():
                    loss = self._loss(batch) / tc.gradient_accumulation_steps
                precision.backward(loss)
            loss_sum += loss.detach()
        precision.unscale(self.optimizer)  # fp16: clip the true gradients, not the scaled ones
        # One collective and one host sync per step: a non-finite loss or gradient norm must skip
        # the update, and a stop request that reached any rank stops them all at this step. Loss
        # and stop flag are averaged over ranks (the flag's mean is above 0 when any rank was
        # asked); the gradients are all-reduced already. So every rank takes the same decisions.
        asked = float(stop is not None and stop.signal_name is not None)
        shared = run.ddp.mean(torch.stack([loss_sum, loss_sum.new_tensor(asked)]))
        norm = run.ddp.full(grad_norm(self.model, tc.grad_clip, self.optimizer))  # (FSDP: a DTensor)
        loss_value, stop_votes, norm = torch.cat([shared, norm[None]]).tolist()
        # fp16 overflow: the scaler skips that update and lowers its scale; that is how fp16 training
        # finds its scale, not a sign of divergence, so the guard neither sees nor counts it.
        if (precision.scaling and not math.isfinite(norm)) or self.guard.admit(step + 1, loss_value, norm):
            precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return lr, loss_value, stop_votes > 0

    def _loss(self, batch: Any) -> torch.Tensor:
        try:
            return self.step_loss(batch)
        except Exception as e:
            if not self.step_loss.compiled:
                raise
            # Compilation happens at the first call; whatever breaks it, eager still works (and an
            # error that is not the compiler's is raised again by the eager call).
            first_line = str(e).strip().splitlines()[0][:200]
            self.log(f"torch.compile failed ({type(e).__name__}: {first_line}); training without it")
            self.step_loss.use_eager()
            return self.step_loss(batch)


class Evaluator:
    """The task's evaluation during training, on rank 0 (the others wait for its results: N copies
    of the same estimate would share the CPU; under FSDP every rank takes part), in eval mode and
    the run's precision."""

    def __init__(self, run: RunSetup, model: nn.Module, log: Callable[[str], None]) -> None:
        self.run, self.model, self.log = run, model, log

    def __call__(self, at_step: int) -> dict[str, float]:
        return self.run.ddp.evaluation(lambda: self._evaluate(at_step))  # rank 0's (every rank's under FSDP)

    def _evaluate(self, at_step: int) -> dict[str, float]:
        run, tc = self.run, self.run.config.train
        self.model.eval()
        with torch.no_grad(), autocast(run.device, run.dtype):
            out = run.task.evaluate_during_training(
                self.model, run.device, step=at_step, eval_iters=tc.eval_iters, seed=tc.seed, log=self.log
            )
        self.model.train()
        return out


class Evaluations:
    """What the loop does at an evaluation step: evaluate, record the eval row, judge the weights
    (best? progress?), say so, and save a checkpoint where one is due. Evaluation time is not
    training time: the clock pauses."""

    def __init__(
        self,
        evaluate: Evaluator,
        model: nn.Module,
        metrics: MetricsSinks,
        selection: Selection,
        schedule: Schedule,
        checkpointer: Checkpointer,
        guard: StepGuard,
        clock: "Clock",
        console: "Console",
    ) -> None:
        self.evaluate, self.model, self.metrics, self.selection, self.schedule = (
            evaluate,
            model,
            metrics,
            selection,
            schedule,
        )
        self.checkpointer, self.guard, self.clock, self.console = checkpointer, guard, clock, console

    def at(self, step: int, lr: float) -> tuple[dict[str, float], bool]:
        """The evaluation after `step`: its results, and whether it saved a checkpoint."""
        clock, selection = self.clock, self.selection
        clock.pause()
        results = self.evaluate(step) | moe_stats(self.model)  # the experts' last training batch
        self.metrics.write(step=step, kind="eval", lr=lr, elapsed_sec=clock.elapsed, **results)
        improved, stopping = selection.judge(results), selection.patience_spent()
        if stopping and step % self.schedule.config.log_interval != 0:
            clock.settle(clock.paused_at)  # the training since the last log row
        self.console.say_evaluation(step, results, improved, stopping, self.schedule.logs_at(step))
        saved = self.schedule.saves_at(step, improved or stopping)
        if saved:
            best = selection.best_record(step) if improved else None
            self.checkpointer.save(step, clock.elapsed, self.guard, selection, best)
        clock.resume()
        return results, saved


class Console:
    """What the run says on stderr: rank 0 speaks for the job. A progress bar on a terminal; in a
    log file or a pipe, the evaluations' lines and a progress line every PROGRESS_EVERY_S."""

    def __init__(self, run: RunSetup, progress: bool, done: int) -> None:
        tc, main = run.config.train, run.ddp.is_main
        self.write = sys.stderr.write if main else _silent
        if tc.dtype == "auto":
            self.write(f"train.dtype auto: {run.dtype} ({run.dtype_reason})\n")
        if note := slow_dtype_note(run.device, run.dtype):
            self.write(note + "\n")
        # The bar redraws in place, which only a terminal shows well; logs get the eval lines alone.
        self.show_bar = progress and main and sys.stderr.isatty()
        self.bar = tqdm(
            total=tc.max_iters, initial=done, disable=not self.show_bar, dynamic_ncols=True, unit="it", file=sys.stderr
        )
        self.ticker = ProgressLines(
            "training", tc.max_iters, "steps", every=PROGRESS_EVERY_S, write=self.log, done=done
        )
        self.ticking = progress and main and not self.show_bar
        self.patience = tc.patience
        if run.resume:
            self.log(resumed_line(done, tc.max_iters))

    def log(self, line: str) -> None:
        if self.show_bar:
            self.bar.write(line)
        else:
            self.write(line + "\n")

    def show(self, loss: float, lr: float, tokens_per_sec: float) -> None:
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}", refresh=False)

    def advance(self) -> None:
        self.bar.update(1)
        if self.ticking:
            self.ticker.update(1)

    def say_evaluation(self, step: int, results: dict[str, float], improved: bool, stopping: bool, due: bool) -> None:
        """An evaluation's line: at a log step (`due`), a new best or an early stop."""
        if improved or stopping or due:
            self.log(
                f"step {step}: {describe(results)}{' (best)' if improved else ''}"
                + (f"; stopping: no progress in {self.patience} evaluations" if stopping else "")
            )

    def close(self) -> None:
        self.bar.close()


def resumed_line(step: int, max_iters: int) -> str:
    """What a resumed run says first: where its checkpoint left it, and what is left to train.
    Example: (59, 100) -> "resumed from step 59 of 100: 41 steps to train"."""
    if step >= max_iters:
        return (
            f"resumed from step {step}: train.max_iters is {max_iters}, nothing left to train "
            "(train on with --set train.max_iters=N)"
        )
    return f"resumed from step {step} of {max_iters}: {max_iters - step} steps to train"


class Clock:
    """Training time and throughput. `elapsed` (carried over by a resumed run) counts training
    alone: an evaluation pauses the clock. `lap` closes a log interval's window; `tokens_per_sec`
    is that window's rate (metrics.csv's curve), `mean_tokens_per_sec` the rate over all the
    windows closed in this invocation (the run's summary)."""

    def __init__(self, elapsed: float) -> None:
        self.elapsed = self.begun = elapsed
        self.start = time.perf_counter()
        self.tokens = 0  # in the current window
        self.counted = 0  # in the windows closed so far
        self.tokens_per_sec = math.nan
        self.paused_at = self.start

    def lap(self) -> None:
        now = time.perf_counter()
        window = now - self.start
        self.tokens_per_sec = self.tokens / window
        self._close(now)

    def settle(self, until: float) -> None:
        """Count the training from the window's start to `until`, where the run ends between laps."""
        self._close(until)

    def _close(self, until: float) -> None:
        self.elapsed += until - self.start
        self.counted += self.tokens
        self.start, self.tokens = until, 0

    @property
    def mean_tokens_per_sec(self) -> float:
        seconds = self.elapsed - self.begun
        return self.counted / seconds if seconds > 0 else math.nan

    def row(self) -> dict[str, float]:
        """metrics.csv's timing columns as of the last lap."""
        return {"tokens_per_sec": self.tokens_per_sec, "elapsed_sec": self.elapsed}

    def pause(self) -> None:
        self.paused_at = time.perf_counter()

    def resume(self) -> None:
        self.start += time.perf_counter() - self.paused_at


@dataclass(frozen=True)
class TrainingLoss:
    """The task's loss on a micro-batch plus the auxiliary losses a mixture of experts gathered in
    this forward (the load-balancing and z-losses), which a task's loss does not know of."""

    task: Any
    device: torch.device
    label_smoothing: float

    def __call__(self, model: nn.Module, batch: Any) -> torch.Tensor:
        loss = self.task.loss(model, batch, self.device, self.label_smoothing)
        aux = collect_aux_loss(model)
        return loss if aux is None else loss + aux


def _build_model(run: RunSetup) -> tuple[nn.Module, StepLoss, Applied | None, LoRASetup | None]:
    """The task's model on the run's device (a new run's initialised by the task, e.g. with a
    pre-trained encoder; with `train.lora`, frozen with adapters added), the training loss through
    it (compiled, DDP-synchronised), what attnlab's C++ kernels cover of it where
    `train.fused_kernels` resolved on (`_tuned`), and the LoRA set-up."""
    tc, device = run.config.train, run.device
    model = run.task.build_model()
    if not run.resume and hasattr(run.task, "initialize"):
        run.task.initialize(model)  # e.g. a pre-trained encoder's weights for fine-tuning
    lora = _lora(run, model)
    model = model.to(device)
    if device.type == "cuda":
        # TF32 tensor cores for the float32 matmuls that autocast leaves (and all of them in fp32 runs).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    tuned = _tuned(run, model)
    step_model = _compiled(model) if tc.compile else model  # what the training loss runs through
    step_loss = run.ddp.wrap(TrainingLoss(run.task, device, tc.label_smoothing), model, step_model)
    return model, step_loss, tuned, lora


def _lora(run: RunSetup, model: nn.Module) -> LoRASetup | None:
    """`train.lora`'s adapters on `model` (`set_up_lora`). A new run whose targets this model
    does not have leaves no run folder behind."""
    try:
        return set_up_lora(model, run.config, run.run_dir, resume=run.resume)
    except UserError:
        if not run.resume and run.ddp.is_main:
            shutil.rmtree(run.run_dir, ignore_errors=True)
        raise


def _tuned(run: RunSetup, model: nn.Module) -> Applied | None:
    """attnlab's C++ kernels on the model's covered modules (they take their kernels in training
    mode; evaluation runs the reference code), and on the loss of a task that computes its own
    cross-entropy (a `cross_entropy` attribute: the masked LM's); None where they are off. Every
    model first takes the hardware rules of training (`attnlab.accel.rules`), kernels or not."""
    prepare_for_training(model)
    if not run.config.train.fused_kernels or run.config.train.lora is not None:
        return None  # the blocks' kernels read the weights themselves: they would pass the adapters by
    applied = for_training(model)
    if hasattr(run.task, "cross_entropy"):
        run.task.cross_entropy = applied.cross_entropy
    return applied


def _optimizer(model: nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    if tc.optimizer == "adam":
        return adam_l2(model, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay)
    return adamw(
        model,
        lr=tc.learning_rate,
        betas=(tc.beta1, tc.beta2),
        weight_decay=tc.weight_decay,
        device=device,
        kernel=tc.fused_kernels,  # the clipping and AdamW step as well as the blocks
    )


def _say_accelerations(
    run: RunSetup,
    model: nn.Module,
    tuned: Applied | None,
    step_loss: StepLoss,
    log: Callable[[str], None],
    lora: LoRASetup | None,
) -> bool:
    """Log whether torch.compile and attnlab's C++ kernels are on, and what LoRA trains; returns
    whether the kernels are."""
    tc = run.config.train
    if tc.compile:
        log("torch.compile: " + ("on" if step_loss.compiled else "not available here; training without it"))
    if line := run.kernels_line(model):
        log(line)
    if line := run.ddp.sharding_line(model):
        log(line)
    if tuned is not None and tuned.uncovered:
        log(f"attnlab's C++ kernels: {tuned.uncovered}: those blocks run on PyTorch's path")
    if lora is not None:
        log(describe_lora(lora, model))
    return tc.fused_kernels


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


def learning_rate(tc: TrainConfig, step: int) -> float:
    """The learning rate of `step` (from 0): warm-up then cosine decay, linear warm-up alone
    (decay_lr = false), or the inverse square root schedule."""
    if tc.schedule == "inverse_sqrt":
        return inverse_sqrt(step, max_lr=tc.learning_rate, warmup=tc.warmup_iters)
    if not tc.decay_lr:
        return min(tc.learning_rate, tc.learning_rate * (step + 1) / (tc.warmup_iters + 1))
    return warmup_cosine(
        step, max_lr=tc.learning_rate, min_lr=tc.min_lr, warmup=tc.warmup_iters, decay_steps=tc.decay_steps
    )
