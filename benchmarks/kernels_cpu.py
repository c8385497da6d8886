"""attnlab's C++ training kernels against PyTorch's operators, one by one, on this CPU.

The pieces `train.fused_kernels` replaces, at the shapes of `attnlab bench`'s training cases: the
tanh-GELU forward and backward over a feed-forward layer's activations, and causal self-attention
straight from the fused q/k/v projection, forward and backward ("PyTorch" is
`F.scaled_dot_product_attention` on the heads split out of the same tensor, forward and backward
through autograd, against the kernel's forward plus its backward). Shows whether the kernels'
vector loops suit this CPU's registers (BENCHMARKS.md: on an AVX2 CPU they once ran 3-10x slower
than PyTorch). Both peers alternate within each repeat; medians.

    python benchmarks/kernels_cpu.py [--repeats 5] [--calls 20] [--out FILE.json]
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

from attnlab.accel import kernels

# (batch, block, width, heads) of the bench's two training cases
CASES = {"4x4x128": (12, 64, 128, 4), "6x6x384": (12, 256, 384, 6)}


def _ms(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e3 * (time.perf_counter() - start) / calls


def _peers(B: int, T: int, C: int, H: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (attnlab's kernel, PyTorch's operators) for one training case."""
    ext = kernels.extension()
    h = torch.randn(B * T, 4 * C)  # the feed-forward layer's pre-activations
    g = torch.randn_like(h)
    qkv = torch.randn(B, T, 3 * C)
    y, lse = ext.attention_forward(qkv, H, True)
    dy = torch.randn_like(y)
    leaf = qkv.clone().requires_grad_()

    def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, 3C) -> q, k, v stacked, (3, B, H, T, D)
        return t.view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)

    def torch_attention() -> None:
        F.scaled_dot_product_attention(*heads(leaf), is_causal=True).backward(dy.view(B, T, H, C // H).transpose(1, 2))

    def attnlab_attention() -> None:
        out, saved = ext.attention_forward(qkv, H, True)
        ext.attention_backward(dy, qkv, out, saved, H, True)

    return {
        "gelu tanh forward": (lambda: ext.gelu_forward(h, True), lambda: F.gelu(h, approximate="tanh")),
        "gelu tanh backward": (
            lambda: ext.gelu_backward(g, h, True),
            lambda: torch.ops.aten.gelu_backward(g, h, approximate="tanh"),
        ),
        "attention forward": (
            lambda: ext.attention_forward(qkv, H, True),
            lambda: F.scaled_dot_product_attention(*heads(qkv), is_causal=True),
        ),
        "attention forward + backward": (attnlab_attention, torch_attention),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=20, help="calls per timing")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    info = run_info()
    print(f"{info['cpu']}, {info['threads']} threads, medians of {args.repeats} x {args.calls} calls (ms per call)")
    rows = []
    for case, shape in CASES.items():
        for name, (ours, theirs) in _peers(*shape).items():
            ours(), theirs()  # warm-up
            times: dict[str, list[float]] = {"attnlab": [], "pytorch": []}
            for _ in range(args.repeats):
                times["attnlab"].append(_ms(ours, args.calls))
                times["pytorch"].append(_ms(theirs, args.calls))
            a, t = (statistics.median(times[k]) for k in ("attnlab", "pytorch"))
            rows.append({"case": case, "op": name, "attnlab_ms": a, "pytorch_ms": t, "speedup": t / a})
            print(f"  {case} {name:<30} attnlab {a:8.3f}  PyTorch {t:8.3f}  {t / a:5.2f}x")
    if args.out:
        args.out.write_text(
            json.dumps({**info, "repeats": args.repeats, "calls": args.calls, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
