"""How fast a decoding step's matrix products read their weights: F.linear against attnlab's routes.

A decoding step multiplies a few rows (one per sequence) by weight matrices that, together, do not
fit in the cache, so each product's speed is the rate at which its weight streams from memory.
This measures that rate, in GB/s of weights read, on 40 distinct 1536×384 fp32 matrices (94 MB,
about the FFN weights of a 6×384 GPT, three times this CPU's L3) for:

- `F.linear`: what `torch.nn.Linear` calls;
- `attnlab.nn.linear`: the batched matmul over two halves of the weight rows (one row);
- `attnlab.nn.Linear` in inference: the oneDNN product with the reordered weight (2–8 rows);
- a read-only sum of the same weights: the ceiling for anything that reads them once.

    python benchmarks/gemv.py [--rows 1 8] [--repeats 7] [--out FILE.json]

Medians over repeats, the variants alternating within each repeat.
"""

import argparse
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.accel.projection import Linear, linear

OUT_FEATURES, IN_FEATURES, MATRICES = 1536, 384, 40


def seconds(fn, calls: int = 3) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    torch.manual_seed(0)
    layers = [Linear(IN_FEATURES, OUT_FEATURES) for _ in range(MATRICES)]
    weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers)
    results = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "weight_bytes": weight_bytes,
        "cases": [],
    }
    with torch.inference_mode():
        for rows in args.rows:
            x = torch.randn(rows, IN_FEATURES)
            variants = {
                "F.linear": lambda x=x: [F.linear(x, m.weight, m.bias) for m in layers],
                "read-only sum": lambda: [m.weight.sum() for m in layers],
            }
            if rows == 1:
                variants["attnlab.nn.linear"] = lambda x=x: [linear(x, m.weight, m.bias) for m in layers]
            else:
                variants["attnlab.nn.Linear"] = lambda x=x: [m(x) for m in layers]
            for fn in variants.values():  # warm-up; Linear reorders its weights here
                fn()
            times: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.repeats):
                for name, fn in variants.items():
                    times[name].append(seconds(fn))
            rates = {name: weight_bytes / statistics.median(t) / 1e9 for name, t in times.items()}
            case = {"rows": rows, "gb_per_s": {k: round(v, 1) for k, v in rates.items()}}
            results["cases"].append(case)
            print(json.dumps(case), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
