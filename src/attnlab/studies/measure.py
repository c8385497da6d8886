"""What a study reports about a model besides its losses: parameters (all, and without the
embeddings, Kaplan et al. 2020's N) and the training FLOPs per token, counted on a real step.

The FLOPs are counted, not estimated from a formula: `torch.utils.flop_counter.FlopCounterMode`
adds up the matrix products of one forward and backward pass of a training batch, so a gated
feed-forward, a mixture of experts (its capacity-sized expert batches) or a shared block is charged
what it really computes. Attention runs on PyTorch's math path while counting: the counter has no
formula for the CPU flash kernel and would leave the scores out; the math path's two batched
products per head are counted in full, T x T (a causal kernel may skip the masked half).
Element-wise work (norms, activations, softmax) is not counted, as in the papers' 6N.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnlab.tasks import TASKS
from attnlab.train.load import load_run


def count_parameters(model: nn.Module) -> int:
    """All trainable numbers; a weight shared by several layers (tied embeddings, a shared block) once."""
    return sum(p.numel() for p in model.parameters())


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside the token and position tables (every `nn.Embedding`): Kaplan et al.'s N.
    A tied output projection is the token table, so it is left out too."""
    tables = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables)


@dataclass(frozen=True)
class ModelMeasure:
    params: int
    non_embedding_params: int
    flops_per_token: float
    """Counted FLOPs of one training step (forward + backward), divided by the batch's tokens."""


def measure_run(run_dir: str | Path) -> ModelMeasure:
    """Parameters and counted training FLOPs per token of the model in a run folder, on the first
    training batch its seed draws (weights as trained, on the CPU)."""
    run = load_run(run_dir, checkpoint="last")
    config, tc = run.config, run.config.train
    task = TASKS[config.task](config.data, config.model, run.path, resume=True, batch_size=tc.batch_size)
    model = run.model.train()
    batch = task.train_batch(0, torch.Generator().manual_seed(tc.seed))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        task.loss(model, batch, torch.device("cpu"), tc.label_smoothing).backward()
    return ModelMeasure(
        count_parameters(model), non_embedding_parameters(model), counter.get_total_flops() / task.batch_tokens(batch)
    )
