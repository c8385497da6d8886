"""Where attnlab's GPT training step of `attnlab bench` spends its time on this CPU.

The bench's training case (shape, block, batch: 4x4x128, 64, 12 by default) as `attnlab bench`
steps it (forward with the loss, backward, clip 1.0, AdamW), optionally through attnlab's C++
kernels (`--fused`, as `attnlab bench --fused`). Prints ms per step (the median of a few timed
runs) and a `torch.profiler` table, and with --out writes both as JSON, with the step split into
the matrix products, the C++ blocks' own loops, and everything else.

    python benchmarks/train_step_profile.py [--shape 4x4x128] [--block 64] [--batch 12] [--fused] [--out FILE.json]
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
from run_info import run_info
from train_case import add_train_case_arguments, train_case

from attnlab.studies import bench

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm")
BLOCK_KERNELS = ("_PreNormBlock", "_PreNormBlockBackward")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_train_case_arguments(p)
    p.add_argument("--fused", action="store_true", help="through attnlab's C++ kernels")
    p.add_argument("--steps", type=int, default=20, help="steps per timing and in the profile")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()

    cpu = torch.device("cpu")
    case = train_case(args)
    model = bench.build_models(args.shape, args.block, cpu, None)["attnlab"]
    step = bench._train_step("attnlab", model, case, cpu, fused=args.fused)
    for _ in range(5):  # warm-up: the kernels' build or load, allocator growth
        step()
    ms = 1e3 * statistics.median(bench._seconds_per_call(step, args.steps, cpu) for _ in range(5))  # as the bench times

    with torch.profiler.profile() as prof:
        for _ in range(args.steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)

    def share(names: tuple[str, ...]) -> float:
        return sum(e.self_cpu_time_total for e in events if e.key in names) / total

    split = {"products": share(PRODUCTS), "block_kernels": share(BLOCK_KERNELS)}
    split["rest"] = 1.0 - split["products"] - split["block_kernels"]
    table = events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=45)
    print(f"{args.shape} block {args.block} batch {args.batch}, fused={args.fused}, {torch.get_num_threads()} threads")
    print(f"{ms:.2f} ms/step (median of 5 x {args.steps})")
    print("share of the profiled CPU time: " + ", ".join(f"{k} {v:.1%}" for k, v in split.items()))
    print(table)
    if args.out:
        result = {
            **run_info(),
            "case": vars(args) | {"out": str(args.out)},
            "ms_per_step": ms,
            "split": split,
            "profile": table,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
