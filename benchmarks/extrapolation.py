"""Which position schemes extrapolate? Train the same small GPT with each scheme on the same data
and budget, then evaluate perplexity at 1x, 2x, 4x and 8x the training context without retraining
(Press et al. 2022, "Train Short, Test Long", Figure 1).

Each run is `attnlab train` then `attnlab eval RUN --context N`, as a user would type them; a run
already trained is not trained again (the script can be killed and started again). Learned
positions have no vector past their table: those cells are "n/a".

    python benchmarks/extrapolation.py --data ../shared/data/wikitext-2/train.txt \\
        --out benchmarks/results/extrapolation.json --plot docs/extrapolation.png
"""

import argparse
import json
import time
from pathlib import Path

from cli_runs import attnlab, train_run

SCHEMES = ("learned", "sinusoidal", "fourier", "none", "rope", "alibi", "relative")


def train(scheme: str, args: argparse.Namespace) -> dict:
    overrides = {
        "data.path": str(args.data.resolve()),
        "model.positions": scheme,
        "model.block_size": args.context,
        "train.max_iters": args.iters,
        "train.lr_decay_iters": args.iters,
        "train.batch_size": args.batch_size,
        "train.eval_interval": args.iters,
        "train.fused_kernels": True,  # where the kernels apply (full attention, positions at the input)
    }
    return train_run("shakespeare-char-cpu", args.runs / scheme, overrides)


def evaluate(scheme: str, context: int, args: argparse.Namespace) -> float | None:
    run = args.runs / scheme
    done = attnlab("eval", str(run), "--context", str(context), "--max-tokens", str(args.max_tokens), "--json")
    if done.returncode == 2 and "reads at most" in done.stderr:
        return None  # learned positions: no vector past the table
    if done.returncode != 0:
        raise SystemExit(f"evaluating {scheme} at {context} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)["val_ppl"]


def table(results: dict, multiples: list[int], context: int) -> str:
    head = "| scheme | " + " | ".join(f"{m}x ({m * context})" for m in multiples) + " | train time |"
    lines = [head, "|---" * (len(multiples) + 2) + "|"]
    for scheme, row in results.items():
        cells = ["n/a" if row["ppl"][str(m)] is None else f"{row['ppl'][str(m)]:.3f}" for m in multiples]
        lines.append(f"| {scheme} | " + " | ".join(cells) + f" | {row['train_sec']:.0f} s |")
    return "\n".join(lines)


def plot(results: dict, multiples: list[int], context: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scheme, row in results.items():
        points = [(m * context, row["ppl"][str(m)]) for m in multiples if row["ppl"][str(m)] is not None]
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=scheme)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([m * context for m in multiples], [str(m * context) for m in multiples])
    ax.axvline(context, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("evaluation context (tokens); dashed: the training context")
    ax.set_ylabel("validation perplexity (characters)")
    ax.set_title("Train short, test long: one small GPT per position scheme")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a text file (WikiText-2's train.txt)")
    p.add_argument("--runs", type=Path, default=Path("runs/extrapolation"), help="where the run folders go")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    p.add_argument("--context", type=int, default=128, help="the training context (default 128)")
    p.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--iters", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=2**18, help="evaluate on the val split's first N tokens")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/extrapolation.json"))
    p.add_argument("--plot", type=Path)
    args = p.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for scheme in args.schemes:
        start = time.perf_counter()
        trained = train(scheme, args)
        row = {"train_sec": trained.get("elapsed_sec", time.perf_counter() - start), "step": trained["step"]}
        row["ppl"] = {str(m): evaluate(scheme, m * args.context, args) for m in args.multiples}
        results[scheme] = row
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(f"{scheme}: {row}", flush=True)
    print(table(results, args.multiples, args.context))
    if args.plot:
        plot(results, args.multiples, args.context, args.plot)


if __name__ == "__main__":
    main()
