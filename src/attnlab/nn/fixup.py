"""Fixup initialisation (Zhang et al. 2019, "Fixup Initialization: Residual Learning Without
Normalization", §3): a residual network trained with no normalisation layer at all.

The paper's three rules, for L residual branches of m weight layers each:
1. initialise the last layer of every branch at 0 (each block starts as the identity map), and the
   classification layer too;
2. initialise the branches' other layers as usual, then rescale them by L^(−1/(2m−2));
3. add a scalar multiplier (initialised at 1) to every branch and scalar biases (initialised at 0)
   before the layers.

In a Transformer block each branch (attention: the value projection then the output projection;
feed-forward: fc1 then fc2) has m = 2 weight layers on its linear path, so the rescaling is
L^(−1/2); L counts every branch application (2 per GPT block, 3 per decoder block). The scalar
biases sit at the branch's input (`FixupBias`, where a norm would be) and, with the multiplier, at
its output (`FixupScale`, where ReZero's α is); the layers' own bias vectors stand in for the
scalars between fc1 and fc2. A tied output layer is the embedding, so it keeps the embedding's
initialisation (rule 1 applies to untied heads only).
"""

import torch
from torch import nn

from attnlab.nn.attention import MultiHeadAttention
from attnlab.nn.feedforward import FeedForward, GatedFeedForward
from attnlab.nn.moe import Experts


def fixup_scale(n_branches: int, m: int = 2) -> float:
    """L^(−1/(2m−2)): `(16, 2)` -> 0.25, `(8, 3)` -> 8^(−1/4)."""
    if m < 2:
        raise ValueError(f"a Fixup branch has m >= 2 weight layers, got {m}")
    return n_branches ** (-1.0 / (2 * m - 2))


class FixupBias(nn.Module):
    """x + b with one scalar b, initialised at 0: Fixup's bias before a branch's first layer."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class FixupScale(nn.Module):
    """m · x + b with scalars m (initialised at 1) and b (at 0): a branch's multiplier and output bias."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x + self.bias


@torch.no_grad()
def fixup_init(stack: nn.Module, n_branches: int, head: nn.Module | None = None) -> None:
    """Apply rules 1 and 2 to every residual branch in `stack`, after the model's usual
    initialisation: attention's output projection at 0 and its value projection (the rows of
    `in_proj` on the branch's linear path; queries and keys only weigh it) times L^(−1/2); a
    feed-forward layer's (or each expert's) fc2 at 0 and fc1 times L^(−1/2). `head`'s weight at 0
    when given (an untied classification layer). Shared blocks are visited once."""
    scale = fixup_scale(n_branches)
    for module in stack.modules():
        if isinstance(module, MultiHeadAttention):
            module.in_proj.weight[-module.kv_dim :].mul_(scale)
            module.out_proj.weight.zero_()
        elif isinstance(module, FeedForward | GatedFeedForward):
            module.fc1.weight.mul_(scale)
            module.fc2.weight.zero_()
        elif isinstance(module, Experts):
            module.fc1.mul_(scale)
            module.fc2.zero_()
    if head is not None:
        head.weight.zero_()
