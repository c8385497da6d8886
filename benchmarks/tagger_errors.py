"""Where a UD tagger's errors are: accuracy by how often the word occurs in the training split
(never, once or twice, more), by how many subwords the run's vocabulary splits it into, and the
most frequent confusions. For the tagging runs named, on one split, with the run's own settings
(its best checkpoint, its word pooling).

    python benchmarks/tagger_errors.py runs/ud-pos-pretrained runs/ud-pos-pretrained-mean \
        --data-dir ../shared/data/ud-english-ewt --split test --out benchmarks/results/ud-errors.json
"""

import argparse
import dataclasses
import json
from collections import Counter
from pathlib import Path

import torch
from run_info import run_info

from attnlab import load
from attnlab.data.conllu import read_conllu
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.tasks import TASKS
from attnlab.tasks.token_classification import find_split_file


def frequency_class(count: int) -> str:
    return "unseen in train" if count == 0 else "1-2 times in train" if count < 3 else "3+ times in train"


@torch.no_grad()
def errors(run_dir: Path, data_dir: Path, split: str) -> dict:
    run = load(run_dir)
    if run.config.task != "token-classification":
        raise SystemExit(f"{run_dir} is a {run.config.task} run, not a tagging run")
    data = dataclasses.replace(run.config.data, data_dir=str(data_dir))
    task = TASKS["tagging"](data, run.config.model, run_dir, resume=True, splits=(split,))
    seen = Counter(w for s in read_conllu(find_split_file(str(data_dir), "train")) for w in s.words)
    model = run.model.eval()
    by_class: Counter = Counter()
    by_pieces: Counter = Counter()
    confusions: Counter = Counter()
    for indices in task.batches(split):
        ids, targets, *extra = task.collate(split, indices)
        predicted = task.logits(model, ids, *extra).argmax(-1)
        for row, i in enumerate(indices):
            sentence = task.sentences[split][i]
            for word, position in zip(sentence.words, task.starts[split][i], strict=False):
                gold = int(targets[row, position])
                if gold == IGNORE_INDEX:
                    continue
                ok = int(predicted[row, position]) == gold
                pieces = min(len(task.tokenizer.encode(word)), 3)
                by_class[frequency_class(seen[word]), ok] += 1
                by_pieces["3+" if pieces == 3 else str(pieces), ok] += 1
                if not ok:
                    confusions[f"{task.labels[gold]} -> {task.labels[int(predicted[row, position])]}"] += 1
    wrong = sum(n for (_, ok), n in by_class.items() if not ok)
    words = sum(by_class.values())

    def table(counts: Counter) -> list[dict]:
        rows = []
        for key in sorted({k for k, _ in counts}):
            n = counts[key, True] + counts[key, False]
            rows.append(
                {
                    "group": key,
                    "count": n,
                    "accuracy": counts[key, True] / n,
                    "share_of_errors": counts[key, False] / max(wrong, 1),
                }
            )
        return rows

    return {
        "run": str(run_dir),
        "word_pooling": data.word_pooling,
        "split": split,
        "words_scored": words,
        "accuracy_of_scored": 1 - wrong / words,
        "by_training_frequency": table(by_class),
        "by_subwords": table(by_pieces),
        "top_confusions": confusions.most_common(10),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--data-dir", type=Path, required=True, help="the UD treebank folder")
    p.add_argument("--split", default="test", choices=["dev", "test"])
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    results = [errors(r, args.data_dir, args.split) for r in args.runs]
    for r in results:
        head = f"{r['run']} ({r['word_pooling']} subword), {r['split']}"
        print(f"{head}: {r['accuracy_of_scored']:.4f} of {r['words_scored']} words")
        for name in ("by_training_frequency", "by_subwords"):
            for row in r[name]:
                print(
                    f"  {row['group']:<20} {row['count']:6d} words  accuracy {row['accuracy']:.4f}"
                    f"  {100 * row['share_of_errors']:5.1f}% of errors"
                )
        print(
            "  most frequent confusions (gold -> predicted):", ", ".join(f"{k} {n}" for k, n in r["top_confusions"][:6])
        )
    if args.out:
        args.out.write_text(json.dumps({**run_info(), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
