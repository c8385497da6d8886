"""Time to first token with automatic prefix caching (`attnlab.decode.prefix_cache`): a request whose
prompt shares a long prefix (`--prefix`, 1,000 tokens) with an earlier one, against the same
request prefilled cold.

The model is the Llama 125M shape with random weights (12 layers, width 768, 12 query and 4
key/value heads, SwiGLU feed-forward 2048, vocabulary 32,000, RMSNorm, rope; the shape of
benchmarks/decode_llama.py), decoded by continuous batching's `Batcher` as `attnlab serve` decodes
(the fused C++ step where it is built, unless `--no-fused`). Time to first token: `Batcher.join`
of the request (its prefill and its first token's pick), the median of `--repeats` requests, each
with a suffix of its own (`--suffix` tokens) after the shared prefix. Warm: a batcher with a prefix
cache (`--cache-memory` bytes) that has just decoded another request with that prefix. Cold: a batcher
without one. The first tokens are checked to be equal (greedy).

    OMP_NUM_THREADS=1 python benchmarks/prefix_cache.py [--prefix 1000] [--suffix 24] [--repeats 3]
        [--no-fused] [--json F]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from attnlab.accel.fused import by_default
from attnlab.decode.batching import Batcher
from attnlab.models import GPT, GPTConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_info import run_info  # noqa: E402


def llama_125m() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=32_000,
        block_size=2048,
        n_layers=12,
        n_heads=12,
        n_kv_heads=4,
        d_model=768,
        ffn_hidden=2048,
        bias=False,
        positions="rope",
        normalization="rmsnorm",
        activation="swiglu",
        norm="pre",
        tie_weights=False,
    )
    return GPT(config).eval()


def first_token(batcher: Batcher, prompt: list[int]) -> tuple[float, int, int]:
    """(seconds to join, the first token, tokens found cached), the sequence then taken out."""
    start = time.perf_counter()
    seq = batcher.join(prompt, 2)
    seconds = time.perf_counter() - start
    batcher.leave(seq)
    return seconds, seq.tokens[0], seq.cached_tokens


def measure(args: argparse.Namespace) -> dict:
    model = llama_125m()
    fused = by_default(model) and not args.no_fused
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 32_000, (args.prefix,), generator=g).tolist()
    suffixes = [torch.randint(0, 32_000, (args.suffix,), generator=g).tolist() for _ in range(args.repeats + 1)]
    cold = Batcher(model, 2, fused=fused)
    cold_times, warm_times, cached = [], [], []
    for suffix, other in zip(suffixes[1:], suffixes[:-1], strict=True):
        seconds, want, _ = first_token(cold, prefix + suffix)
        cold_times.append(seconds)
        warm = Batcher(model, 2, fused=fused, prefix_memory=args.cache_memory)
        first_token(warm, prefix + other)  # an earlier request with the same prefix
        seconds, got, n = first_token(warm, prefix + suffix)
        if got != want:
            raise SystemExit(f"the warm request's first token {got} is not the cold one's {want}")
        warm_times.append(seconds)
        cached.append(n)
    cold_s, warm_s = statistics.median(cold_times), statistics.median(warm_times)
    return {
        "fused": fused,
        "threads": torch.get_num_threads(),
        "prefix_tokens": args.prefix,
        "suffix_tokens": args.suffix,
        "cached_tokens": cached,
        "cold_ttft_s": cold_s,
        "warm_ttft_s": warm_s,
        "speedup": cold_s / warm_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefix", type=int, default=1000, help="tokens the two requests share (1000)")
    p.add_argument("--suffix", type=int, default=24, help="tokens of each request's own after it (24)")
    p.add_argument("--repeats", type=int, default=3, help="requests timed each way; the median (3)")
    p.add_argument("--cache-memory", type=int, default=1 << 30, help="the prefix cache's bound in bytes (1 GiB)")
    p.add_argument("--no-fused", action="store_true", help="PyTorch's path, not the fused C++ step")
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args()
    result = measure(args) | {"run": run_info()}
    print(
        f"prefix {args.prefix} + suffix {args.suffix} tokens, {'fused' if result['fused'] else 'PyTorch'} step, "
        f"{result['threads']} thread(s): time to first token cold {result['cold_ttft_s'] * 1000:.0f} ms, "
        f"with the prefix cached {result['warm_ttft_s'] * 1000:.1f} ms ({result['speedup']:.1f}x); "
        f"cached tokens {result['cached_tokens']}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
