"""Optimizer construction (AdamW; Adam with an L2 penalty), and AdamW with the gradient clipping folded into
its step."""

from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

import torch
from torch import nn

from attnlab.accel import kernels

T = TypeVar("T", bound=torch.optim.Optimizer)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on the weight matrices of linear layers only.

    Biases, norm parameters and embeddings (token and position; a tied output projection counts as
    the embedding it shares) are not decayed — decaying them only pulls them toward zero.
    """
    no_decay_ids = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            no_decay_ids.add(id(module.weight))
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            is_matrix = isinstance(module, nn.Linear) and name == "weight"
            (decay if is_matrix and id(p) not in no_decay_ids else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def adamw(
    model: nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    device: torch.device,
    kernel: bool = False,
) -> torch.optim.AdamW:
    """AdamW with the fused kernel where this PyTorch build has one for the device; with `kernel`,
    a `ClippingAdamW`, whose clipping and step go through attnlab's C++ kernel where it applies."""
    groups = param_groups(model, weight_decay)
    if kernel:
        return ClippingAdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    try:
        return versions_follow_steps(torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True))
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


def versions_follow_steps(optimizer: T) -> T:
    """`optimizer`, whose every step also bumps its parameters' version counters. PyTorch's fused
    Adam and AdamW update the weights in place without them, and what is kept per weight version
    (the reordered copies of `attnlab.accel.projection`, which evaluation and beam search use
    during training) would go on computing with the weights of before the step."""

    def bump(opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        torch.autograd.graph.increment_version([p for group in opt.param_groups for p in group["params"]])

    optimizer.register_step_post_hook(bump)
    return optimizer


def adam_l2(model: nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.Adam:
    """Adam (Kingma & Ba 2015) with an L2 penalty (weight_decay / 2)·‖θ‖² on every parameter, its
    gradient weight_decay·θ added to the loss's before the moments are taken (coupled, unlike AdamW).

    The recipe of the graph papers: GAT's reference code adds the L2 loss of every variable (its
    name filter for biases never matches a TensorFlow name such as "conv1d/bias:0", so biases are
    penalised too), GCN's that of its weights, and PyTorch Geometric's examples pass
    `weight_decay=5e-4` to `torch.optim.Adam` for all parameters. Through Adam's normalisation the
    penalty acts far more strongly than AdamW's decoupled decay of the same size: at lr 0.005, AdamW
    with 5e-4 would shrink a weight by 2.5e-6 of itself per step, next to nothing.
    """
    params = [p for p in model.parameters() if p.requires_grad]  # a frozen weight (LoRA's base) has no state
    try:
        fused = torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)
        return versions_follow_steps(fused)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """PyTorch's global L2 norm of the gradients of `params` (each has one; a 0-dim tensor, no host
    sync), clipping them in place to `max_norm` first when it is above 0."""
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in params])


class ClippingAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` that takes the gradient clipping into its step, one C++ call each for a
    CPU model's fp32 parameters (attnlab's training kernels).

    `clip_grad_norm_(max_norm)` returns the gradients' global L2 norm, as
    `torch.nn.utils.clip_grad_norm_` does, but leaves the gradients as they are and keeps the factor
    min(1, max_norm / (norm + 1e-6)); the next `step()` multiplies each gradient by it as it reads
    it. PyTorch's clipping and fused AdamW take the parameters one tensor at a time, a parallel
    region each for the norm, the scaling and the update; the kernel shares the chunks of all
    tensors between the threads (`benchmarks/optimizer_step.py`; BENCHMARKS.md, "Tuned CPU paths").

    The arithmetic and the state (exp_avg, exp_avg_sq and a float32 step per parameter) are
    torch's AdamW's, so a run resumes with or without the kernel. Where the kernel does not apply
    (a parameter off the CPU or not fp32, a sparse gradient, amsgrad or maximize, a gradient
    scaler's step, a build that failed), both calls are PyTorch's, and the clipping happens in place.
    """

    def __init__(self, params, *, lr: float, betas: tuple[float, float], weight_decay: float) -> None:
        params = list(params)
        try:  # PyTorch's own steps, where the kernel does not apply: fused where the device has it
            super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)
        except (RuntimeError, TypeError):
            super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self._factor = 1.0  # the clipping factor the next kernel step applies

    def _with_grads(self) -> list[tuple[torch.Tensor, dict]]:
        return [(p, group) for group in self.param_groups for p in group["params"] if p.grad is not None]

    def _kernel(self, pairs: list[tuple[torch.Tensor, dict]]) -> ModuleType | None:
        """The extension when it takes every parameter with a gradient; else None."""
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            return None  # fp16: the gradient scaler drives the step
        for p, group in pairs:
            g = p.grad
            if p.device.type != "cpu" or p.dtype != torch.float32 or g.dtype != torch.float32:
                return None
            if g.is_sparse or not (p.is_contiguous() and g.is_contiguous()):
                return None
            if group["amsgrad"] or group["maximize"] or torch.is_tensor(group["lr"]):
                return None
        return kernels.extension()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The global L2 norm of the gradients (a 0-dim tensor), clipping them to `max_norm` when it
        is above 0: at the next step with the kernel, in place here without it."""
        pairs = self._with_grads()
        extension = self._kernel(pairs)
        if extension is None:
            self._factor = 1.0
            return clip_grad_norm([p for p, _ in pairs], max_norm)
        norm = extension.global_norm([p.grad for p, _ in pairs])
        self._factor = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
        return torch.tensor(norm, dtype=torch.float32)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._factor = 1.0  # a skipped step's clipping is not the next gradients'
        super().zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One AdamW step, the gradients clipped by the factor the last `clip_grad_norm_` kept."""
        factor, self._factor = self._factor, 1.0
        pairs = self._with_grads()
        extension = None if closure is not None else self._kernel(pairs)
        if extension is None:
            if factor != 1.0:  # measured by the kernel, stepped without it
                torch._foreach_mul_([p.grad for p, _ in pairs], factor)
            return super().step(closure)
        states = []
        for p, _ in pairs:
            state = self.state[p]
            if not state:  # as torch's AdamW starts a parameter's state
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            states.append(state)
        groups = [group for _, group in pairs]
        extension.adamw_step(
            [p for p, _ in pairs],
            [p.grad for p, _ in pairs],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["step"] for s in states],
            [float(g["lr"]) for g in groups],
            [float(g["weight_decay"]) for g in groups],
            [float(g["betas"][0]) for g in groups],
            [float(g["betas"][1]) for g in groups],
            [float(g["eps"]) for g in groups],
            factor,
        )
        # The kernel writes through data pointers, which autograd's version counters do not see: a
        # copy keyed on a parameter's version (the reordered weights of attnlab.accel.projection, the
        # fused steps) would otherwise go on serving the weights from before this step.
        torch.autograd.graph.increment_version([p for p, _ in pairs])
        return None
