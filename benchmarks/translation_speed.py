"""Training speed of the three translation models under the same conditions, one after another on
an otherwise idle machine: real Multi30k batches (4,096-token budget, one shared BPE vocabulary),
full optimizer steps. Reports target tokens/s and the seconds one epoch would take.

    python benchmarks/translation_speed.py --data-dir ../shared/data/multi30k --tokenizer-run runs/mt-transformer
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from attnlab.config import load_preset_or_file
from attnlab.tasks import Translation
from attnlab.train import resolve
from attnlab.train.optim import adamw

PRESETS = {
    "rnn": "multi30k-de-en-rnn",
    "rnn-attention": "multi30k-de-en-rnn-attention",
    "transformer": "multi30k-de-en",
}


def measure(kind: str, data_dir: str, tokenizer_run: Path, steps: int, warmup: int) -> dict:
    _, doc = load_preset_or_file(PRESETS[kind])
    doc["data"]["data_dir"] = data_dir
    config = resolve(doc)
    # resume=True reads the vocabulary of an existing run, so every model uses the same one.
    task = Translation(config.data, config.model, tokenizer_run, resume=True, splits=("train",))
    torch.manual_seed(0)
    model = task.build_model().train()
    optimizer = adamw(model, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.0, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    times, tokens = [], []
    for i in range(warmup + steps):
        batch = task.train_batch(i, gen)
        start = time.perf_counter()
        loss = task.loss(model, batch, torch.device("cpu"), 0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            tokens.append(task.batch_tokens(batch))
    per_step = statistics.median(times)
    return {
        "model": kind,
        "parameters": sum(p.numel() for p in model.parameters()),
        "sec_per_step_median": round(per_step, 3),
        "target_tokens_per_sec": round(sum(tokens) / sum(times), 1),
        "sec_per_epoch": round(per_step * task.batches_per_epoch(), 1),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--tokenizer-run", type=Path, required=True, help="a translation run whose vocabulary to use")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = [measure(kind, args.data_dir, args.tokenizer_run, args.steps, args.warmup) for kind in PRESETS]
    for r in rows:
        print(r, flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
