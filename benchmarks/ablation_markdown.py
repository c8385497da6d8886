"""The ablation table of `attnlab ablate` (its ablation.csv) as Markdown, beside Narang et al.
2021's direction for each row, with each variant's final-loss difference from the baseline
against the seed spread.

    python benchmarks/ablation_markdown.py runs/ablate-shakespeare-char/ablation.csv

"Beyond the spread": Welch's t of the difference of means, |t| > 2 (about a 95% two-sided
interval at 3 seeds a side is wider still, |t| > 2.8 at 4 degrees of freedom; both are shown).
"""

import argparse
import csv
import math

# Narang et al. 2021, Table 1 (T5-base pre-training loss at 65k steps against the vanilla row),
# as this project reads it: "better" / "worse" when the paper's row differs clearly, "same"
# otherwise. Their vanilla used ReLU and LayerNorm, as ours does.
PAPER = {
    "vanilla": "baseline",
    "gelu": "same",
    "swish": "same",
    "glu": "better",
    "geglu": "better",
    "reglu": "better",
    "swiglu": "better (best dense)",
    "liglu": "better",
    "rmsnorm": "better",
    "rezero": "much worse",
    "rezero+layernorm": "same",
    "rezero+rmsnorm": "same",
    "block-sharing": "worse",
    "factorized-embeddings": "worse",
    "moe-top2": "better",
    "switch": "better (best)",
    "universal": "worse",
}


def welch_t(m1: float, s1: float, n1: int, m2: float, s2: float, n2: int) -> float:
    se = math.sqrt(s1**2 / n1 + s2**2 / n2)
    return (m1 - m2) / se if se > 0 else math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--baseline", default="vanilla")
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    base = next(r for r in rows if r["variant"] == args.baseline)
    bm, bs, bn = float(base["final_loss"]), float(base["final_loss_sd"]), int(base["seeds"])
    print("| variant | params | FLOPs/token | steps/s | early loss | final loss (mean ± sd) | Δ | t | paper |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m, s, n = float(r["final_loss"]), float(r["final_loss_sd"]), int(r["seeds"])
        delta = m - bm
        t = welch_t(m, s, n, bm, bs, bn) if r is not base else 0.0
        mark = "**" if abs(t) > 2 else ""
        print(
            f"| {r['variant']} | {int(r['params']) / 1e3:.0f}k | {float(r['flops_per_token']) / 1e6:.2f}M "
            f"| {float(r['steps_per_sec']):.1f} | {float(r['early_loss']):.3f} "
            f"| {m:.3f} ± {s:.3f} | {mark}{delta:+.3f}{mark} | {t:+.1f} | {PAPER.get(r['variant'], '')} |"
        )


if __name__ == "__main__":
    main()
