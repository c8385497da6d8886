"""Input embeddings and output softmaxes of a language model, chosen by name.

- plain / full: one embedding matrix in, one linear layer and a softmax out (tied by default,
  Press & Wolf 2017).
- adaptive input (Baevski & Auli 2019, §3): the vocabulary, ranked by frequency, is cut into
  clusters; cluster i is embedded in d / k^i dimensions (k = `div`, 4 in the paper) and projected
  up to d. Frequent tokens get wide vectors, rare ones narrow.
- adaptive softmax (Grave et al. 2017, §3.3–3.4): a head scores the frequent tokens (the shortlist)
  and one "cluster token" per tail cluster; a token of tail cluster i has probability
  p(cluster i | h) · p(token | cluster i, h). With projection, tail cluster i first projects h to
  d / k^(i+1) dimensions (PyTorch's `nn.AdaptiveLogSoftmaxWithLoss`); without, it scores from h.
- mixture of softmaxes (Yang et al. 2018, Eq. 3): P(x | h) = Σ_k π_k softmax(W tanh(P_k h))_x with
  the prior π = softmax(W_π h): K softmaxes break the softmax bottleneck's rank limit.

Every output layer here returns scores `(..., V)` that are log-probabilities (log-softmax of them is
themselves), so the loss (`F.cross_entropy`), sampling, top-k and beam search read them as logits.

Clusters are ranges of frequency ranks, not of token ids: `rank` (a buffer, saved with the weights)
maps a token id to its rank, identity until `rank_by_frequency` is given the training counts.

Shape legend: B batch, T time, C model width, V vocabulary, K mixture components.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.nn.positions import check_choice

INPUT_EMBEDDINGS = ("plain", "adaptive")
"""Token embeddings: one matrix, or adaptive input embeddings (Baevski & Auli 2019)."""

SOFTMAXES = ("full", "adaptive", "adaptive-unprojected", "mos")
"""Output layers: the full softmax; the adaptive softmax with and without the tail clusters'
projections (Grave et al. 2017); the mixture of softmaxes (Yang et al. 2018)."""


def cluster_bounds(vocab_size: int, cutoffs: Sequence[int]) -> list[int]:
    """The clusters' boundaries in rank order, `[0, c_1, ..., V]`:
    `(65, (16, 32))` -> `[0, 16, 32, 65]`; empty cutoffs: V // 4 and V // 2."""
    cuts = list(cutoffs) or [vocab_size // 4, vocab_size // 2]
    return [0, *cuts, vocab_size]


def check_cutoffs(vocab_size: int, cutoffs: Sequence[int]) -> None:
    """ValueError unless the cutoffs rise strictly inside (0, vocab_size): every cluster non-empty."""
    bounds = cluster_bounds(vocab_size, cutoffs)
    if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(
            f"adaptive_cutoffs must rise strictly between 0 and vocab_size {vocab_size}, "
            f"got {list(cutoffs) or 'the default (vocab_size // 4, vocab_size // 2)'}"
        )


def cluster_dim(d_model: int, div: float, i: int) -> int:
    """Cluster i's width d / k^i, at least 1 (Baevski & Auli §3)."""
    return max(1, int(d_model // div**i))


class RankedVocabulary(nn.Module):
    """Holds `rank` `(V,)` long: token id -> frequency rank (0 = most frequent)."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.register_buffer("rank", torch.arange(vocab_size))

    @torch.no_grad()
    def rank_by_frequency(self, counts: torch.Tensor) -> None:
        """Order the clusters by `counts` `(V,)` (how often each id occurs; ties by id)."""
        order = torch.sort(counts.to(self.rank.device), descending=True, stable=True).indices
        self.rank[order] = torch.arange(len(order), device=self.rank.device)


class AdaptiveInput(RankedVocabulary):
    """Adaptive input embeddings: ids `(B, T)` long -> `(B, T, C)`. Cluster i's vectors have
    d / div^i entries and a projection `proj[i]` `(d_i, C)` up to the width (none for cluster 0,
    which is already C wide: a second matrix there would only multiply the first)."""

    def __init__(self, vocab_size: int, d_model: int, cutoffs: Sequence[int] = (), div: float = 4.0) -> None:
        super().__init__(vocab_size)
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        self.d_model = d_model
        dims = [cluster_dim(d_model, div, i) for i in range(len(self.bounds) - 1)]
        self.embeddings = nn.ModuleList(
            nn.Embedding(hi - lo, d) for lo, hi, d in zip(self.bounds, self.bounds[1:], dims, strict=False)
        )
        # Stored (d_i, C) so that the adaptive softmax can share each one as its (transposed) projection.
        self.proj = nn.ParameterList(nn.Parameter(torch.randn(d, d_model) * d**-0.5) for d in dims[1:])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ranks = self.rank[ids]
        out = None
        for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:], strict=False)):
            inside = (ranks >= lo) & (ranks < hi)
            e = self.embeddings[i]((ranks - lo).clamp(0, hi - lo - 1))  # (B, T, d_i)
            if i > 0:
                e = e @ self.proj[i - 1]  # (B, T, C)
            e = e * inside.unsqueeze(-1).to(e.dtype)
            out = e if out is None else out + e
        return out


class AdaptiveSoftmax(RankedVocabulary):
    """The adaptive softmax: h `(..., C)` -> log-probabilities `(..., V)` in token-id order.

    `head` `(c_1 + n_tail, C)`: the shortlist's rows, then one row per tail cluster; `tails[i]`
    `(n_i, d_i)` with `proj[i]` `(d_i, C)` (projected: d_i = C / div^(i+1)), or `(n_i, C)` without
    projection. Biases: none, as `nn.AdaptiveLogSoftmaxWithLoss` has by default."""

    def __init__(
        self, d_model: int, vocab_size: int, cutoffs: Sequence[int] = (), div: float = 4.0, *, projected: bool = True
    ) -> None:
        super().__init__(vocab_size)
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        n_tail = len(self.bounds) - 2
        self.shortlist = nn.Parameter(torch.randn(self.bounds[1], d_model) * 0.02)
        self.cluster_head = nn.Parameter(torch.randn(n_tail, d_model) * 0.02)
        dims = [cluster_dim(d_model, div, i + 1) if projected else d_model for i in range(n_tail)]
        sizes = [hi - lo for lo, hi in zip(self.bounds[1:], self.bounds[2:], strict=False)]
        self.tails = nn.ParameterList(nn.Parameter(torch.randn(n, d) * 0.02) for n, d in zip(sizes, dims, strict=False))
        self.proj = (
            nn.ParameterList(nn.Parameter(torch.randn(d, d_model) * d_model**-0.5) for d in dims) if projected else None
        )

    def tail_hidden(self, h: torch.Tensor, i: int) -> torch.Tensor:
        """Tail cluster i's view of h: projected to d_i, or h itself."""
        return h if self.proj is None else F.linear(h, self.proj[i])

    def ranked_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """log p(token of rank r | h) for every rank: `(..., V)` in rank order."""
        head = F.log_softmax(F.linear(h, torch.cat([self.shortlist, self.cluster_head])), dim=-1)
        parts = [head[..., : self.bounds[1]]]
        for i in range(len(self.tails)):
            tail = F.log_softmax(F.linear(self.tail_hidden(h, i), self.tails[i]), dim=-1)
            parts.append(tail + head[..., self.bounds[1] + i, None])
        return torch.cat(parts, dim=-1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.ranked_log_probs(h).index_select(-1, self.rank)

    def nll(self, h: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1) -> torch.Tensor:
        """Mean −log p(target | h) over the targets that are not `ignore_index`, computing each
        tail only for the rows whose target lies in it (Grave et al.'s saving). h `(N, C)`, targets `(N,)`."""
        keep = targets != ignore_index
        h, ranks = h[keep], self.rank[targets[keep]]
        head = F.log_softmax(F.linear(h, torch.cat([self.shortlist, self.cluster_head])), dim=-1)
        short = ranks < self.bounds[1]
        logp = head.gather(1, torch.where(short, ranks, 0)[:, None]).squeeze(1)
        for i, (lo, hi) in enumerate(zip(self.bounds[1:], self.bounds[2:], strict=False)):
            rows = ((ranks >= lo) & (ranks < hi)).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            tail = F.log_softmax(F.linear(self.tail_hidden(h[rows], i), self.tails[i]), dim=-1)
            within = tail.gather(1, (ranks[rows] - lo)[:, None]).squeeze(1)
            logp = logp.index_copy(0, rows, within + head[rows, self.bounds[1] + i])
        return -logp.mean()


class MixtureOfSoftmaxes(nn.Module):
    """Mixture of softmaxes (Yang et al. 2018, Eq. 3): h `(..., C)` -> log Σ_k π_k softmax(W h_k + b)
    `(..., V)`, h_k = tanh(P_k h), π = softmax(W_π h). `decoder` (W, b) is one matrix for every
    component (tied to the token embedding as in the paper when the model ties its weights)."""

    def __init__(self, d_model: int, vocab_size: int, components: int = 4) -> None:
        super().__init__()
        self.components = components
        self.prior = nn.Linear(d_model, components, bias=False)
        self.latent = nn.Linear(d_model, components * d_model)
        self.decoder = nn.Linear(d_model, vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        log_prior = F.log_softmax(self.prior(h), dim=-1)  # (..., K)
        hk = torch.tanh(self.latent(h)).unflatten(-1, (self.components, -1))  # (..., K, C)
        log_probs = F.log_softmax(self.decoder(hk), dim=-1)  # (..., K, V)
        return torch.logsumexp(log_prior.unsqueeze(-1) + log_probs, dim=-2)  # (..., V)


@dataclass(frozen=True)
class EmbeddingOptions:
    """Config fields of a language model's input embedding and output softmax (a mixin of the
    GPT's config, as `BlockOptions` is of every family's)."""

    input_embedding: str = "plain"
    """Token embeddings, one of attnlab.nn.INPUT_EMBEDDINGS: plain (one matrix) or adaptive
    (Baevski & Auli 2019: cluster i in d / adaptive_div^i dimensions, projected to the width)."""
    softmax: str = "full"
    """Output layer, one of attnlab.nn.SOFTMAXES: full; adaptive, adaptive-unprojected (Grave et
    al. 2017, with and without the tail clusters' projections); mos (mixture of softmaxes)."""
    adaptive_cutoffs: tuple[int, ...] = ()
    """Where the adaptive clusters begin, in frequency ranks (rising, each < vocab_size); empty:
    vocab_size // 4 and vocab_size // 2."""
    adaptive_div: float = 4.0
    """The adaptive clusters' shrink factor k: cluster i is d / k^i wide."""
    mos_components: int = 4
    """Mixture of softmaxes: the number K of softmaxes mixed."""

    def check_embeddings(self, vocab_size: int | None, *, tied: bool, factorized: bool) -> None:
        """ValueError naming the field of a combination that cannot be built."""
        check_choice("input_embedding", self.input_embedding, INPUT_EMBEDDINGS)
        check_choice("softmax", self.softmax, SOFTMAXES)
        if self.adaptive_div < 1:
            raise ValueError(f"adaptive_div must be >= 1, got {self.adaptive_div}")
        if self.mos_components < 1:
            raise ValueError(f"mos_components must be >= 1, got {self.mos_components}")
        adaptive = self.input_embedding == "adaptive" or self.softmax.startswith("adaptive")
        if adaptive and vocab_size is not None:
            check_cutoffs(vocab_size, self.adaptive_cutoffs)
        if factorized and (self.input_embedding != "plain" or self.softmax != "full"):
            raise ValueError(
                "embedding_dim factorizes the plain embedding and the full softmax; adaptive and mixture "
                "layers have their own widths: leave embedding_dim unset"
            )
        if tied and not self.can_tie:
            raise ValueError(
                f"tie_weights shares one matrix between input_embedding {self.input_embedding!r} and softmax "
                f"{self.softmax!r}, which have none in common; set tie_weights = false (adaptive input ties "
                "with softmax 'adaptive' only)"
            )

    @property
    def can_tie(self) -> bool:
        """Whether the input and output layers have matrices to share."""
        if self.input_embedding == "plain":
            return self.softmax in ("full", "mos")
        return self.softmax == "adaptive"


def build_input_embedding(options: EmbeddingOptions, vocab_size: int, dim: int) -> nn.Module:
    """nn.Embedding `(V, dim)` or `AdaptiveInput`."""
    if options.input_embedding == "adaptive":
        return AdaptiveInput(vocab_size, dim, options.adaptive_cutoffs, options.adaptive_div)
    return nn.Embedding(vocab_size, dim)


def build_softmax(options: EmbeddingOptions, dim: int, vocab_size: int) -> nn.Module:
    """The output layer: nn.Linear `(dim -> V)` (logits), or one of the log-probability layers."""
    if options.softmax == "mos":
        return MixtureOfSoftmaxes(dim, vocab_size, options.mos_components)
    if options.softmax.startswith("adaptive"):
        projected = options.softmax == "adaptive"
        return AdaptiveSoftmax(dim, vocab_size, options.adaptive_cutoffs, options.adaptive_div, projected=projected)
    return nn.Linear(dim, vocab_size, bias=False)


def tie_embeddings(output: nn.Module, embedding: nn.Module) -> None:
    """Share the input embedding's matrices with the output layer (Press & Wolf 2017): the full
    softmax's and the mixture's decoder take the embedding; the adaptive softmax takes each
    cluster's vectors, the shortlist the first cluster's, and each tail projection the input's
    (transposed: Baevski & Auli §4.3)."""
    if isinstance(output, nn.Linear):
        output.weight = embedding.weight
    elif isinstance(output, MixtureOfSoftmaxes):
        output.decoder.weight = embedding.weight
    elif isinstance(output, AdaptiveSoftmax) and isinstance(embedding, AdaptiveInput):
        output.shortlist = embedding.embeddings[0].weight
        for i in range(len(output.tails)):
            output.tails[i] = embedding.embeddings[i + 1].weight
            output.proj[i] = embedding.proj[i]
        output.rank = embedding.rank
    else:
        raise ValueError(f"cannot tie {type(output).__name__} to {type(embedding).__name__}")


def rank_by_frequency(model: nn.Module, counts: torch.Tensor) -> bool:
    """Rank the clusters of every adaptive layer of `model` by `counts` `(V,)`; False where it has none."""
    layers = [m for m in model.modules() if isinstance(m, RankedVocabulary)]
    for layer in layers:
        layer.rank_by_frequency(counts)
    return bool(layers)


def log_prob_layer(output: nn.Module) -> bool:
    """Whether the output layer returns log-probabilities (adaptive, mixture) rather than logits."""
    return isinstance(output, AdaptiveSoftmax | MixtureOfSoftmaxes)


__all__ = [
    "INPUT_EMBEDDINGS",
    "SOFTMAXES",
    "AdaptiveInput",
    "AdaptiveSoftmax",
    "EmbeddingOptions",
    "MixtureOfSoftmaxes",
    "build_input_embedding",
    "build_softmax",
    "check_cutoffs",
    "cluster_bounds",
    "log_prob_layer",
    "rank_by_frequency",
    "tie_embeddings",
]
