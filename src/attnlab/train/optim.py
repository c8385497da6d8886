"""Optimizer construction."""

import torch
from torch import nn


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


def adamw(model: nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float, device: torch.device):
    """AdamW with the fused kernel where this PyTorch build has one for the device."""
    groups = param_groups(model, weight_decay)
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=betas)
