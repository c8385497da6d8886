"""The lectures' cost table, measured: an RNN, an RNN with attention and a Transformer as t grows.

The lectures compare the three architectures through a table (per layer, sequence length t,
width k, d layers):

| | RNN | RNN + attention | Transformer |
| --- | --- | --- | --- |
| training complexity | t·k²·d | t²·k²·d | t²·k·d |
| test memory | k·d | t·k·d | t·k·d |
| sequential operations | t | t | d |
| maximum path length | t | 1 | 1 |

This module measures it on this machine. Three language models of matched width k and depth d,
each with a token embedding and a linear head over the same small vocabulary:

- `RNNLM`: a d-layer GRU stack (`torch.nn.GRU`), the state carried from token to token.
- `AttentionRNNLM`: the same GRU layers, each followed by additive attention (Bahdanau et al.
  2015, `attnlab.models.rnn.AdditiveAttention`) of every state over all previous states of its
  layer, combined as h̃_i = tanh(W_c [c_i; h_i]) (Luong et al. 2015, Eq. 5): the t² term.
- the Transformer: `attnlab.models.GPT`, d pre-norm blocks of `attnlab.nn` (causal
  `MultiHeadAttention` through the fused kernel, feed-forward 4k), sinusoidal positions.

On request (`CostSettings.attention`, `attnlab cost --attention window,bigbird`) the same GPT with
an attention pattern of `attnlab.nn.sparse` joins them, as extra columns beside full attention:
- "transformer-window": each query sees the last w keys (Beltagy et al. 2020, §3.1);
- "transformer-bigbird": blocks of b positions, each seeing its own and the previous block, the
  first global block and a random earlier block (Zaheer et al. 2020, causal form).
Their training forward is the pattern's blocked computation, O(t·w) per layer; their cached
generation step applies the pattern as a mask over the whole KV cache (the cache keeps every key),
so generating costs as much as with full attention: the table says so (THEORY). Linformer is not
among them: it projects all t positions into k rows, so no causal language model can use it; the
block-level study in benchmarks/attention_patterns.py measures it.

For every length t it measures, each case in a fresh process (see `peak memory` below):
- one training step on one sequence of t tokens: forward, cross-entropy, backward, AdamW;
- generating t tokens greedily after a one-token prompt, through `attnlab.decode.generate_tokens`
  for all three (the Transformer with its KV cache, the RNNs carrying their state: the same loop),
  the tokens streamed out rather than collected;
and it counts, from each architecture's dependency graph, the sequential steps of one forward and
the maximum path length between two positions (`count_steps`). The exponent of t is fitted by
least squares on the log–log points of the larger lengths (`fit_exponent`).

Peak memory on CPU. PyTorch's CPU allocator is invisible to tracemalloc, so the measure is the
operating system's: the peak resident set (Linux VmHWM) of a process that does nothing else,
lowered to the current resident set (/proc/self/clear_refs) after the model, the optimizer and a
short warm-up exist, and read again after the measured call. Every case runs in a fresh process,
forked from a server that has imported torch and attnlab but run nothing (`serve_cases`), so no
case inherits another's heap; glibc's mmap threshold is fixed at 64 KiB there, so large tensors are
mappings of their own, returned to the system when freed, and the peak follows the live tensors
rather than the heap's fragmentation. Resolution: one page (4 KiB); a reading of no growth is
recorded as one page, so that log–log fits stay finite ("no measurable growth"). Small blocks the
C allocator kept from the warm-up and reuses are not counted: what is measured is what the
full-length call needs beyond a short one.

Legend: t sequence length, k width, d layers, h heads, V vocabulary, B batch (1 here).

References:
- Vaswani et al. 2017, "Attention Is All You Need", Table 1 (complexity per layer, sequential
  operations, maximum path length), which the lectures' table extends to the RNN with attention.
- Bahdanau, Cho & Bengio 2015, Appendix A.1.2 (additive attention); Luong, Pham & Manning 2015, §3.
- Beltagy, Peters & Cohan 2020, "Longformer", §3.1 (sliding window); Zaheer et al. 2020, "Big Bird",
  §2 and App. D (window + global + random blocks).
"""

import dataclasses
import gc
import json
import math
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.bench import child_env, optional_number, peak_rss_bytes, reset_peak_rss
from attnlab.decode import generate_tokens, greedy_picker
from attnlab.models import GPT, GPTConfig
from attnlab.models.rnn import AdditiveAttention
from attnlab.train.optim import adamw

MODELS = ("rnn", "rnn-attention", "transformer")
"""The lectures' three models, measured by every run."""
TRANSFORMERS = {"transformer": "full", "transformer-window": "window", "transformer-bigbird": "bigbird"}
"""The GPTs a run can measure, each with its attention pattern (`GPTConfig.attention`)."""
ATTENTION_MODELS = {pattern: model for model, pattern in TRANSFORMERS.items() if pattern != "full"}
"""Attention pattern -> the model that `CostSettings.attention` adds for it."""
ALL_MODELS = (*MODELS, *ATTENTION_MODELS.values())
MODEL_LABELS = {
    "rnn": "RNN",
    "rnn-attention": "RNN+attention",
    "transformer": "Transformer",
    "transformer-window": "Transformer (window)",
    "transformer-bigbird": "Transformer (BigBird)",
}
SHORT_LABELS = {
    "rnn": "RNN",
    "rnn-attention": "RNN+att",
    "transformer": "Transf.",
    "transformer-window": "Window",
    "transformer-bigbird": "BigBird",
}
"""Labels short enough for the column headers of the measurements."""
KINDS = ("train", "generate")
VOCAB = 64
PAGE = 4096  # bytes: the resolution of resident-set readings
WARMUP_TOKENS = 8
CASE_BUDGET_S = 30.0  # a case whose `repeats` timed calls would take longer is timed once
ATTENTION_CHUNK = 64  # query positions per AdditiveAttention call in a training forward

DEFAULT_LENGTHS = (64, 128, 256, 512, 1024)
QUICK_LENGTHS = (8, 16, 32)


# -- settings --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostSettings:
    """What one `attnlab cost` run measures. Validated on construction (ValueError)."""

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    """Sequence lengths t, strictly increasing, each >= 2."""
    width: int = 64
    """Model width k of every model (GRU state, Transformer n_embd)."""
    layers: int = 2
    """Number of layers d of every model."""
    heads: int = 4
    """Attention heads of the Transformer; must divide width."""
    repeats: int = 3
    """Timed calls per case after the untimed memory call (a single one when `repeats` calls would
    take over `CASE_BUDGET_S`); the fastest is reported."""
    passes: int = 1
    """Sweeps over all cases; each case keeps its smallest reading. Passes spread a case's samples
    over the run, so a spell of load from other processes hits one of them, not all."""
    max_memory_mib: float = 4096.0
    """Skip a case whose peak, extrapolated quadratically from the model's previous length, would
    exceed this: the machine may be shared, and an out-of-memory kill can hit another process."""
    fit_from: int | None = None
    """Fit exponents on the lengths >= fit_from; None: the larger half of the lengths (at least two)."""
    attention: tuple[str, ...] = ()
    """Attention patterns measured beside the three models, each as a Transformer of that pattern
    (`ATTENTION_MODELS`: "window", "bigbird"); none by default."""
    attention_window: int = 64
    """Window w of "window": a query sees the last w keys, itself included."""
    attention_block: int = 32
    """Block length b of "bigbird"."""
    global_blocks: int = 1
    """BigBird's global blocks at the start of the sequence."""
    random_blocks: int = 1
    """BigBird's random key blocks per query block."""

    def __post_init__(self) -> None:
        if len(self.lengths) < 2:
            raise ValueError(f"lengths: give at least two lengths to fit a slope, got {list(self.lengths)}")
        if any(t < 2 for t in self.lengths):
            raise ValueError(f"lengths must all be >= 2, got {list(self.lengths)}")
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:], strict=False)):
            raise ValueError(f"lengths must be strictly increasing, got {list(self.lengths)}")
        if not self.max_memory_mib > 0:
            raise ValueError(f"max_memory_mib must be > 0, got {self.max_memory_mib}")
        for name in ("width", "layers", "heads", "repeats", "passes", "attention_window", "attention_block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("global_blocks", "random_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for pattern in self.attention:
            if pattern not in ATTENTION_MODELS:
                # Linformer is a pattern of attnlab.nn.sparse, but not one a language model can use.
                why = " (linformer mixes every position into k rows: no causal model can use it)"
                raise ValueError(
                    f"attention must be among {', '.join(ATTENTION_MODELS)}, got {pattern!r}"
                    + (why if pattern == "linformer" else "")
                )
        if len(set(self.attention)) != len(self.attention):
            raise ValueError(f"attention names a pattern twice: {list(self.attention)}")
        if self.width % self.heads != 0:
            raise ValueError(f"width ({self.width}) must be divisible by heads ({self.heads})")
        if self.fit_from is not None and len(self.fit_lengths) < 2:
            raise ValueError(
                f"fit_from {self.fit_from} leaves fewer than two lengths to fit; lengths are {list(self.lengths)}"
            )

    @property
    def fit_lengths(self) -> tuple[int, ...]:
        """The lengths the exponents are fitted on: overheads that do not grow with t (Python,
        kernel launches, the constant part of memory) dominate the short ones."""
        if self.fit_from is not None:
            return tuple(t for t in self.lengths if t >= self.fit_from)
        n = max(2, math.ceil(len(self.lengths) / 2))
        return self.lengths[-n:]

    @property
    def models(self) -> tuple[str, ...]:
        """The models measured: MODELS, then one Transformer per pattern of `attention`."""
        return MODELS + tuple(ATTENTION_MODELS[pattern] for pattern in self.attention)

    @classmethod
    def from_json(cls, fields: dict) -> "CostSettings":
        """The settings from `dataclasses.asdict` sent through JSON, which turned tuples into lists."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


# -- the models ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RNNLMConfig:
    """The shape of `RNNLM` and `AttentionRNNLM`; `block_size` is what `attnlab.decode` reads: the
    longest sequence the generation state is allocated for."""

    vocab_size: int
    n_embd: int
    """Width k."""
    n_layer: int
    """Layers d."""
    block_size: int


@dataclass
class RNNCarry:
    """The generation state of `RNNLM`: the hidden state of every layer `(d, B, k)`, nothing more
    (test memory k·d)."""

    hidden: torch.Tensor | None = None


class RNNLM(nn.Module):
    """Embedding, a d-layer GRU of width k, a linear head. `forward(idx (B, T))` -> logits `(B, T, V)`.

    Follows the decoding interface of `attnlab.decode`: `new_cache` gives the state to carry,
    `forward(idx, cache=state)` advances it by the tokens of idx.
    """

    def __init__(self, config: RNNLMConfig) -> None:
        super().__init__()
        self.config = config
        k = config.n_embd
        self.embedding = nn.Embedding(config.vocab_size, k)
        self.rnn = nn.GRU(k, k, config.n_layer, batch_first=True)
        self.head = nn.Linear(k, config.vocab_size)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> RNNCarry:
        return RNNCarry()

    def forward(
        self,
        idx: torch.Tensor,
        *,
        cache: RNNCarry | None = None,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits `(B, T, V)` for idx `(B, T)` long, or `(B, 1, V)` with `last_only`. With `cache`
        the GRU starts from its state and leaves its new state there; `positions` are not needed
        (the state knows where it is) and accepted for the decoding interface."""
        h, hidden = self.rnn(self.embedding(idx), None if cache is None else cache.hidden)  # (B, T, k)
        if cache is not None:
            cache.hidden = hidden  # (d, B, k)
        if last_only:
            h = h[:, -1:]
        return self.head(h)


@dataclass
class AttentionCarry:
    """What one `AttentionRNNLayer` carries while generating: its GRU state, and every state so far
    with its attention key, preallocated for `max_len` positions (test memory t·k per layer)."""

    states: torch.Tensor
    """h_1..h_max_len `(B, max_len, k)`; the first `length` are filled."""
    keys: torch.Tensor
    """U_a h_j `(B, max_len, k)`."""
    visible: torch.Tensor
    """All True `(B, max_len)`: every filled state may be attended to."""
    hidden: torch.Tensor | None = None
    length: int = 0


class AttentionRNNLayer(nn.Module):
    """One GRU layer, then additive attention of each state h_i over h_1..h_i of the same layer,
    combined as h̃_i = tanh(W_c [c_i; h_i]) (Luong et al. 2015, Eq. 5). x `(1, T, k)` -> `(1, T, k)`.

    Additive attention keeps tanh(W_a h_i + U_a h_j) for every pair j <= i for the backward pass:
    t²·k memory in training, the t² term of the lectures' table.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gru = nn.GRU(width, width, batch_first=True)
        self.attention = AdditiveAttention(width, width, width)
        self.combine = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(0) != 1:
            raise ValueError(f"AttentionRNNLayer runs one sequence at a time, got a batch of {x.size(0)}")
        h, _ = self.gru(x)  # (1, T, k)
        keys = self.attention.keys(h)  # (1, T, k)
        t = h.size(1)
        contexts = []
        # Query positions in chunks, each chunk a batch of one-query problems over the states up to
        # its last position: the saved tensors cover about t²/2 pairs, not t².
        for start in range(0, t, ATTENTION_CHUNK):
            end = min(start + ATTENTION_CHUNK, t)
            n = end - start
            visible = torch.arange(end, device=x.device)[None, :] <= torch.arange(start, end, device=x.device)[:, None]
            c, _ = self.attention(
                h[0, start:end], keys[:, :end].expand(n, -1, -1), h[:, :end].expand(n, -1, -1), visible
            )  # (n, k)
            contexts.append(c)
        c = torch.cat(contexts).unsqueeze(0)  # (1, T, k)
        return torch.tanh(self.combine(torch.cat([c, h], dim=-1)))

    def new_carry(self, batch_size: int, max_len: int, like: torch.Tensor) -> AttentionCarry:
        shape = (batch_size, max_len, self.combine.out_features)
        return AttentionCarry(
            states=like.new_zeros(shape),
            keys=like.new_zeros(shape),
            visible=torch.ones(batch_size, max_len, dtype=torch.bool, device=like.device),
        )

    def step(self, x: torch.Tensor, carry: AttentionCarry) -> torch.Tensor:
        """One position: x `(B, 1, k)` -> h̃ `(B, 1, k)`; stores h_i and U_a h_i in `carry`."""
        h, carry.hidden = self.gru(x, carry.hidden)  # (B, 1, k)
        i = carry.length
        if i >= carry.states.size(1):
            raise ValueError(f"generation state overflow: position {i} >= max_len {carry.states.size(1)}")
        carry.states[:, i] = h[:, 0]
        carry.keys[:, i] = self.attention.keys(h[:, 0])
        carry.length = i + 1
        end = i + 1
        c, _ = self.attention(h[:, 0], carry.keys[:, :end], carry.states[:, :end], carry.visible[:, :end])  # (B, k)
        return torch.tanh(self.combine(torch.cat([c, h[:, 0]], dim=-1))).unsqueeze(1)


class AttentionRNNLM(nn.Module):
    """Embedding, d `AttentionRNNLayer`s of width k, a linear head: `RNNLM` plus attention over all
    previous states. `forward(idx (1, T))` -> logits `(1, T, V)`; the decoding interface as `RNNLM`."""

    def __init__(self, config: RNNLMConfig) -> None:
        super().__init__()
        self.config = config
        k = config.n_embd
        self.embedding = nn.Embedding(config.vocab_size, k)
        self.layers = nn.ModuleList(AttentionRNNLayer(k) for _ in range(config.n_layer))
        self.head = nn.Linear(k, config.vocab_size)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> list[AttentionCarry]:
        max_len = self.config.block_size if max_len is None else max_len
        return [layer.new_carry(batch_size, max_len, self.head.weight) for layer in self.layers]

    def forward(
        self,
        idx: torch.Tensor,
        *,
        cache: list[AttentionCarry] | None = None,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """As `RNNLM.forward`; with `cache` the tokens of idx are fed one at a time."""
        x = self.embedding(idx)  # (B, T, k)
        if cache is None:
            for layer in self.layers:
                x = layer(x)
        else:
            steps = []
            for i in range(x.size(1)):
                y = x[:, i : i + 1]
                for layer, carry in zip(self.layers, cache, strict=True):
                    y = layer.step(y, carry)
                steps.append(y)
            x = torch.cat(steps, dim=1)
        if last_only:
            x = x[:, -1:]
        return self.head(x)


def build_model(name: str, settings: CostSettings, max_len: int) -> nn.Module:
    """One of ALL_MODELS with the width and depth of `settings`, for sequences up to `max_len` tokens."""
    if name in TRANSFORMERS:
        return GPT(
            GPTConfig(
                vocab_size=VOCAB,
                block_size=max_len,
                n_layer=settings.layers,
                n_head=settings.heads,
                n_embd=settings.width,
                positions="sinusoidal",  # no parameters that grow with t
                attention=TRANSFORMERS[name],
                attention_window=settings.attention_window,
                attention_block=settings.attention_block,
                global_blocks=settings.global_blocks,
                random_blocks=settings.random_blocks,
            )
        )
    config = RNNLMConfig(vocab_size=VOCAB, n_embd=settings.width, n_layer=settings.layers, block_size=max_len)
    if name == "rnn":
        return RNNLM(config)
    if name == "rnn-attention":
        return AttentionRNNLM(config)
    raise ValueError(f"model must be one of {ALL_MODELS}, got {name!r}")


# -- counting: sequential steps and path length ------------------------------------------------------
SUBLAYERS = {
    "rnn": ("recurrent",),
    "rnn-attention": ("recurrent", "attention"),
    "transformer": ("attention",),
    "transformer-window": ("window",),
    "transformer-bigbird": ("bigbird",),
}
"""What one layer of each model is, as dependencies between positions: "recurrent" (position i
needs the layer below at i and itself at i - 1), "attention" (position i needs the layer below
at every j <= i), "window" (at i - w < j <= i, w = `CostSettings.attention_window`) or "bigbird"
(at the keys its layer's `BigBirdAttention.key_mask` lets it see). Position-wise parts
(feed-forward, the attention combination, the head) add no dependency between positions and
count as part of their sublayer."""


def count_steps(model: str, t: int, layers: int, settings: CostSettings | None = None) -> tuple[int, int | None]:
    """(sequential steps, maximum path length) of one forward of `model` over t positions, counted
    on its dependency graph: node (sublayer s, position i) for every sublayer of `layers` layers.
    `settings` gives the attention patterns' sizes (default `CostSettings()`; its `layers` give
    way to `layers`).

    Sequential steps: the nodes on the longest dependency chain, the number of rounds one forward
    needs however many processors run it. Maximum path length: the fewest edges from an input
    position j to an output position i >= j, the longest over all such pairs; None when a pair is
    not connected at all (a window of w keys reaches d·(w - 1) positions back through d layers, no
    further). Example: `("rnn", t=8, layers=2)` -> (9, 9); `("transformer", 8, 2)` -> (2, 2);
    `("transformer-window", 8, 2)` with w = 3 -> (2, None), with w = 5 -> (2, 2).
    """
    settings = settings or CostSettings()
    if SUBLAYERS[model] == ("bigbird",):
        # Random blocks, different in every layer: no rule by distance, so the model's own masks.
        return count_on_key_masks(_key_masks(model, t, layers, settings))
    positions = np.arange(t)
    depth = np.zeros(t)  # longest chain ending at each position of the current sublayer
    # Every position has the same edges (but for those a window loses before position 0, which no
    # path from a later position needs), and edges never point back in time, so the fewest edges
    # from j to i depend on i - j alone: distances from position 0 cover every pair.
    distance = np.full(t, np.inf)
    distance[0] = 0.0
    for _ in range(layers):
        for sublayer in SUBLAYERS[model]:
            if sublayer == "recurrent":
                # x(i) = 1 + max(below(i), x(i - 1))  =>  i + 1 + max_{j <= i} (below(j) - j); same with min.
                depth = positions + 1 + np.maximum.accumulate(depth - positions)
                distance = positions + 1 + np.minimum.accumulate(distance - positions)
            elif sublayer in ("attention", "window"):
                width = t if sublayer == "attention" else settings.attention_window
                depth = 1 + _running(np.maximum, depth, width)
                distance = 1 + _running(np.minimum, distance, width)
            else:
                raise ValueError(f"unknown sublayer {sublayer!r}")
    longest = distance.max()
    return int(depth.max()), None if np.isinf(longest) else int(longest)


def _running(op: np.ufunc, x: np.ndarray, width: int) -> np.ndarray:
    """op (np.maximum or np.minimum) over the last `width` entries of x up to each index, itself
    included. Example: `(np.maximum, [3, 1, 2, 0], 2)` -> [3, 3, 2, 2]."""
    if width >= x.size:
        return op.accumulate(x)
    # Padded in front with copies of x[0], which every window that reaches them already holds.
    padded = np.pad(x, (width - 1, 0), mode="edge")
    return op.reduce(np.lib.stride_tricks.sliding_window_view(padded, width), axis=1)


def count_on_key_masks(masks: Sequence[torch.Tensor]) -> tuple[int, int | None]:
    """`count_steps` for a stack of attention sublayers given by their key masks, bool `(t, t)`
    each, True where query i sees key j of the sublayer below. Every edge joins a sublayer to the
    one below, so every path from an input to an output has one edge per sublayer: what is left to
    count is which pairs connect, from the product of the masks (O(t³) arithmetic: seconds at t = 4096).
    Example: two layers of `[[1, 0, 0], [1, 1, 0], [0, 1, 1]]` -> (2, 2); one -> (1, None)."""
    t = masks[0].size(0)
    depth = torch.zeros(t)
    for mask in masks:
        depth = 1 + torch.where(mask, depth, -math.inf).amax(dim=1)  # (t,): over the keys each query sees
    reach = masks[0].float()  # (outputs, inputs): connected
    for mask in masks[1:]:
        reach = (mask.float() @ reach > 0).float()
    pairs = torch.ones(t, t, dtype=torch.bool).tril()  # j <= i
    connected = bool(reach.bool()[pairs].all())
    return int(depth.max()), len(masks) if connected else None


def _key_masks(model: str, t: int, layers: int, settings: CostSettings) -> list[torch.Tensor]:
    """The key mask `(t, t)` of each layer of `model` over t positions, read from the model's own
    attention patterns (`AttentionPattern.key_mask`), so that the count follows what it computes."""
    gpt = build_model(model, dataclasses.replace(settings, layers=layers), max_len=t)
    positions = torch.arange(t)
    return [block.attn.pattern.key_mask(positions, t, causal=True) for block in gpt.blocks]


# -- theory -----------------------------------------------------------------------------------------
QUANTITIES = (
    "train_time",
    "train_memory",
    "generate_time",
    "generate_memory",
    "sequential_steps",
    "max_path_length",
)
COUNTED = ("sequential_steps", "max_path_length")
"""The quantities counted on the dependency graph (`count_steps`) rather than measured."""
QUANTITY_LABELS = {
    "train_time": "training step time",
    "train_memory": "training step memory",
    "generate_time": "generation time",
    "generate_memory": "generation memory",
    "sequential_steps": "sequential steps",
    "max_path_length": "max path length",
}


@dataclass(frozen=True)
class Theory:
    formula: str
    exponent: int | None
    """The exponent of t in the formula, for large t; None where no power of t fits (unbounded)."""
    source: str
    """"lectures" (their table) or "derived" (not in the table; derived here for these models)."""


THEORY: dict[tuple[str, str], Theory] = {
    ("rnn", "train_time"): Theory("t·k²·d", 1, "lectures"),
    ("rnn-attention", "train_time"): Theory("t²·k²·d", 2, "lectures"),
    ("transformer", "train_time"): Theory("t²·k·d", 2, "lectures"),
    ("rnn", "generate_memory"): Theory("k·d", 0, "lectures"),
    ("rnn-attention", "generate_memory"): Theory("t·k·d", 1, "lectures"),
    ("transformer", "generate_memory"): Theory("t·k·d", 1, "lectures"),
    ("rnn", "sequential_steps"): Theory("t", 1, "lectures"),
    ("rnn-attention", "sequential_steps"): Theory("t", 1, "lectures"),
    ("transformer", "sequential_steps"): Theory("d", 0, "lectures"),
    ("rnn", "max_path_length"): Theory("t", 1, "lectures"),
    ("rnn-attention", "max_path_length"): Theory("1", 0, "lectures"),
    ("transformer", "max_path_length"): Theory("1", 0, "lectures"),
    # Not in the lectures' table: t steps of the training work per token, attending over i states.
    ("rnn", "generate_time"): Theory("t·k²·d", 1, "derived"),
    ("rnn-attention", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    ("transformer", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    # Activations kept for backward: additive attention keeps a k-vector per pair (j, i); the
    # fused attention kernel keeps no (t, t) weights (log-sum-exp and output only).
    ("rnn", "train_memory"): Theory("t·k·d", 1, "derived"),
    ("rnn-attention", "train_memory"): Theory("t²·k·d", 2, "derived"),
    ("transformer", "train_memory"): Theory("t·k·d", 1, "derived"),
    # The attention patterns, none of them in the lectures' table. Training runs the pattern's
    # blocked computation: each query scores its w keys (window) or m blocks of b keys (BigBird:
    # m = 2 window blocks + global + random), and the scores and weights, h per pair, are kept for
    # backward beside the t·k·d activations of every model.
    ("transformer-window", "train_time"): Theory("t·w·k·d", 1, "derived"),
    ("transformer-bigbird", "train_time"): Theory("t·m·b·k·d", 1, "derived"),
    ("transformer-window", "train_memory"): Theory("t·(k+h·w)·d", 1, "derived"),
    ("transformer-bigbird", "train_memory"): Theory("t·(k+h·m·b)·d", 1, "derived"),
    # Generation in this implementation: the KV cache keeps every key, and a cached step applies
    # the pattern as a mask over all of it (MultiHeadAttention), so step i still scores i keys:
    # the cost of full attention. A cache trimmed to the window would give t·w·k·d and w·k·d.
    ("transformer-window", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    ("transformer-bigbird", "generate_time"): Theory("t·k²·d + t²·k·d", 2, "derived"),
    ("transformer-window", "generate_memory"): Theory("t·k·d", 1, "derived"),
    ("transformer-bigbird", "generate_memory"): Theory("t·k·d", 1, "derived"),
    # Every position of a sublayer at once, as with full attention (Vaswani et al. Table 1, O(1)).
    ("transformer-window", "sequential_steps"): Theory("d", 0, "derived"),
    ("transformer-bigbird", "sequential_steps"): Theory("d", 0, "derived"),
    # Vaswani et al.'s O(t/w) for restricted attention counts the layers needed to connect t
    # positions; with d layers fixed, a key more than d·(w - 1) positions back is not reached at
    # all. BigBird's 2-hop paths through global tokens hold in the bidirectional model only: a
    # causal global block sees nothing after itself, so paths run through window and random blocks,
    # and some pairs are cut off once t is a few times d·b (`count_steps` counts it on the masks).
    ("transformer-window", "max_path_length"): Theory("∞ past d(w−1)+1", None, "derived"),
    ("transformer-bigbird", "max_path_length"): Theory("∞ for t ≫ d·b", None, "derived"),
}


# -- fitting ----------------------------------------------------------------------------------------
def fit_exponent(lengths: Sequence[int], values: Sequence[float]) -> float | None:
    """The slope of log(value) against log(t) by least squares: value ≈ c·t^slope.
    Example: `([1, 2, 4], [3, 12, 48])` -> 2.0. None when a value is missing or not positive."""
    if len(lengths) != len(values):
        raise ValueError(f"{len(lengths)} lengths but {len(values)} values")
    if len(lengths) < 2:
        raise ValueError("a slope needs at least two points")
    if any(v is None or not v > 0 for v in values):
        return None
    x, y = np.log(np.asarray(lengths, dtype=float)), np.log(np.asarray(values, dtype=float))
    slope, _ = np.polyfit(x, y, 1)
    return float(slope)


# -- measuring one case (in a fresh process) --------------------------------------------------------
def _train_step(model: nn.Module, opt: torch.optim.Optimizer, idx: torch.Tensor) -> None:
    """One optimizer step of next-token prediction on idx `(1, T + 1)`."""
    logits = model(idx[:, :-1])  # (1, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure_case(model_name: str, kind: str, t: int, settings: CostSettings, threads: int) -> tuple[float, float]:
    """(seconds, peak MiB) of one case in this process: `kind` "train" (one step on t tokens) or
    "generate" (t new tokens after a one-token prompt). Run it in a process of its own
    (`measure_cost` does): the peak is a high-water mark of the whole process.

    The seconds are the fastest of the timed calls: on a shared machine other processes only ever
    add time, so the minimum is the estimate least disturbed by them (as `timeit` advises)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(model_name, settings, max_len=t + 1)
    if kind == "train":
        model.train()
        opt = adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, device=torch.device("cpu"))
        idx = torch.randint(0, VOCAB, (1, t + 1))
        _train_step(model, opt, idx[:, : min(t, WARMUP_TOKENS) + 1])  # creates the optimizer state

        def call() -> None:
            _train_step(model, opt, idx)

    else:
        prompt = torch.randint(0, VOCAB, (1, 1))
        pick = greedy_picker()

        def generate(n: int) -> None:
            # The tokens are streamed out, not collected: what is measured is the model's memory
            # (the lectures' test memory), not a list of t outputs.
            count = sum(1 for _ in generate_tokens(model, prompt, n, pick))
            if count != n:  # a generation that stopped early would look cheap
                raise RuntimeError(f"{model_name} generated {count} tokens, expected {n}")

        generate(min(t, WARMUP_TOKENS))

        def call() -> None:
            generate(t)

    gc.collect()
    reset_peak_rss()
    before = peak_rss_bytes()
    start = time.perf_counter()
    call()  # the memory call; not reported as a time (its first touches of fresh pages cost extra)
    first = time.perf_counter() - start
    peak = max(peak_rss_bytes() - before, PAGE)
    times = []
    for _ in range(settings.repeats if first * settings.repeats <= CASE_BUDGET_S else 1):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times), peak / 2**20


_SERVER = "from attnlab.cost import serve_cases; serve_cases()"


def serve_cases() -> None:
    """The measuring server: read one case per line on stdin (JSON: model, kind, length, settings,
    threads), measure it in a forked child, write one JSON line on stdout: {"seconds", "peak_mib"},
    {"error": traceback} when it raised, or {"died": reason} when it was killed (out of memory).

    This process imports torch and attnlab and runs nothing, so every child starts with the same
    small heap and no thread pool, in milliseconds instead of the seconds an import takes."""
    import os
    import signal
    import traceback

    import torch._dynamo  # noqa: F401  (the optimizer step imports it lazily: once here, not in every child)

    # Everything imported so far out of the garbage collector's sight: a child's gc.collect() then
    # neither spends time on it nor copies its pages.
    gc.freeze()
    for line in sys.stdin:
        case = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report, exit without running the parent's cleanup
            os.close(read_end)
            try:
                settings = CostSettings.from_json(case["settings"])
                seconds, peak = measure_case(case["model"], case["kind"], case["length"], settings, case["threads"])
                reply = {"seconds": seconds, "peak_mib": peak}
            except MemoryError:
                reply = {"died": "MemoryError"}
            except BaseException:
                reply = {"error": traceback.format_exc()}
            with os.fdopen(write_end, "w") as f:
                f.write(json.dumps(reply))
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            reason = signal.Signals(signum).name if signum else f"exit status {os.waitstatus_to_exitcode(status)}"
            text = json.dumps({"died": reason})
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class _Server:
    """The parent's end of `serve_cases`: a Python process of this very attnlab."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # glibc: a fixed mmap threshold (no dynamic raising), so every allocation of 64 KiB or
            # more is a mapping of its own, returned to the system when freed; the resident set
            # then follows the live tensors, not the fragmentation of a heap. Ignored elsewhere.
            env={**child_env(), "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
        )

    def measure(self, model: str, kind: str, t: int, settings: CostSettings, threads: int) -> dict:
        case = dict(model=model, kind=kind, length=t, settings=dataclasses.asdict(settings), threads=threads)
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the measuring server exited (status {self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"measuring {model} {kind} t={t} failed:\n{reply['error']}")
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# -- the whole run ----------------------------------------------------------------------------------
@dataclass
class Measurement:
    model: str
    kind: str
    """"train" or "generate"."""
    length: int
    seconds: float | None
    """The fastest timed call; None when the case did not run (skipped or out of memory)."""
    peak_mib: float | None
    """Peak resident memory above model, optimizer and warm-up, MiB (one page at least)."""


@dataclass
class Count:
    model: str
    length: int
    sequential_steps: int
    max_path_length: int | None
    """None: some pair of positions is not connected at all (an infinite path)."""


@dataclass
class TableRow:
    model: str
    quantity: str
    theory: str
    theory_exponent: int | None
    source: str
    fitted_exponent: float | None
    """None when fewer than two of the fit lengths have a value (cases skipped for memory), or, for
    a count, when a path is infinite at one of them."""
    fit_lengths: list[int]
    """The lengths this row's exponent was fitted on: those of `CostResult.fit_lengths` with a value
    (all of them for a count: an infinite path is a value that no power of t fits)."""


@dataclass
class CostResult:
    date: str
    device: str
    machine: str
    threads: int
    torch: str
    lengths: list[int]
    fit_lengths: list[int]
    width: int
    layers: int
    heads: int
    vocab: int
    batch: int
    repeats: int
    passes: int
    max_memory_mib: float
    timing_method: str
    memory_method: str
    measurements: list[Measurement]
    counts: list[Count]
    table: list[TableRow]
    models: list[str] = dataclasses.field(default_factory=lambda: list(MODELS))
    """The models measured, in the order of the tables: MODELS, then those of the attention
    patterns (`CostSettings.models`)."""
    # The patterns' sizes (`CostSettings`); they matter where `models` has the patterns' Transformers.
    attention_window: int = CostSettings.attention_window
    attention_block: int = CostSettings.attention_block
    global_blocks: int = CostSettings.global_blocks
    random_blocks: int = CostSettings.random_blocks

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def series(self, model: str, quantity: str) -> list[float | None]:
        """The values of `quantity` (one of QUANTITIES) for `model`, one per length."""
        if quantity in COUNTED:
            by_length = {c.length: getattr(c, quantity) for c in self.counts if c.model == model}
        else:
            kind, what = quantity.split("_")
            field = "seconds" if what == "time" else "peak_mib"
            by_length = {m.length: getattr(m, field) for m in self.measurements if m.model == model and m.kind == kind}
        return [by_length.get(t) for t in self.lengths]


MEMORY_METHOD = (
    "peak resident set (VmHWM) of a fresh forked process, reset after model, optimizer and warm-up, "
    "fixed mmap threshold 64 KiB; resolution one page (4 KiB)"
)
TIMING_METHOD = (
    f"fastest of `repeats` calls after an untimed one (a single call when `repeats` calls would take "
    f"over {CASE_BUDGET_S:g} s), the fastest of `passes` sweeps"
)


def _measure_or_skip(
    server: _Server,
    model: str,
    kind: str,
    t: int,
    settings: CostSettings,
    threads: int,
    failed: set[tuple[str, str]],
    last: dict[tuple[str, str], tuple[int, float]],
) -> dict:
    """The server's reply for one case, or {"died": why} without running it when a shorter length
    of the same model and kind did not fit, or when its peak, extrapolated quadratically from the
    last length measured, would exceed `settings.max_memory_mib`. Updates `failed` and `last`."""
    if (model, kind) in failed:
        return {"died": "a shorter length did not fit"}
    previous = last.get((model, kind))
    expected = previous[1] * (t / previous[0]) ** 2 if previous else 0.0
    if expected > settings.max_memory_mib:
        reply = {"died": f"skipped: about {expected:,.0f} MiB expected > max {settings.max_memory_mib:,.0f}"}
    else:
        reply = server.measure(model, kind, t, settings, threads)
    if "died" in reply:
        failed.add((model, kind))
    else:
        last[(model, kind)] = (t, reply["peak_mib"])
    return reply


def measure_cost(settings: CostSettings, *, threads: int = 1, progress: bool = False) -> CostResult:
    """Measure and count everything for `settings` on this CPU -> CostResult. Each case runs in a
    fresh process, one at a time, with `threads` torch threads. One by default: the question is how
    cost grows with t, not peak speed; batch-1 steps of width 64 gain little from a thread pool, and
    a pool stalls at every barrier when another process holds a core (10× slower on a busy 2-core
    machine), which would bend the slopes.
    A case that would exceed `settings.max_memory_mib` or that dies (out of memory) is recorded as
    None, and the longer lengths of that model and kind are skipped.
    `progress` shows a tqdm bar on a terminal, one line per case on stderr otherwise (a log file)."""
    from tqdm.auto import tqdm

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    cases = [(t, m, k) for t in settings.lengths for m in settings.models for k in KINDS]  # peers side by side
    show_bar = progress and sys.stderr.isatty()
    total = settings.passes * len(cases)
    bar = tqdm(total=total, disable=not show_bar, unit="case", dynamic_ncols=True, file=sys.stderr)
    failed: set[tuple[str, str]] = set()
    last: dict[tuple[str, str], tuple[int, float]] = {}  # (length, peak MiB) of the last measured case
    best: dict[tuple[str, str, int], Measurement] = {}
    server = _Server()
    try:
        for sweep in range(settings.passes):
            for t, model, kind in cases:
                bar.update()
                key = (model, kind, t)
                if sweep == 0:
                    reply = _measure_or_skip(server, model, kind, t, settings, threads, failed, last)
                elif best[key].seconds is None:
                    continue  # later passes repeat what the first could run
                else:
                    reply = server.measure(model, kind, t, settings, threads)
                m = Measurement(model, kind, t, reply.get("seconds"), reply.get("peak_mib"))
                if key in best and m.seconds is not None:
                    m = Measurement(
                        model, kind, t, min(best[key].seconds, m.seconds), min(best[key].peak_mib, m.peak_mib)
                    )
                best.setdefault(key, m)
                if m.seconds is not None:
                    best[key] = m
                if progress and not show_bar:
                    where = f"pass {sweep + 1}/{settings.passes}, " if settings.passes > 1 else ""
                    sys.stderr.write(f"cost: {where}{_case_line(m, reply.get('died'))}\n")
                    sys.stderr.flush()
    finally:
        bar.close()
        server.close()
    measurements = [best[(m, k, t)] for t, m, k in cases]
    counts = [
        Count(m, t, *count_steps(m, t, settings.layers, settings)) for m in settings.models for t in settings.lengths
    ]
    result = CostResult(
        date=date.today().isoformat(),
        device="cpu",
        machine=f"{platform.machine()} {platform.processor()}".strip(),
        threads=threads,
        torch=torch.__version__,
        lengths=list(settings.lengths),
        fit_lengths=list(settings.fit_lengths),
        width=settings.width,
        layers=settings.layers,
        heads=settings.heads,
        vocab=VOCAB,
        batch=1,
        repeats=settings.repeats,
        passes=settings.passes,
        max_memory_mib=settings.max_memory_mib,
        timing_method=TIMING_METHOD,
        memory_method=MEMORY_METHOD,
        measurements=measurements,
        counts=counts,
        table=[],
        models=list(settings.models),
        attention_window=settings.attention_window,
        attention_block=settings.attention_block,
        global_blocks=settings.global_blocks,
        random_blocks=settings.random_blocks,
    )
    result.table = fit_table(result)
    return result


def fit_table(result: CostResult) -> list[TableRow]:
    """One row per model and quantity: the theory beside the exponent fitted on those of
    `fit_lengths` that have a value (a case skipped for memory leaves its length out; a count that
    is an infinite path at one of them leaves no fit)."""
    rows = []
    for quantity in QUANTITIES:
        for model in result.models:
            series = zip(result.lengths, result.series(model, quantity), strict=True)
            # A missing reading leaves its length out; a missing count is an infinite path, which no
            # power of t fits (`fit_exponent` gives None).
            points = [(t, v) for t, v in series if t in result.fit_lengths and (v is not None or quantity in COUNTED)]
            lengths, values = [t for t, _ in points], [v for _, v in points]
            fitted = fit_exponent(lengths, values) if len(points) >= 2 else None
            theory = THEORY[(model, quantity)]
            rows.append(TableRow(model, quantity, theory.formula, theory.exponent, theory.source, fitted, lengths))
    return rows


# -- text -------------------------------------------------------------------------------------------
def _case_line(m: Measurement, died: str | None) -> str:
    what = f"{MODEL_LABELS[m.model]} {m.kind} t={m.length}"
    if m.seconds is None:
        return f"{what}: not measured ({died})"
    return f"{what}: {m.seconds:.4f} s, {m.peak_mib:,.2f} MiB"


def model_groups(models: Sequence[str]) -> list[tuple[str, ...]]:
    """The models in tables of at most three, as wide as a terminal: the lectures' three, then the
    attention patterns two at a time beside the full-attention Transformer they vary.
    Example: `MODELS + ("transformer-window",)` -> [MODELS, ("transformer", "transformer-window")]."""
    extra = [m for m in models if m not in MODELS]
    return [tuple(m for m in models if m in MODELS)] + [
        ("transformer", *extra[i : i + 2]) for i in range(0, len(extra), 2)
    ]


def _measurement_lines(result: CostResult, group: tuple[str, ...]) -> list[str]:
    """The readings of `group` per length: training, then generation, time and memory side by side."""
    units = {
        "train_time": "train s",
        "train_memory": "train MiB",
        "generate_time": "gen s",
        "generate_memory": "gen MiB",
    }
    lines = []
    for quantities in (("train_time", "train_memory"), ("generate_time", "generate_memory")):
        columns = [(m, q) for q in quantities for m in group]
        head = f"{'t':>6} " + " ".join(f"{SHORT_LABELS[m] + ' ' + units[q]:>18}" for m, q in columns)
        lines += [head, "-" * len(head)]
        series = {c: result.series(*c) for c in columns}
        for i, t in enumerate(result.lengths):
            cells = []
            for model, quantity in columns:
                spec = ".4f" if quantity.endswith("time") else ",.2f"
                cells.append(f"{optional_number(series[(model, quantity)][i], spec):>18}")
            lines.append(f"{t:>6} " + " ".join(cells))
        lines.append("")
    return lines


def _theory_lines(result: CostResult, group: tuple[str, ...], notes: list[str]) -> list[str]:
    """The cost table of `group`: per quantity, each model's theory beside its fitted exponent ("∞"
    for an infinite path). Appends to `notes` the rows fitted on fewer lengths than the others."""
    by_key = {(r.model, r.quantity): r for r in result.table}
    theory_width = max(17, *(len(by_key[(m, q)].theory) + 1 for m in group for q in QUANTITIES))
    cell = theory_width + 15
    lines = [
        f"{'':<22}" + "".join(f"{MODEL_LABELS[m]:>{cell}}" for m in group),
        f"{'quantity':<22}" + "".join(f"{'theory':>{theory_width}} {'exp.':>4} {'fit':>9}" for _ in group),
    ]
    lines.append("-" * len(lines[0]))
    for quantity in QUANTITIES:
        cells = []
        for model in group:
            r = by_key[(model, quantity)]
            star = "*" if r.source == "derived" else ""
            if r.fitted_exponent is None and quantity in COUNTED:
                fitted = "∞"  # counts are never missing: a None fit is a pair that no path connects
            else:
                fitted = optional_number(r.fitted_exponent, ".2f")
            if r.fitted_exponent is not None and r.fit_lengths != result.fit_lengths:
                fitted += "†"
                notes.append(
                    f"{MODEL_LABELS[model]} {QUANTITY_LABELS[quantity]} on t = {', '.join(map(str, r.fit_lengths))}"
                )
            exponent = optional_number(r.theory_exponent, "d")
            cells.append(f"{r.theory + star:>{theory_width}} {exponent:>4} {fitted:>9}")
        lines.append(f"{QUANTITY_LABELS[quantity]:<22}" + "".join(f"{c:>{cell}}" for c in cells))
    return lines


def _path_text(length: int | None) -> str:
    """A counted path length, "∞" where no path connects a pair."""
    return "∞" if length is None else str(length)


def format_table(result: CostResult) -> str:
    """The measurements per length, then the cost table: theory beside the fitted exponents. Models
    beyond the lectures' three (the attention patterns) get tables of their own after theirs."""
    lines = [
        f"attnlab cost on {result.device} ({result.machine}), {result.threads} thread"
        f"{'s' if result.threads != 1 else ''}, torch {result.torch}, {result.date}",
        f"width k={result.width}, layers d={result.layers}, heads {result.heads}, vocab {result.vocab}, "
        f"batch {result.batch}; time: {result.timing_method}",
        f"memory: {result.memory_method}",
    ]
    patterns = {
        "transformer-window": f"window w={result.attention_window}",
        "transformer-bigbird": f"BigBird blocks b={result.attention_block}, {result.global_blocks} global, "
        f"{result.random_blocks} random",
    }
    if len(result.models) > len(MODELS):
        lines.append("attention patterns: " + "; ".join(patterns[m] for m in result.models if m in patterns))
    lines.append("")
    groups = model_groups(result.models)
    for group in groups:
        lines += _measurement_lines(result, group)
    fit = result.fit_lengths
    lines.append(f"the cost table: theory beside the exponent of t fitted on t = {fit[0]}..{fit[-1]}")
    notes: list[str] = []
    for i, group in enumerate(groups):
        lines += ([""] if i else []) + _theory_lines(result, group, notes)
    lines.append("* not in the lectures' table: derived for these models (see attnlab.cost.THEORY)")
    if notes:
        lines.append("† fitted on the lengths that ran: " + "; ".join(notes))
    last = result.lengths[-1]
    counted = {c.model: c for c in result.counts if c.length == last}
    lines.append("")
    lines.append(
        f"counted at t={last}, d={result.layers}: sequential steps "
        + ", ".join(f"{MODEL_LABELS[m]} {counted[m].sequential_steps}" for m in result.models)
        + "; max path length "
        + ", ".join(f"{MODEL_LABELS[m]} {_path_text(counted[m].max_path_length)}" for m in result.models)
    )
    return "\n".join(lines)
