"""A mixture of feed-forward experts with a learned top-k router, in place of the dense layer.

Each token's router probabilities p = softmax(x W_r) pick its k most likely experts; the layer's
output is the sum of those experts' outputs weighted by their gates. k = 1 is the Switch
Transformer (Fedus et al. 2021: the gate is p itself, so the router learns through it); k = 2 with
the two probabilities renormalised to sum to 1 is GShard's and Mixtral's rule. `renormalize` names
the rule apart from k: Qwen3-MoE keeps the k probabilities as they are (`norm_topk_prob` false, the
gates then sum to less than 1), and Mixtral renormalises even one (its one expert gets gate 1).

An expert takes at most `capacity = ceil(capacity_factor · N · k / E)` of a batch's N tokens
(first choices first, then second choices, each in token order); a token over capacity gets nothing
from that expert and passes through the residual connection unchanged. Capacity factor 0: no limit.

The load-balancing loss (Switch Eq. 4) E · Σ_i f_i P_i, f_i the fraction of the routed choices sent
to expert i and P_i its mean probability, is 1 when routing is uniform; the router z-loss
(Zoph et al. 2022) mean(logsumexp(x W_r)²) keeps the logits small. Both, weighted, wait in
`aux_losses` until the model collects them (`collect_aux_loss`).

Shape legend: N tokens, C model dim, F hidden width, E experts, k choices per token.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.feedforward import activate, check_activation, is_gated


class Experts(nn.Module):
    """E feed-forward layers stored stacked, run as batched matrix products: x `(E, n, C)` ->
    `(E, n, C)`, expert e on row block e. fc1 `(E, F or 2F, C)` and fc2 `(E, C, F)` are the
    experts' `Linear` weights (gated units stack `[W; V]` in fc1 as `GatedFeedForward` does)."""

    def __init__(self, n_experts: int, d_model: int, d_ff: int, *, activation: str, bias: bool = True) -> None:
        super().__init__()
        check_activation(activation)
        self.activation = activation
        width = 2 * d_ff if is_gated(activation) else d_ff
        self.fc1 = nn.Parameter(torch.randn(n_experts, width, d_model) * 0.02)
        self.fc2 = nn.Parameter(torch.randn(n_experts, d_model, d_ff) * 0.02)
        self.fc1_bias = nn.Parameter(torch.zeros(n_experts, 1, width)) if bias else None
        self.fc2_bias = nn.Parameter(torch.zeros(n_experts, 1, d_model)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.baddbmm(self.fc1_bias, x, self.fc1.mT) if self.fc1_bias is not None else x @ self.fc1.mT
        h = activate(self.activation, h)
        return torch.baddbmm(self.fc2_bias, h, self.fc2.mT) if self.fc2_bias is not None else h @ self.fc2.mT


class MixtureOfExperts(nn.Module):
    """A top-k routed mixture of `experts` feed-forward layers: x `(B, T, C)` -> `(B, T, C)`."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        experts: int,
        top_k: int = 2,
        capacity_factor: float = 0.0,
        activation: str = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
        aux_weight: float = 0.01,
        z_weight: float = 0.0,
        renormalize: bool | None = None,
    ) -> None:
        super().__init__()
        check_experts(experts, top_k, capacity_factor)
        self.n_experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
        self.renormalize = top_k > 1 if renormalize is None else renormalize
        """Whether each token's k gates are rescaled to sum to 1 (None: when k > 1, see the module docstring)."""
        self.aux_weight, self.z_weight = aux_weight, z_weight
        self.activation = activation
        self.router = nn.Linear(d_model, experts, bias=False)
        self.experts = Experts(experts, d_model, d_ff, activation=activation, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.aux_losses: list[torch.Tensor] = []
        """Weighted auxiliary losses of the training forwards since the model last collected them."""
        self.last_aux: torch.Tensor | None = None
        self.dropped = 0.0
        """Fraction of the last batch's routed choices that were over capacity."""

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router probabilities `(N, E)` fp32, and each token's k gates `(N, k)` and experts `(N, k)`
        for tokens x `(N, C)`."""
        logits = self.router(x).float()
        probs = logits.softmax(dim=-1)
        gates, chosen = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        if self.training and (self.aux_weight > 0 or self.z_weight > 0):
            aux = self._aux_loss(logits, probs, chosen)
            self.aux_losses.append(aux)
            self.last_aux = aux.detach()
        return probs, gates, chosen

    def _aux_loss(self, logits: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        counts = torch.zeros(self.n_experts, device=probs.device).index_add_(
            0, chosen.reshape(-1), torch.ones(chosen.numel(), device=probs.device)
        )
        balance = self.n_experts * (counts / chosen.numel() * probs.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        return self.aux_weight * balance + self.z_weight * z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # (N, C)
        n, e = tokens.size(0), self.n_experts
        _, gates, chosen = self.route(tokens)
        # Choices in priority order: every token's first choice, then every token's second.
        expert = chosen.t().reshape(-1)  # (kN,)
        token = torch.arange(n, device=x.device).repeat(self.top_k)  # (kN,)
        gate = gates.t().reshape(-1)  # (kN,)
        one_hot = F.one_hot(expert, e)  # (kN, E)
        slot = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # place in its expert's queue
        busiest = int(one_hot.sum(dim=0).max())
        capacity = busiest if self.capacity_factor == 0 else min(busiest, self.capacity(n))
        keep = slot < capacity
        self.dropped = 1.0 - keep.float().mean().item()
        expert, token, gate, slot = expert[keep], token[keep], gate[keep], slot[keep]
        rows = expert * capacity + slot  # (kept,) row of the dispatch buffer
        buffer = tokens.new_zeros(e * capacity, shape[-1]).index_copy_(0, rows, tokens[token])
        out = self.experts(buffer.view(e, capacity, -1)).view(e * capacity, -1)  # (E·cap, C)
        # the experts' dtype, not the tokens': under autocast their products come back in bf16
        y = tokens.new_zeros(tokens.shape, dtype=out.dtype).index_add_(
            0, token, out[rows] * gate[:, None].to(out.dtype)
        )
        return self.dropout(y.view(shape))

    def capacity(self, n_tokens: int) -> int:
        """Most tokens an expert takes from a batch of n_tokens."""
        return max(1, math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts))


def check_experts(experts: int, top_k: int, capacity_factor: float) -> None:
    """ValueError when the experts do not fit: fewer than k, k < 1, or a negative capacity factor."""
    if experts < 1:
        raise ValueError(f"experts must be >= 1 for a mixture, got {experts}")
    if not 1 <= top_k <= experts:
        raise ValueError(f"expert_top_k must be between 1 and experts ({experts}), got {top_k}")
    if capacity_factor < 0:
        raise ValueError(f"capacity_factor must be >= 0 (0: no limit), got {capacity_factor}")


def collect_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """The sum of the auxiliary losses every mixture in `model` gathered since the last call, and
    forget them; None when it has none."""
    losses = []
    for m in model.modules():
        if isinstance(m, MixtureOfExperts):
            losses += m.aux_losses
            m.aux_losses = []
    return torch.stack(losses).sum() if losses else None


def moe_stats(model: nn.Module) -> dict[str, float]:
    """The mixtures' last training batch, averaged over layers: the weighted auxiliary loss and the
    fraction of routed choices dropped over capacity; {} for a model without experts."""
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    if not layers:
        return {}
    aux = [m.last_aux for m in layers if m.last_aux is not None]
    stats = {"dropped_tokens": sum(m.dropped for m in layers) / len(layers)}
    if aux:
        stats["aux_loss"] = torch.stack(aux).mean().item()
    return stats
