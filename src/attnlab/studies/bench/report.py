"""A benchmark run as a fixed-width table, and the numbers' text."""

import torch

from attnlab.studies.bench.cases import ATTENTION_HEAD_DIM, ATTENTION_HEADS, PEER
from attnlab.studies.bench.results import BenchResult


def flops_text(flops: float, device: torch.device) -> str:
    return f"{flops / 1e12:,.1f} TFLOP/s" if device.type == "cuda" else f"{flops / 1e9:,.1f} GFLOP/s"


def progress_line(label: str, speed: dict[str, float], unit: str) -> str:
    line = f"{label}: attnlab {speed['attnlab']:,.0f} {unit}"
    if PEER in speed:
        line += f", transformers {speed[PEER]:,.0f} {unit}, ratio {speed['attnlab'] / speed[PEER]:.2f}x"
    return line


def optional_number(value: float | None, spec: str, suffix: str = "") -> str:
    """`value` formatted with `spec` (and `suffix`), or "-" for a missing value."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(result: BenchResult) -> str:
    """A fixed-width table: a header line, then one line per case."""
    device = torch.device(result.device)
    lines = [
        f"attnlab bench on {result.device} ({result.machine}), {result.threads} CPU thread"
        f"{'s' if result.threads != 1 else ''}, torch {result.torch}, "
        f"{result.date}; {result.matmul_dtype} matmul peak {flops_text(result.matmul_peak_flops, device)}, "
        f"memory bandwidth {result.memory_bandwidth / 1e9:,.1f} GB/s",
        f"medians of {result.repeats} repeats, peers alternating"
        + ("; attnlab through torch.compile" if result.compiled else "")
        + ("; attnlab training with its C++ kernels, decoding with the fused step" if result.fused else "")
        + (f" ({result.weights} weights)" if result.weights != "fp32" else "")
        + ("; --quick: a check that everything runs, not a measurement" if result.quick else ""),
    ]
    if result.transformers is None:
        lines.append("transformers not installed: the peer columns are empty (pip install transformers)")
    header = f"{'case':<40} {'attnlab':>12} {'transformers':>12} {'ratio':>7} {'MFU attnlab':>12} {'MFU transf.':>12}"
    lines += ["", header, "-" * len(header)]
    for r in result.train:
        lines.append(
            f"{r.case + ' (tokens/s)':<40} {r.attnlab_tokens_per_sec:>12,.0f} "
            f"{optional_number(r.transformers_tokens_per_sec, ',.0f'):>12} {optional_number(r.ratio, '.2f', 'x'):>7} "
            f"{r.attnlab_mfu:>12.2%} {optional_number(r.transformers_mfu, '.2%'):>12}"
        )
    # Decoding reads every weight once per step: its roofline is memory bandwidth, not FLOPs.
    header = f"{'generation (greedy)':<40} {'attnlab':>12} {'transformers':>12} {'ratio':>7}"
    header += f" {'of bandwidth':>12} {'bound':>12}"
    lines += ["", header, "-" * len(header)]
    for r in result.generate:
        label = f"{r.case}, {r.new_tokens} new (tok/s)"
        lines.append(
            f"{label:<40} {r.attnlab_tokens_per_sec:>12,.0f} "
            f"{optional_number(r.transformers_tokens_per_sec, ',.0f'):>12} {optional_number(r.ratio, '.2f', 'x'):>7} "
            f"{r.attnlab_of_bound:>12.1%} {r.bound_tokens_per_sec:>12,.0f}"
        )
    dtype = result.attention_memory[0].dtype if result.attention_memory else ""
    title = f"attention fwd+bwd peak, causal, {dtype}"
    header = f"{title:<40} {'explicit MiB':>12} {'growth':>7} {'fused MiB':>12} {'growth':>7}"
    lines += ["", header, "-" * len(header)]
    by_case = {(r.path, r.seq_len): r for r in result.attention_memory}
    for seq_len in sorted({r.seq_len for r in result.attention_memory}):
        explicit, fused = by_case.get(("explicit", seq_len)), by_case.get(("fused", seq_len))
        label = f"B=1 H={ATTENTION_HEADS} D={ATTENTION_HEAD_DIM} T={seq_len}"
        lines.append(
            f"{label:<40} {optional_number(explicit and explicit.peak_mib, ',.1f'):>12} "
            f"{optional_number(explicit and explicit.growth_per_doubling, '.1f', 'x'):>7} "
            f"{optional_number(fused and fused.peak_mib, ',.1f'):>12} "
            f"{optional_number(fused and fused.growth_per_doubling, '.1f', 'x'):>7}"
        )
    return "\n".join(lines)
