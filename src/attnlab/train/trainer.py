"""One model-agnostic training loop (after minGPT's Trainer and nanoGPT's train.py).

The task supplies batches, the loss and the evaluation; the loop supplies AdamW, the warm-up +
cosine schedule, gradient accumulation and clipping, periodic evaluation and checkpoints, a
progress bar and metrics.csv. Seeded: the same config gives the same losses on CPU, and a run
resumed from a checkpoint continues bit-for-bit as if it had never stopped.
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
    load_train_state,
    load_weights,
    read_config,
    save_checkpoint,
    write_config,
)
from attnlab.train.config import RunConfig
from attnlab.train.optim import adamw
from attnlab.train.schedules import warmup_cosine

METRICS_FIELDS = ["step", "kind", "train_loss", "val_loss", "lr", "tokens_per_sec", "elapsed_sec"]


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    train_loss: float
    val_loss: float
    elapsed_sec: float
    tokens_per_sec: float


def _differences(saved: Any, wanted: Any) -> list[str]:
    return [
        f"{f.name}: {getattr(saved, f.name)!r} in the run, {getattr(wanted, f.name)!r} asked for"
        for f in fields(saved)
        if getattr(saved, f.name) != getattr(wanted, f.name)
    ]


def _prepare_run_dir(config: RunConfig, run_dir: Path, resume: bool) -> None:
    if resume:
        if not (run_dir / CONFIG).exists():
            raise CheckpointError(
                f"cannot resume: {run_dir} holds no run ({CONFIG} is missing); drop --resume to start one"
            )
        saved = read_config(run_dir)
        if saved.task != config.task:
            raise CheckpointError(f"cannot resume: {run_dir} is a {saved.task!r} run, not {config.task!r}")
        wanted_model = type(saved.model)(**{**vars(config.model), "vocab_size": saved.model.vocab_size})
        for section, old, new in (("model", saved.model, wanted_model), ("data", saved.data, config.data)):
            diffs = _differences(old, new)
            if diffs:
                raise CheckpointError(
                    f"cannot resume {run_dir}: its {section} config differs ({'; '.join(diffs)}); "
                    f"resume with the same {section} settings or train into a new --out folder"
                )
    elif (run_dir / CONFIG).exists():
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, or choose another --out folder")
    run_dir.mkdir(parents=True, exist_ok=True)


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


def train(config: RunConfig, run_dir: str | Path, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train the model `config` describes into `run_dir` (created), or continue it with `resume`."""
    run_dir = Path(run_dir)
    tc = config.train
    _prepare_run_dir(config, run_dir, resume)
    device = resolve_device(tc.device)
    torch.manual_seed(tc.seed)
    task = TASKS[config.task](config.data, config.model, run_dir, resume=resume)
    config = RunConfig(config.task, task.model_config, config.data, tc)
    write_config(run_dir, config)

    model = task.build_model().to(device)
    optimizer = adamw(
        model, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay, device=device
    )
    batches = torch.Generator().manual_seed(tc.seed)
    step, elapsed = 0, 0.0
    if resume:
        load_weights(run_dir, model)
        state = load_train_state(run_dir)
        optimizer.load_state_dict(state["optimizer"])
        batches.set_state(state["batch_rng"])
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng"):
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        step, elapsed = state["step"], state["elapsed_sec"]
    metrics = MetricsLog(run_dir / "metrics.csv", step if resume else None)

    def lr_at(s: int) -> float:
        if not tc.decay_lr:
            return tc.learning_rate if s >= tc.warmup_iters else tc.learning_rate * (s + 1) / (tc.warmup_iters + 1)
        return warmup_cosine(
            s, max_lr=tc.learning_rate, min_lr=tc.min_lr, warmup=tc.warmup_iters, decay_steps=tc.decay_steps
        )

    @torch.no_grad()
    def estimate(at_step: int) -> dict[str, float]:
        # Its own generator, so evaluating never shifts the training batches.
        gen = torch.Generator().manual_seed(tc.seed + 1_000_003 * (at_step + 1))
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = []
            for _ in range(tc.eval_iters):
                with autocast(device, tc.dtype):
                    losses.append(task.loss(model, task.sample_batch(split, tc.batch_size, gen), device).item())
            out[split] = sum(losses) / len(losses)
        model.train()
        return out

    def checkpoint() -> None:
        cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else []
        state = {
            "step": step,
            "elapsed_sec": elapsed,
            "optimizer": optimizer.state_dict(),
            "batch_rng": batches.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": cuda_rng,
        }
        save_checkpoint(run_dir, model, state)

    write = sys.stderr.write
    # The bar redraws in place, which only a terminal shows well; logs get the eval lines alone.
    show_bar = progress and sys.stderr.isatty()
    bar = tqdm(total=tc.max_iters, initial=step, disable=not show_bar, dynamic_ncols=True, unit="it", file=sys.stderr)
    log = bar.write if show_bar else (lambda s: write(s + "\n"))
    losses = {"train": math.nan, "val": math.nan}
    if step == 0 and tc.max_iters > 0:
        losses = estimate(0)
        metrics.write(step=0, kind="eval", train_loss=losses["train"], val_loss=losses["val"], elapsed_sec=0.0)
        log(f"step 0: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    model.train()
    tokens_per_step = tc.batch_size * tc.gradient_accumulation_steps * task.model_config.block_size
    window_start, window_steps, tokens_per_sec, last_loss = time.perf_counter(), 0, math.nan, math.nan
    while step < tc.max_iters:
        lr = lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for _ in range(tc.gradient_accumulation_steps):
            batch = task.sample_batch("train", tc.batch_size, batches)
            with autocast(device, tc.dtype):
                loss = task.loss(model, batch, device) / tc.gradient_accumulation_steps
            loss.backward()
            loss_sum += loss.detach()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        window_steps += 1

        if step % tc.log_interval == 0 or step == tc.max_iters:
            last_loss = loss_sum.item()  # the one host sync per log interval
            now = time.perf_counter()
            elapsed += now - window_start
            tokens_per_sec = window_steps * tokens_per_step / (now - window_start)
            window_start, window_steps = now, 0
            metrics.write(
                step=step, kind="train", train_loss=last_loss, lr=lr, tokens_per_sec=tokens_per_sec, elapsed_sec=elapsed
            )
            bar.set_postfix(loss=f"{last_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_sec:,.0f}", refresh=False)
        bar.update(1)

        if step % tc.eval_interval == 0 or step == tc.max_iters:
            pause = time.perf_counter()
            losses = estimate(step)
            metrics.write(
                step=step, kind="eval", train_loss=losses["train"], val_loss=losses["val"], lr=lr, elapsed_sec=elapsed
            )
            log(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            checkpoint()
            window_start += time.perf_counter() - pause  # evaluation is not training time
    bar.close()
    return TrainResult(run_dir, step, losses["train"], losses["val"], elapsed, tokens_per_sec)
