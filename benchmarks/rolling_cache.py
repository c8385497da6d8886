"""Rolling caches (issue 48, item 3): time and memory per generated token, flat in the length.

A GPT of the small preset's shape (`shakespeare-char-cpu`: 4 layers x 4 heads x 128, block_size
64, a 65-character vocabulary) with rotary positions, random weights, batch 1, one thread, greedy
decoding of `--tokens` tokens after a one-token prompt through `attnlab.decode.generate_tokens`.
Every `--every` tokens it records the time per token of the last segment, the KV cache's bytes and
the process's resident memory. Three models:

- `window`: window attention (w = `--window`), its cache a ring of w keys a layer
  (`RollingKVCache`), decoding past block_size with no recomputation;
- `full`: full attention with block_size = `--tokens`, its cache every key (preallocated);
- `recompute`: the window model as decoding ran it before the ring (each token past block_size
  a forward over the last block_size tokens), for `--recompute-tokens` tokens only.

    python benchmarks/rolling_cache.py [--tokens 16384] [--every 1024] [--window 32] [--json F]

Prints a Markdown table and the JSON of every segment.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from attnlab.decode import generate_tokens, greedy_picker
from attnlab.models import GPT, GPTConfig

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402

SHAPE = dict(vocab_size=65, n_layers=4, n_heads=4, d_model=128, bias=False, positions="rope")


def rss_mib() -> float:
    """The process's resident memory now, MiB (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cache_mib(model: GPT) -> float:
    """The bytes a batch-1 decoding cache of this model holds, MiB."""
    return sum(t.numel() * t.element_size() for c in model.new_cache(1) for t in (c.k, c.v)) / 2**20


def segments(model: GPT, tokens: int, every: int) -> list[dict]:
    """Greedy decoding of `tokens` tokens, timed every `every`."""
    rows, start = [], time.perf_counter()
    stream = generate_tokens(model, torch.zeros(1, 1, dtype=torch.long), tokens, greedy_picker())
    for n, _ in enumerate(stream, start=1):
        if n % every == 0:
            ms = 1e3 * (time.perf_counter() - start) / every
            rows.append({"tokens": n, "ms_per_token": round(ms, 4), "rss_mib": round(rss_mib(), 1)})
            start = time.perf_counter()
    return rows


def recompute(model: GPT, tokens: int) -> float:
    """ms per token of the sliding window that decoding ran before the ring: a forward over the
    last block_size tokens for each token past it."""
    block = model.config.block_size
    seq = torch.zeros(1, block, dtype=torch.long)
    with torch.inference_mode():
        start = time.perf_counter()
        for _ in range(tokens):
            nxt = model(seq[:, -block:], last_only=True)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    return 1e3 * (time.perf_counter() - start) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--every", type=int, default=1024)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--recompute-tokens", type=int, default=512)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    window = GPT(GPTConfig(**SHAPE, block_size=64, attention="window", attention_window=args.window)).eval()
    full = GPT(GPTConfig(**SHAPE, block_size=args.tokens + 1)).eval()
    out = {"run": run_info(), "args": vars(args) | {"json": str(args.json)}}
    out["window"] = {"cache_mib": cache_mib(window), "segments": segments(window, args.tokens, args.every)}
    out["full"] = {"cache_mib": cache_mib(full), "segments": segments(full, args.tokens, args.every)}
    out["recompute_ms_per_token"] = round(recompute(window, args.recompute_tokens), 4)
    print("| tokens | window: ms/token | RSS MiB | full: ms/token | RSS MiB |\n|---:|---:|---:|---:|---:|")
    for w, f in zip(out["window"]["segments"], out["full"]["segments"], strict=True):
        print(f"| {w['tokens']:,} | {w['ms_per_token']} | {w['rss_mib']} | {f['ms_per_token']} | {f['rss_mib']} |")
    print(f"cache: window {out['window']['cache_mib']:.3f} MiB, full {out['full']['cache_mib']:.1f} MiB; ", end="")
    print(f"recompute past block_size: {out['recompute_ms_per_token']} ms/token")
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
