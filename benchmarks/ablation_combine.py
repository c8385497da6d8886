"""One table of two `attnlab ablate` studies of the same spec and budget, run at different times:
the first study's rows (vanilla included) as they are, then the second's other rows, each moved by
the difference of the two vanilla means, so that every row keeps its Δ against its own study's
vanilla. For benchmarks/transfer_table.py, whose LM_STUDY is one folder.

    python benchmarks/ablation_combine.py NEW/ablation.csv OLD/ablation.csv OUT_FOLDER
"""

import argparse
import csv
from pathlib import Path


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def vanilla(rows: list[dict[str, str]], path: Path) -> float:
    for r in rows:
        if r["variant"] == "vanilla":
            return float(r["final_loss"])
    raise SystemExit(f"ablation_combine: error: {path} has no vanilla row")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first", type=Path)
    p.add_argument("second", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    first, second = read(args.first), read(args.second)
    shift = vanilla(first, args.first) - vanilla(second, args.second)
    names = {r["variant"] for r in first}
    rows = first + [
        {**r, "final_loss": f"{float(r['final_loss']) + shift:.6g}"} for r in second if r["variant"] not in names
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "ablation.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(first[0]))
        w.writeheader()
        w.writerows({k: r.get(k, "") for k in first[0]} for r in rows)


if __name__ == "__main__":
    main()
