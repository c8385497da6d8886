"""What a GPT's blocks in one C++ call save in the bench's fused training step on this CPU.

Two copies of the bench's attnlab model (shape, block, batch: 4x4x128, 64, 12 by default) train
as `attnlab bench --fused` does, alternating within every round (which goes first alternates
too): one as the code stands, its blocks through `kernels.pre_norm_stack` (the whole stack one
call forward and one backward), the other with that declined, so that each block is a call of its
own (`kernels.pre_norm_block`, as before the stack). The same build of the kernels serves both;
their losses and gradients are equal to the bit (tests/accel/test_kernels.py). Prints the median ms
per step of each and the median of the per-round ratios.

    python benchmarks/stack_step.py [--shape 4x4x128] [--rounds 30] [--out FILE.json]
"""

import argparse
import json
import statistics

import torch
from run_info import run_info
from train_case import add_rounds_arguments, add_train_case_arguments, alternate, train_case

from attnlab.accel import kernels
from attnlab.studies import bench


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_train_case_arguments(p)
    add_rounds_arguments(p, rounds=30)
    args = p.parse_args()

    cpu = torch.device("cpu")
    case = train_case(args)
    stacked = bench._train_step(
        "attnlab", bench.build_models(args.shape, args.block, cpu, None)["attnlab"], case, cpu, fused=True
    )
    block_step = bench._train_step(
        "attnlab", bench.build_models(args.shape, args.block, cpu, None)["attnlab"], case, cpu, fused=True
    )
    stack = kernels.pre_norm_stack

    def one_call_per_block() -> None:
        kernels.pre_norm_stack = lambda *a, **k: None  # FusedGPT._stack then calls its blocks one by one
        try:
            block_step()
        finally:
            kernels.pre_norm_stack = stack

    ms = alternate({"one call per block": one_call_per_block, "one call per stack": stacked}, args.rounds)
    old, new = ms["one call per block"], ms["one call per stack"]
    ratio = statistics.median(o / n for o, n in zip(old, new, strict=True))
    medians = {name: statistics.median(v) for name, v in ms.items()}
    print(
        f"{case.label}: " + ", ".join(f"{name} {v:.2f} ms" for name, v in medians.items()),
        f"(per round, blocks / stack: median {ratio:.3f}x)",
    )
    if args.out:
        result = {
            **run_info(),
            "case": vars(args) | {"out": str(args.out)},
            "ms_per_step": medians,
            "per_round_ratio_median": ratio,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
