"""The pieces of a continuous batch's step, C++ against PyTorch, one torch thread, medians:

- `prompts`: serve_load.py's prompts (six of each, 30), prefilled into a `Batcher`'s rows in one
  C++ call (`FusedStep.prefill`) and by the model's forward, grouped and padded as `Batcher`
  does without the fused step;
- `windows`: W sliding windows of block_size random tokens, recomputed by the C++ prefill and by
  the model's forward (W = 1, 4, 16);
- `sampling`: 32 rows at temperature 0.8, each row's picker alone and `pick_rows` over them all.

    python benchmarks/prefill_step.py RUN [--repeats 15] [--json F]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

import attnlab
from attnlab.decode.batching import Batcher, Sequence
from attnlab.decode.sampling import pick_rows, sampling_picker

sys.path.insert(0, str(Path(__file__).parent))
from rows_step import median_ms  # noqa: E402
from run_info import run_info  # noqa: E402
from serve_load import PROMPTS  # noqa: E402


def row(piece: str, count: int, way: str, fn, repeats: int) -> dict:
    return {"piece": piece, "count": count, "way": way, "ms": median_ms(fn, repeats)}


def prompts_rows(model, tokenizer, repeats: int) -> list[dict]:
    block = model.config.block_size
    prompts = [tokenizer.encode(p)[-block:] for p in PROMPTS * 6]
    fused = Batcher(model, 32, fused=True).runner.fused
    eager = Batcher(model, 32)

    def eager_prefill():
        eager.cached.clear()
        for group in eager._prefill_groups([Sequence(p, 1) for p in prompts]):
            eager._prefill(group)

    n = len(prompts)
    return [
        row("prompts", n, "C++", lambda: fused.prefill(prompts, 0), repeats),
        row("prompts", n, "PyTorch", eager_prefill, repeats),
    ]


def windows_rows(model, repeats: int) -> list[dict]:
    rows, fused, c = [], Batcher(model, 32, fused=True).runner.fused, model.config
    for count in (1, 4, 16):
        windows = torch.randint(0, c.vocab_size, (count, c.block_size), generator=torch.Generator().manual_seed(count))
        ids = windows.tolist()
        rows.append(row("windows", count, "C++", lambda ids=ids: fused.prefill(ids, 0), repeats))
        rows.append(row("windows", count, "PyTorch", lambda w=windows: model(w, last_only=True), repeats))
    return rows


def sampling_rows(vocab: int, repeats: int) -> list[dict]:
    logits = torch.randn(32, vocab, generator=torch.Generator().manual_seed(0))
    pickers = [sampling_picker(0.8, generator=torch.Generator().manual_seed(i)) for i in range(32)]

    def one_by_one():
        return [int(p(logits[i : i + 1])[0]) for i, p in enumerate(pickers)]

    return [
        row("sampling", 32, "one by one", one_by_one, repeats),
        row("sampling", 32, "pick_rows", lambda: pick_rows(pickers, logits), repeats),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a character-level language-model run folder")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = attnlab.load(args.run)
    model = run.model.eval()
    with torch.inference_mode():
        rows = prompts_rows(model, run.tokenizer, args.repeats) + windows_rows(model, args.repeats)
        rows += sampling_rows(model.config.vocab_size, args.repeats)
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"run": str(args.run), **run_info(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
