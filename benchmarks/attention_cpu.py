"""PyTorch's fused attention kernel against the formula's three products, on this CPU.

Why bf16 training takes the formula at <= 128 keys (attnlab.accel.rules.FORMULA_MAX_KEYS):
forward and backward, and forward alone, of softmax(q kᵀ / √D) v at the same number of tokens
(B·T = 4096, 4 heads of 64, as the wikitext2-mlm encoder's blocks) for T from 64 to 1024, bf16 and
fp32, bidirectional and causal. "fused" is `F.scaled_dot_product_attention` (the flash kernel on
the CPU); "formula" is `attnlab.nn.attention.scaled_dot_product_attention` (q kᵀ, softmax, times v,
the weights written out). Both peers alternate within each repeat; medians.

    python benchmarks/attention_cpu.py [--repeats 5] [--steps 5] [--out FILE.json]
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from run_info import run_info

from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.masks import causal_mask

TOKENS, HEADS, HEAD_DIM = 4096, 4, 64


def _timed(fn: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps


def compare(dtype: torch.dtype, t: int, causal: bool, backward: bool, repeats: int, steps: int) -> dict[str, float]:
    """Median seconds a call of each peer, at T = t over TOKENS tokens."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(TOKENS // t, HEADS, t, HEAD_DIM, generator=gen, dtype=dtype) for _ in range(3))
    q, k, v = (x.requires_grad_(backward) for x in (q, k, v))
    grad = torch.randn(TOKENS // t, HEADS, t, HEAD_DIM, generator=gen, dtype=dtype)
    mask = causal_mask(t, t) if causal else None

    def fused() -> None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if backward:
            y.backward(grad)

    def formula() -> None:
        y, _ = scaled_dot_product_attention(q, k, v, mask)
        if backward:
            y.backward(grad)

    peers = {"fused": fused, "formula": formula}
    times: dict[str, list[float]] = {name: [] for name in peers}
    with torch.set_grad_enabled(backward):
        for fn in peers.values():
            fn()  # warm-up
        for _ in range(repeats):
            for name, fn in peers.items():
                times[name].append(_timed(fn, steps))
    return {name: statistics.median(s) for name, s in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="calls per timing")
    p.add_argument("--lengths", default="64,128,256,512,1024")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()

    rows = []
    print(f"attention, {TOKENS} tokens, {HEADS} heads of {HEAD_DIM}, {torch.get_num_threads()} threads, ms per call")
    print(f"{'dtype':<9}{'T':>6} {'mask':<7}{'pass':<10}{'fused':>8}{'formula':>9}{'fused/formula':>15}")
    for dtype in (torch.bfloat16, torch.float32):
        for t in map(int, args.lengths.split(",")):
            for causal in (False, True):
                for backward in (True, False):
                    s = compare(dtype, t, causal, backward, args.repeats, args.steps)
                    row = {
                        "dtype": str(dtype).removeprefix("torch."),
                        "T": t,
                        "batch": TOKENS // t,
                        "causal": causal,
                        "pass": "fwd+bwd" if backward else "fwd",
                        "fused_ms": 1e3 * s["fused"],
                        "formula_ms": 1e3 * s["formula"],
                        "fused_over_formula": s["fused"] / s["formula"],
                    }
                    rows.append(row)
                    print(
                        f"{row['dtype']:<9}{t:>6} {'causal' if causal else 'none':<7}{row['pass']:<10}"
                        f"{row['fused_ms']:8.2f}{row['formula_ms']:9.2f}{row['fused_over_formula']:14.2f}x"
                    )
    if args.out:
        meta = {
            **run_info(),
            "repeats": args.repeats,
            "steps": args.steps,
        }
        args.out.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
