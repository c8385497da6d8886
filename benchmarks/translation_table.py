"""The lectures' comparison on real data: GRU encoder–decoder, GRU + Bahdanau attention and the
Transformer, trained on Multi30k de→en with the same data, vocabulary, trainer and decoders.

For each run folder: parameters, seconds per epoch and training tokens/s (from metrics.csv),
epochs trained, the best validation BLEU (greedy, as measured during training), and test2016 /
test2017 BLEU with beam search (sacreBLEU cased and lowercased tokenized).

    python benchmarks/translation_table.py runs/mt-transformer runs/mt-rnn-attention runs/mt-rnn \
        --data-dir ../shared/data/multi30k --out benchmarks/results/translation.json
"""

import argparse
import csv
import json
import statistics
import time
from pathlib import Path

import torch

from attnlab import load
from attnlab.tasks import Translation


def summarise(run_dir: Path, data_dir: str, beam: int) -> dict:
    run = load(run_dir)  # the best checkpoint by validation BLEU
    data = run.config.data.__class__(**{**vars(run.config.data), "data_dir": data_dir})
    task = Translation(data, run.config.model, run_dir, resume=True, splits=("train", "test2016", "test2017"))
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    train_rows = [r for r in rows if r["kind"] == "train"]
    last_step, elapsed = int(train_rows[-1]["step"]), float(train_rows[-1]["elapsed_sec"])
    epochs = last_step / task.batches_per_epoch()
    best = json.loads((run_dir / "best.json").read_text())
    row = {
        "run": str(run_dir),
        "model": run.config.model.kind,
        "parameters": sum(p.numel() for p in run.model.parameters()),
        "steps": last_step,
        "epochs": round(epochs, 2),
        "training_sec": round(elapsed, 1),
        "sec_per_epoch": round(elapsed / epochs, 1),
        "train_tokens_per_sec": round(statistics.median(float(r["tokens_per_sec"]) for r in train_rows), 1),
        "best_step": best["step"],
        "val_bleu_greedy": round(best["val_bleu"], 2),
        "beam": beam,
    }
    for split in ("test2016", "test2017"):
        t = time.perf_counter()
        m = task.evaluate(run.model, torch.device("cpu"), split=split, beam=beam)
        row[f"{split}_bleu"] = round(m["bleu"], 2)
        row[f"{split}_bleu_lc_tok"] = round(m["bleu_lc_tok"], 2)
        row[f"{split}_decode_sec"] = round(time.perf_counter() - t, 1)
        row["sacrebleu_signature"] = m["sacrebleu_signature"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = [summarise(r, args.data_dir, args.beam) for r in args.runs]
    print(
        "| model | params | epochs | s/epoch | train tok/s | val BLEU (greedy) | test2016 BLEU | test2016 lc-tok "
        "| test2017 BLEU | test2017 lc-tok |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {r['epochs']} | {r['sec_per_epoch']} | "
            f"{r['train_tokens_per_sec']:,.0f} | {r['val_bleu_greedy']} | {r['test2016_bleu']} | "
            f"{r['test2016_bleu_lc_tok']} | {r['test2017_bleu']} | {r['test2017_bleu_lc_tok']} |"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
