"""Quality at equal steps with long inputs: full attention against window, BigBird and Linformer in
a small BERT pre-trained by masked LM on WikiText-2 in blocks of 512 tokens (issue 27's second
study; the time and memory side is benchmarks/attention_patterns.py and `attnlab cost`).

Every variant is the same model, data, steps, batch and schedule, `wikitext2-mlm` with overrides;
only `model.attention` differs. The masked-token accuracy and loss are the trainer's last
validation figures (the same masked validation blocks for every variant).

    python benchmarks/long_attention.py --data-dir ../shared/data/wikitext-2 \\
        --out benchmarks/results/long_attention.json
"""

import argparse
import json
from pathlib import Path

from cli_runs import train_run

VARIANTS = {
    "full": {},
    "window": {"model.attention": "window", "model.attention_window": 64},
    "bigbird": {
        "model.attention": "bigbird",
        "model.attention_block": 64,
        "model.global_blocks": 1,
        "model.random_blocks": 1,
    },
    "linformer": {"model.attention": "linformer", "model.linformer_k": 128},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, required=True, help="WikiText-2's folder (train.txt, valid.txt)")
    p.add_argument("--runs", type=Path, default=Path("runs/long-attention"))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--length", type=int, default=512, help="tokens a block (default 512)")
    p.add_argument("--iters", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/long_attention.json"))
    args = p.parse_args()
    base = {
        "model.max_len": args.length,
        "model.d_model": 128,
        "model.n_heads": 4,
        "model.n_layers": 2,
        "model.d_ff": 512,
        "data.vocab_size": 8000,
        "train.max_iters": args.iters,
        "train.warmup_iters": args.iters // 10,
        "train.batch_size": args.batch_size,
        "train.eval_interval": args.iters,
        "train.eval_iters": 20,
        "train.fused_kernels": False,  # the same (PyTorch) path for every variant
    }
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for name in args.variants:
        summary = train_run("wikitext2-mlm", args.runs / name, base | VARIANTS[name], "--data-dir", str(args.data_dir))
        results[name] = {k: summary[k] for k in ("val_loss", "val_accuracy", "elapsed_sec", "tokens_per_sec", "step")}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"{name}: {results[name]}", flush=True)
    print("| attention | val masked-token accuracy | val loss | train time | tokens/s |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['val_accuracy']:.4f} | {r['val_loss']:.4f} | {r['elapsed_sec']:.0f} s | "
            f"{r['tokens_per_sec']:,.0f} |"
        )


if __name__ == "__main__":
    main()
