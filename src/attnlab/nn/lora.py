"""LoRA: low-rank adapters on frozen linear layers (Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models").

A frozen weight W₀ `(out, in)` is adapted by a product of two small matrices, Eq. (3):
    h = W₀ x + ΔW x = W₀ x + B A x · α/r,    A `(r, in)`, B `(out, r)`, r ≪ min(in, out)
A starts from Kaiming-uniform noise and B from zeros (§4.1), so the adapted model starts as the
base model; α/r scales the update so that a change of r needs no change of learning rate (§4.1).
Dropout, where asked for, acts on the adapter's input alone (as `peft`'s `LoraLayer` does).

attnlab stacks some projections in one `nn.Linear`: attention's `in_proj` holds `[q; k; v]` and a
gated feed-forward's `fc1` holds `[gate; up]`. LoRA adapts each of them part by part: one (A, B)
pair per targeted slice of output rows, so that "query and value" (the paper's choice, §7.1)
adapts those rows alone, exactly as adapters on separate q, k, v layers would.

The parts by name (`PARTS`): query, key, value and output (attention's out projection), ff-in
and ff-out (a feed-forward layer's first and second matrices; in a gated layer ff-in is the "up"
half of fc1) and gate (the activated half of a gated layer's fc1). Cross-attention and the experts
of a mixture are not adapted.

`LoRALinear` is an `nn.Linear` (its `weight` and `bias` are the frozen base's, under their own
names, so a base checkpoint loads into an adapted model unchanged) with the adapters beside them:
`lora_A.<part>` and `lora_B.<part>`.
"""

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.feedforward import FeedForward, GatedFeedForward

PARTS = ("query", "key", "value", "output", "gate", "ff-in", "ff-out")
"""The parts a LoRA target may name."""


def adapter_key(part: str) -> str:
    """The key of a part's adapter in `lora_A` / `lora_B`: "ff-in" -> "ff_in"."""
    return part.replace("-", "_")


class LoRALinear(nn.Linear):
    """A frozen `nn.Linear` plus low-rank adapters on slices of its output rows.

    x `(..., in)` -> `(..., out)`: base(x), plus on each adapted slice [start, stop) of the output
    dropout(x) Aᵀ Bᵀ · alpha / rank (A `(rank, in)`, B `(stop - start, rank)`). `slices` maps a
    part's name to its rows; None adapts all of them under the name "all". All slices share one
    dropout draw of x.
    """

    def __init__(
        self,
        base: nn.Linear,
        rank: int,
        alpha: float,
        *,
        dropout: float = 0.0,
        slices: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: the weights are the base's own tensors
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        self.slices = dict(sorted((slices or {"all": (0, base.out_features)}).items(), key=lambda kv: kv[1]))
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        for part, (start, stop) in self.slices.items():
            a = torch.empty(rank, self.in_features, **factory)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # as peft (and nn.Linear) initialise
            self.lora_A[adapter_key(part)] = nn.Parameter(a)
            self.lora_B[adapter_key(part)] = nn.Parameter(torch.zeros(stop - start, rank, **factory))
        self.merged = False

    def delta(self, part: str, x: torch.Tensor) -> torch.Tensor:
        """One adapter's update of its rows: x `(..., in)` -> `(..., rows)`, dropout not applied."""
        key = adapter_key(part)
        return F.linear(F.linear(x, self.lora_A[key]), self.lora_B[key]) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.merged:
            return y
        h = self.lora_dropout(x)
        pieces, at = [], 0
        for part, (start, stop) in self.slices.items():
            if start > at:
                pieces.append(y[..., at:start])
            pieces.append(y[..., start:stop] + self.delta(part, h))
            at = stop
        if at < self.out_features:
            pieces.append(y[..., at:])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)

    def delta_weight(self) -> torch.Tensor:
        """ΔW `(out, in)`: B A · alpha / rank on each adapted slice, zeros elsewhere."""
        delta = torch.zeros_like(self.weight)
        for part, (start, stop) in self.slices.items():
            key = adapter_key(part)
            delta[start:stop] = (self.lora_B[key] @ self.lora_A[key]) * self.scaling
        return delta

    @torch.no_grad()
    def merge(self) -> None:
        """W₀ += ΔW: the adapters folded into the weight (§4.1: no extra latency at inference)."""
        if not self.merged:
            self.weight += self.delta_weight().to(self.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W₀ -= ΔW: back to the frozen base weight and the separate adapters."""
        if self.merged:
            self.weight -= self.delta_weight().to(self.weight.dtype)
            self.merged = False

    @torch.no_grad()
    def merged_linear(self) -> nn.Linear:
        """A plain `nn.Linear` computing W₀ + ΔW (this layer is left as it is)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.weight if self.merged else self.weight + self.delta_weight().to(self.weight.dtype)
        linear.weight = nn.Parameter(weight.detach().clone())
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias.detach().clone())
        return linear

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}, parts={list(self.slices)}"


def lora_sites(model: nn.Module) -> dict[str, dict[str, tuple[int, int]]]:
    """Every linear layer LoRA can adapt, by module name, with the rows of each part it holds:
    `{"blocks.0.attn.in_proj": {"query": (0, C), "key": (C, C + Ckv), "value": (...)}, ...}`.
    A shared block is listed once (under its first name)."""
    sites: dict[str, dict[str, tuple[int, int]]] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, MultiHeadAttention) and not _is_cross_attention(name):
            c, kv = module.q_dim, module.kv_dim  # the queries are H·D rows, the width unless heads are sized apart
            sites[prefix + "in_proj"] = {"query": (0, c), "key": (c, c + kv), "value": (c + kv, c + 2 * kv)}
            sites[prefix + "out_proj"] = {"output": (0, module.out_proj.out_features)}
        elif isinstance(module, FeedForward):
            sites[prefix + "fc1"] = {"ff-in": (0, module.fc1.out_features)}
            sites[prefix + "fc2"] = {"ff-out": (0, module.fc2.out_features)}
        elif isinstance(module, GatedFeedForward):
            f = module.fc1.out_features // 2  # fc1 is [gate; up]: the first half is activated
            sites[prefix + "fc1"] = {"gate": (0, f), "ff-in": (f, 2 * f)}
            sites[prefix + "fc2"] = {"ff-out": (0, module.fc2.out_features)}
    return sites


def _is_cross_attention(name: str) -> bool:
    return name.rsplit(".", 1)[-1] == "cross_attn"


def add_lora(model: nn.Module, targets: Sequence[str], rank: int, alpha: float, dropout: float = 0.0) -> list[str]:
    """Replace the linear layers holding the `targets` parts by `LoRALinear`s (in place); returns
    their module names. A ValueError names a target that is no part of `PARTS` or that no layer of
    this model holds (a gate in a dense feed-forward layer, say)."""
    unknown = [t for t in targets if t not in PARTS]
    if unknown:
        raise ValueError(f"unknown LoRA target {unknown[0]!r}; the parts are {', '.join(PARTS)}")
    sites = lora_sites(model)
    held = {part for parts in sites.values() for part in parts}
    absent = [t for t in targets if t not in held]
    if absent:
        raise ValueError(
            f"LoRA target {absent[0]!r} names no part of this {type(model).__name__}; "
            f"its parts are {', '.join(p for p in PARTS if p in held)}"
        )
    wrapped = []
    for name, parts in sites.items():
        chosen = {part: rows for part, rows in parts.items() if part in targets}
        if chosen:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha, dropout=dropout, slices=chosen))
            wrapped.append(name)
    return wrapped


def merge_lora(model: nn.Module) -> nn.Module:
    """`model` with every `LoRALinear` replaced by the plain `nn.Linear` it computes (in place):
    the model as its family's own code and exporters know it."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, module.merged_linear())
    return model


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's `LoRALinear`s by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
