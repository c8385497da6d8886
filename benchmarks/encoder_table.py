"""Transfer learning on real data: the same BERT encoder fine-tuned from masked-LM pre-training on
WikiText-2 versus from random initialisation (same vocabulary, same budget), and the BiLSTM
baseline, on SST-2 sentiment and UD English EWT part-of-speech tagging.

For each run folder: task, model, initialisation, parameters, steps and training seconds (from
metrics.csv), the best validation accuracy and the accuracy of the best checkpoint on the report
split (SST-2: dev; UD: test). A masked-LM run reports validation MLM accuracy and perplexity.

    python benchmarks/encoder_table.py runs/sst2-scratch runs/sst2-pretrained ... \
        --data-root ../shared/data --out benchmarks/results/encoders.json
"""

import argparse
import csv
import dataclasses
import json
from pathlib import Path

import torch

from attnlab import load
from attnlab.tasks import TASKS
from attnlab.viz import plot_curves

DATA = {"masked-lm": "wikitext-2", "text-classification": "sst2", "token-classification": "ud-english-ewt"}
REPORT_SPLIT = {"masked-lm": "val", "text-classification": "dev", "token-classification": "test"}


def summarise(run_dir: Path, data_root: Path) -> dict:
    run = load(run_dir)  # the best checkpoint on validation
    task_name = run.config.task
    split = REPORT_SPLIT[task_name]
    # The run's own data folder, found under data_root (a masked LM may have read a treebank).
    own = Path(run.config.data.data_dir).name
    folder = data_root / (own if own and (data_root / own).is_dir() else DATA[task_name])
    data = dataclasses.replace(run.config.data, data_dir=str(folder))
    task = TASKS[task_name](data, run.config.model, run_dir, resume=True, splits=(split,))
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    train_rows = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval" and r["val_accuracy"]]
    best = json.loads((run_dir / "best.json").read_text())
    metrics = task.evaluate(run.model, torch.device("cpu"), split=split)
    init = getattr(run.config.data, "init_from", "")
    return {
        "run": str(run_dir),
        "task": task_name,
        "model": run.config.model.kind,
        "init": "pre-trained" if init else "random",
        "init_from": init,
        "data": folder.name,
        "parameters": sum(p.numel() for p in run.model.parameters()),
        "steps": int(train_rows[-1]["step"]),
        "training_sec": round(float(train_rows[-1]["elapsed_sec"]), 1),
        "best_step": best["step"],
        "best_val_accuracy": round(max(float(r["val_accuracy"]) for r in evals), 4),
        "report_split": split,
        "accuracy": round(metrics["accuracy"], 4),
        **({"val_ppl": round(metrics[f"{split}_ppl"], 2)} if task_name == "masked-lm" else {}),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--data-root", type=Path, required=True, help="folder holding sst2/, ud-english-ewt/, wikitext-2/")
    p.add_argument("--out", type=Path)
    p.add_argument("--mlm-curve", type=Path, help="save the masked-LM runs' validation accuracy and perplexity here")
    p.add_argument("--curves", type=Path, help="save each task's validation accuracy curves as STEM-TASK.png")
    args = p.parse_args()
    rows = [summarise(r, args.data_root) for r in args.runs]
    mlm = [Path(r["run"]) for r in rows if r["task"] == "masked-lm"]
    tuned = [r for r in rows if r["task"] != "masked-lm"]
    if args.mlm_curve and mlm:
        plot_curves(mlm, ["val_accuracy", "val_ppl"], args.mlm_curve, title="masked-LM pre-training, validation")
    for task_name in sorted({r["task"] for r in tuned}) if args.curves else []:
        group = [r for r in tuned if r["task"] == task_name]
        path = args.curves.with_name(f"{args.curves.stem}-{task_name}.png")
        labels = [f"{r['model']}, {r['init']} init" for r in group]
        plot_curves([Path(r["run"]) for r in group], ["val_accuracy"], path, labels=labels, title=task_name)
    print("| task | model | init | params | steps | train min | best val acc | reported split | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['task']} | {r['model']} | {r['init']} | {r['parameters'] / 1e6:.1f}M | {r['steps']} | "
            f"{r['training_sec'] / 60:.1f} | {r['best_val_accuracy']:.4f} | {r['report_split']} | "
            f"{r['accuracy']:.4f}{' (ppl ' + str(r['val_ppl']) + ')' if 'val_ppl' in r else ''} |"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
