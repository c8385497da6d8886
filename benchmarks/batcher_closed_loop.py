"""Continuous batching without the server: closed-loop clients against a `Batcher` alone.

Each of `--clients` clients asks for a 64-token sampled completion of one of serve_load.py's
prompts and, when it ends, for the next, `--requests` times. The decoding thread's work, with
nothing else on the machine's other core: no HTTP, no event loop. Two variants, alternating
`--rounds` times in one process, chosen by `--compare`:

- `prefill` (the default): the requests that arrive at one step prefilled `together`
  (`Batcher.join_all` over them all: one call of the C++ step) or `one by one` (`join_all` over
  each alone: one call per prompt, what the server did before);
- `products`: the C++ step's products past 8 rows over oneDNN's `reordered` weights (the default)
  or `pytorch`'s matrix product;
- `batching`: `batched`, or `one at a time` (a batch of one serving all the requests in turn).

    python benchmarks/batcher_closed_loop.py RUN [--compare prefill] [--clients 32] [--requests 4]
        [--rounds 3] [--json F]

Prints one JSON line per round and variant (tokens/s, seconds in prefill) and the medians.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import attnlab
from attnlab.decode.batching import Batcher, Sequence
from attnlab.decode.sampling import sampling_picker

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402
from serve_load import PROMPTS  # noqa: E402

VARIANTS = {
    "prefill": ("one by one", "together"),
    "products": ("pytorch", "reordered"),
    "batching": ("one at a time", "batched"),
}


def closed_loop(model, tokenizer, clients: int, requests: int, together: bool = True, reordered: bool = True) -> dict:
    """Decode clients x requests completions, each client's next joining when its last ends."""
    batcher = Batcher(model, max_batch=clients, fused=True)
    if not reordered and batcher.runner.fused is not None:
        batcher.runner.fused.reordered = False
    left = dict.fromkeys(range(clients), requests)
    asking, owner, tokens, prefill, drawn = list(range(clients)), {}, 0, 0.0, 0
    start = time.perf_counter()
    while asking or len(batcher):
        new = []
        for client in asking:
            pick = sampling_picker(0.8, None, None, torch.Generator().manual_seed(drawn))
            seq = Sequence(tokenizer.encode(PROMPTS[(client + left[client]) % len(PROMPTS)]), 64, pick)
            owner[seq], left[client], drawn = client, left[client] - 1, drawn + 1
            new.append(seq)
        began = time.perf_counter()
        for group in [new] if together else [[s] for s in new]:
            batcher.join_all(group)
        prefill += time.perf_counter() - began
        batcher.step()
        asking = []
        for seq in [s for s in owner if s.done]:
            client = owner.pop(seq)
            tokens += len(seq.tokens)
            if left[client]:
                asking.append(client)
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
            "prefill_s": round(prefill, 3)}  # fmt: skip


def run_variant(model, tokenizer, clients: int, requests: int, variant: str) -> dict:
    if variant == "one at a time":  # every request in turn, as a server with --max-batch 1
        return closed_loop(model, tokenizer, 1, clients * requests)
    return closed_loop(model, tokenizer, clients, requests, variant != "one by one", variant != "pytorch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a character-level language-model run folder")
    parser.add_argument("--compare", choices=sorted(VARIANTS), default="prefill")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = attnlab.load(args.run)
    model = run.model.eval()
    rows, variants = [], VARIANTS[args.compare]
    with torch.no_grad():
        for round_ in range(args.rounds):
            for variant in variants:
                row = run_variant(model, run.tokenizer, args.clients, args.requests, variant)
                rows.append({"round": round_, args.compare: variant, **row})
                print(json.dumps(rows[-1]), flush=True)
    for variant in variants:
        mine = [r for r in rows if r[args.compare] == variant]
        print(f"{variant}: median {statistics.median(r['tokens_per_s'] for r in mine):.0f} tokens/s, "
              f"prefill {statistics.median(r['prefill_s'] for r in mine):.2f} s")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"run": str(args.run), **run_info(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
