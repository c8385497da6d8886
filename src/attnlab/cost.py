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
MODEL_LABELS = {"rnn": "RNN", "rnn-attention": "RNN+attention", "transformer": "Transformer"}
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

    def __post_init__(self) -> None:
        if len(self.lengths) < 2:
            raise ValueError(f"lengths: give at least two lengths to fit a slope, got {list(self.lengths)}")
        if any(t < 2 for t in self.lengths):
            raise ValueError(f"lengths must all be >= 2, got {list(self.lengths)}")
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:], strict=False)):
            raise ValueError(f"lengths must be strictly increasing, got {list(self.lengths)}")
        if not self.max_memory_mib > 0:
            raise ValueError(f"max_memory_mib must be > 0, got {self.max_memory_mib}")
        for name in ("width", "layers", "heads", "repeats", "passes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
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
    """One of MODELS with the width and depth of `settings`, for sequences up to `max_len` tokens."""
    if name == "transformer":
        return GPT(
            GPTConfig(
                vocab_size=VOCAB,
                block_size=max_len,
                n_layer=settings.layers,
                n_head=settings.heads,
                n_embd=settings.width,
                positions="sinusoidal",  # no parameters that grow with t
            )
        )
    config = RNNLMConfig(vocab_size=VOCAB, n_embd=settings.width, n_layer=settings.layers, block_size=max_len)
    if name == "rnn":
        return RNNLM(config)
    if name == "rnn-attention":
        return AttentionRNNLM(config)
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")


# -- counting: sequential steps and path length ------------------------------------------------------
SUBLAYERS = {"rnn": ("recurrent",), "rnn-attention": ("recurrent", "attention"), "transformer": ("attention",)}
"""What one layer of each model is, as dependencies between positions: "recurrent" (position i
needs the layer below at i and itself at i - 1) or "attention" (position i needs the layer below
at every j <= i). Position-wise parts (feed-forward, the attention combination, the head) add no
dependency between positions and count as part of their sublayer."""


def count_steps(model: str, t: int, layers: int) -> tuple[int, int]:
    """(sequential steps, maximum path length) of one forward of `model` over t positions, counted
    on its dependency graph: node (sublayer s, position i) for every sublayer of `layers` layers.

    Sequential steps: the nodes on the longest dependency chain, the number of rounds one forward
    needs however many processors run it. Maximum path length: the fewest edges from an input
    position j to an output position i >= j, the longest over all such pairs. Example: `("rnn",
    t=8, layers=2)` -> (9, 9); `("transformer", 8, 2)` -> (2, 2).
    """
    positions = np.arange(t)
    depth = np.zeros(t)  # longest chain ending at each position of the current sublayer
    # Every position has the same edges and edges never point back in time, so the fewest edges
    # from j to i depend on i - j alone: distances from position 0 cover every pair.
    distance = np.full(t, np.inf)
    distance[0] = 0.0
    for _ in range(layers):
        for sublayer in SUBLAYERS[model]:
            if sublayer == "recurrent":
                # x(i) = 1 + max(below(i), x(i - 1))  =>  i + 1 + max_{j <= i} (below(j) - j); same with min.
                depth = positions + 1 + np.maximum.accumulate(depth - positions)
                distance = positions + 1 + np.minimum.accumulate(distance - positions)
            elif sublayer == "attention":
                depth = 1 + np.maximum.accumulate(depth)
                distance = 1 + np.minimum.accumulate(distance)
            else:
                raise ValueError(f"unknown sublayer {sublayer!r}")
    return int(depth.max()), int(distance.max())


# -- theory -----------------------------------------------------------------------------------------
QUANTITIES = (
    "train_time",
    "train_memory",
    "generate_time",
    "generate_memory",
    "sequential_steps",
    "max_path_length",
)
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
    exponent: int
    """The exponent of t in the formula, for large t."""
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
                settings = CostSettings(**{**case["settings"], "lengths": tuple(case["settings"]["lengths"])})
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
    max_path_length: int


@dataclass
class TableRow:
    model: str
    quantity: str
    theory: str
    theory_exponent: int
    source: str
    fitted_exponent: float | None
    """None when fewer than two of the fit lengths have a value (cases skipped for memory)."""
    fit_lengths: list[int]
    """The lengths this row's exponent was fitted on: those of `CostResult.fit_lengths` with a value."""


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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def series(self, model: str, quantity: str) -> list[float | None]:
        """The values of `quantity` (one of QUANTITIES) for `model`, one per length."""
        if quantity in ("sequential_steps", "max_path_length"):
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
    cases = [(t, m, k) for t in settings.lengths for m in MODELS for k in KINDS]  # peers side by side
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
    counts = [Count(m, t, *count_steps(m, t, settings.layers)) for m in MODELS for t in settings.lengths]
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
    )
    result.table = fit_table(result)
    return result


def fit_table(result: CostResult) -> list[TableRow]:
    """One row per model and quantity: the theory beside the exponent fitted on those of
    `fit_lengths` that have a value (a case skipped for memory leaves its length out)."""
    rows = []
    for quantity in QUANTITIES:
        for model in MODELS:
            points = [
                (t, v) for t, v in zip(result.lengths, result.series(model, quantity), strict=True) if v is not None
            ]
            points = [(t, v) for t, v in points if t in result.fit_lengths]
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


def format_table(result: CostResult) -> str:
    """The measurements per length, then the cost table: theory beside the fitted exponents."""
    lines = [
        f"attnlab cost on {result.device} ({result.machine}), {result.threads} thread"
        f"{'s' if result.threads != 1 else ''}, torch {result.torch}, {result.date}",
        f"width k={result.width}, layers d={result.layers}, heads {result.heads}, vocab {result.vocab}, "
        f"batch {result.batch}; time: {result.timing_method}",
        f"memory: {result.memory_method}",
        "",
    ]
    columns = [(m, q) for q in ("train_time", "train_memory", "generate_time", "generate_memory") for m in MODELS]
    short = {"rnn": "RNN", "rnn-attention": "RNN+att", "transformer": "Transf."}
    units = {
        "train_time": "train s",
        "train_memory": "train MiB",
        "generate_time": "gen s",
        "generate_memory": "gen MiB",
    }
    header = f"{'t':>6} " + " ".join(f"{short[m] + ' ' + units[q]:>18}" for m, q in columns[:6])
    header2 = f"{'t':>6} " + " ".join(f"{short[m] + ' ' + units[q]:>18}" for m, q in columns[6:])
    for head, cols in ((header, columns[:6]), (header2, columns[6:])):
        lines += [head, "-" * len(head)]
        series = {c: result.series(*c) for c in cols}
        for i, t in enumerate(result.lengths):
            cells = []
            for model, quantity in cols:
                spec = ".4f" if quantity.endswith("time") else ",.2f"
                cells.append(f"{optional_number(series[(model, quantity)][i], spec):>18}")
            lines.append(f"{t:>6} " + " ".join(cells))
        lines.append("")
    fit = result.fit_lengths
    lines.append(f"the cost table: theory beside the exponent of t fitted on t = {fit[0]}..{fit[-1]}")
    header = f"{'':<22}" + "".join(f"{MODEL_LABELS[m]:>32}" for m in MODELS)
    lines += [header, f"{'quantity':<22}" + "".join(f"{'theory':>17} {'exp.':>4} {'fit':>9}" for _ in MODELS)]
    lines.append("-" * len(header))
    by_key = {(r.model, r.quantity): r for r in result.table}
    notes = []
    for quantity in QUANTITIES:
        cells = []
        for model in MODELS:
            r = by_key[(model, quantity)]
            star = "*" if r.source == "derived" else ""
            fitted = optional_number(r.fitted_exponent, ".2f")
            if r.fitted_exponent is not None and r.fit_lengths != fit:
                fitted += "†"
                notes.append(
                    f"{MODEL_LABELS[model]} {QUANTITY_LABELS[quantity]} on t = {', '.join(map(str, r.fit_lengths))}"
                )
            cells.append(f"{r.theory + star:>17} {r.theory_exponent:>4} {fitted:>9}")
        lines.append(f"{QUANTITY_LABELS[quantity]:<22}" + "".join(f"{c:>32}" for c in cells))
    lines.append("* not in the lectures' table: derived for these models (see attnlab.cost.THEORY)")
    if notes:
        lines.append("† fitted on the lengths that ran: " + "; ".join(notes))
    last = result.lengths[-1]
    counted = {c.model: c for c in result.counts if c.length == last}
    lines.append("")
    lines.append(
        f"counted at t={last}, d={result.layers}: sequential steps "
        + ", ".join(f"{MODEL_LABELS[m]} {counted[m].sequential_steps}" for m in MODELS)
        + "; max path length "
        + ", ".join(f"{MODEL_LABELS[m]} {counted[m].max_path_length}" for m in MODELS)
    )
    return "\n".join(lines)
