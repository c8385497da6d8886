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

The package, one module per job: `settings` (what a run measures), `models` (the RNN language
models), `counting` (sequential steps and path length), `theory` (the table's formulas and the
fitted exponents), `measure` (one case in a fresh process), `study` (the whole run and its
results), `report` (the tables as text).

References:
- Vaswani et al. 2017, "Attention Is All You Need", Table 1 (complexity per layer, sequential
  operations, maximum path length), which the lectures' table extends to the RNN with attention.
- Bahdanau, Cho & Bengio 2015, Appendix A.1.2 (additive attention); Luong, Pham & Manning 2015, §3.
- Beltagy, Peters & Cohan 2020, "Longformer", §3.1 (sliding window); Zaheer et al. 2020, "Big Bird",
  §2 and App. D (window + global + random blocks).
"""

from attnlab.studies.cost.counting import SUBLAYERS, count_on_key_masks, count_steps
from attnlab.studies.cost.measure import _Server, measure_case, serve_cases
from attnlab.studies.cost.models import (
    RNNLM,
    AttentionCarry,
    AttentionRNNLayer,
    AttentionRNNLM,
    RNNCarry,
    RNNLMConfig,
    build_model,
)
from attnlab.studies.cost.report import format_table, model_groups
from attnlab.studies.cost.settings import (
    ALL_MODELS,
    ATTENTION_CHUNK,
    ATTENTION_MODELS,
    CASE_BUDGET_S,
    DEFAULT_LENGTHS,
    KINDS,
    MODEL_LABELS,
    MODELS,
    PAGE,
    QUICK_LENGTHS,
    SHORT_LABELS,
    TRANSFORMERS,
    VOCAB,
    WARMUP_TOKENS,
    CostSettings,
)
from attnlab.studies.cost.study import (
    MEMORY_METHOD,
    TIMING_METHOD,
    CostResult,
    Count,
    Measurement,
    TableRow,
    fit_table,
    measure_cost,
)
from attnlab.studies.cost.theory import COUNTED, QUANTITIES, QUANTITY_LABELS, THEORY, Theory, fit_exponent

__all__ = [
    "ALL_MODELS",
    "ATTENTION_CHUNK",
    "ATTENTION_MODELS",
    "AttentionCarry",
    "AttentionRNNLM",
    "AttentionRNNLayer",
    "CASE_BUDGET_S",
    "COUNTED",
    "CostResult",
    "CostSettings",
    "Count",
    "DEFAULT_LENGTHS",
    "KINDS",
    "MEMORY_METHOD",
    "MODELS",
    "MODEL_LABELS",
    "Measurement",
    "PAGE",
    "QUANTITIES",
    "QUANTITY_LABELS",
    "QUICK_LENGTHS",
    "RNNCarry",
    "RNNLM",
    "RNNLMConfig",
    "SHORT_LABELS",
    "SUBLAYERS",
    "THEORY",
    "TIMING_METHOD",
    "TRANSFORMERS",
    "TableRow",
    "Theory",
    "VOCAB",
    "WARMUP_TOKENS",
    "_Server",
    "build_model",
    "count_on_key_masks",
    "count_steps",
    "fit_exponent",
    "fit_table",
    "format_table",
    "measure_case",
    "measure_cost",
    "model_groups",
    "serve_cases",
]
