"""Speed and memory on this machine: attnlab beside `transformers`, measured side by side in one run.

Four measurements in one run. The speeds are medians of `repeats`, and within every repeat the
peers alternate, so both see the same machine state (clock, other processes, caches):

1. The matmul peak: an fp32 2048³ GEMM on CPU, a bf16 8192³ GEMM on GPU (best of a few, before
   and again after the training cases, the better kept).
2. Training tokens/s of full optimizer steps (forward, backward, clip_grad_norm 1.0, AdamW),
   attnlab `GPT` versus `transformers.GPT2LMHeadModel` of the same shape, and the MFU of both.
3. Greedy generation: new tokens/s, 200 new tokens after an 8-token prompt, each with its KV cache.
4. Peak memory of one causal attention forward + backward: the explicit path, which materialises
   the (T, T) weights, versus the fused kernel, at three sequence lengths.

MFU (model FLOPs utilisation): model FLOPs per token, 6N + 12·L·T·C (Kaplan et al. 2020, §2.1;
PaLM appendix B; the nanoGPT `estimate_mfu`), times tokens/s, divided by the peak of (1).

The package, one module per job: `cases` (what is measured), `peaks` (the machine's matmul peak
and bandwidth, a model's FLOPs per token), `compare` (attnlab beside `transformers`), `memory`
(attention's peak memory in fresh processes), `run` (the whole run), `results`, `report` (the table).

Legend: B batch, T time (block), H heads, D head dim, C model width, L layers, N parameters.

    from attnlab.studies.bench import run_benchmarks, format_table
    print(format_table(run_benchmarks(torch.device("cpu"), quick=True)))
"""

from attnlab.studies.bench.cases import (
    ATTENTION_HEAD_DIM,
    ATTENTION_HEADS,
    ATTENTION_PATHS,
    GENERATE_BLOCK,
    PEER,
    PROMPT_LEN,
    SHAPES,
    VOCAB,
    GenerateCase,
    TrainCase,
    attention_lengths,
    generate_cases,
    train_cases,
)
from attnlab.studies.bench.compare import (
    build_models,
    compare,
)
from attnlab.studies.bench.memory import (
    attention_memory,
    attention_memory_case,
    child_env,
    cpu_attention_memory,
    cuda_attention_memory,
    peak_rss_bytes,
    reset_peak_rss,
)
from attnlab.studies.bench.peaks import (
    decode_weight_bytes,
    flops_per_token,
    matmul_peak_flops,
    memory_bandwidth,
)
from attnlab.studies.bench.report import format_table, optional_number
from attnlab.studies.bench.results import BenchResult, GenerateRow, MemoryRow, TrainRow
from attnlab.studies.bench.run import run_benchmarks

__all__ = [
    "ATTENTION_HEAD_DIM",
    "ATTENTION_HEADS",
    "ATTENTION_PATHS",
    "BenchResult",
    "GENERATE_BLOCK",
    "GenerateCase",
    "GenerateRow",
    "MemoryRow",
    "PEER",
    "PROMPT_LEN",
    "SHAPES",
    "TrainCase",
    "TrainRow",
    "VOCAB",
    "attention_lengths",
    "attention_memory",
    "attention_memory_case",
    "build_models",
    "child_env",
    "compare",
    "cpu_attention_memory",
    "cuda_attention_memory",
    "decode_weight_bytes",
    "flops_per_token",
    "format_table",
    "generate_cases",
    "matmul_peak_flops",
    "memory_bandwidth",
    "optional_number",
    "peak_rss_bytes",
    "reset_peak_rss",
    "run_benchmarks",
    "train_cases",
]
