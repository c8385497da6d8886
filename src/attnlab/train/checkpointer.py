"""The training state a checkpoint holds beside the weights, saved and restored as one: the step
and training time, the optimizer, every random generator (batches, torch, CUDA, each rank's), the
fp16 gradient scaler, the step guard's counts and the best-checkpoint selection. Restoring all of
it is what makes a resumed run continue bit for bit (`attnlab.checkpoints` writes the files). A LoRA
run's weights file holds what trains (adapters, a new head), its manifest the base's record."""

from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.checkpoints import load_train_state, load_weights, save_checkpoint
from attnlab.train.distributed import Distributed
from attnlab.train.guards import StepGuard
from attnlab.train.lora import LoRASetup
from attnlab.train.precision import Precision
from attnlab.train.selection import Selection


class Checkpointer:
    """Saves and restores one run's training state; rank 0 alone writes (under FSDP, what every
    rank gathered onto it: the file is the one a single process writes)."""

    def __init__(
        self,
        run_dir: Path,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        batches: torch.Generator,
        precision: Precision,
        ddp: Distributed,
        device: torch.device,
        keep_last: int,
        lora: LoRASetup | None = None,
    ) -> None:
        self.run_dir, self.model, self.optimizer, self.batches = run_dir, model, optimizer, batches
        self.precision, self.ddp, self.device, self.keep_last = precision, ddp, device, keep_last
        # A LoRA run with a base saves what trains alone, and the base's record.
        self.frozen = lora.frozen if lora is not None else frozenset()
        self.base = lora.base if lora is not None else None

    def restore(self) -> dict[str, Any]:
        """Load the newest checkpoint's weights, optimizer, generators and scaler; returns the
        rest of its state (step, elapsed_sec, the guard's and the selection's) for their owners."""
        weights = self.ddp.whole_weights(self.model, gather=False)  # the model, unless it is sharded
        load_weights(self.run_dir, weights, frozen=self.frozen)
        self.ddp.scatter_weights(weights, self.model)
        state = load_train_state(self.run_dir)
        self.ddp.load_optimizer_state(self.optimizer, state["optimizer"])
        self.batches.set_state(state["batch_rng"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng"):
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.precision.load_state_dict(state.get("grad_scaler", {}))
        return state

    def save(
        self, step: int, elapsed: float, guard: StepGuard, selection: Selection, best: dict[str, Any] | None = None
    ) -> None:
        """A checkpoint after `step` (every rank gathers its state; rank 0 writes); `best` is the
        record of these weights when they are the new best."""
        state = {
            **guard.state_dict(),
            "step": step,
            "elapsed_sec": elapsed,
            **selection.state_dict(),
            "optimizer": self.ddp.optimizer_state(self.optimizer),
            "batch_rng": self.batches.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else [],
            "grad_scaler": self.precision.state_dict(),
            **self.ddp.rng_states(self.device),
        }
        weights = self.ddp.whole_weights(self.model, gather=True)
        if self.ddp.is_main:
            save_checkpoint(
                self.run_dir, weights, state, best=best, keep_last=self.keep_last, frozen=self.frozen, base=self.base
            )
