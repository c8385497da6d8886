"""How fast attnlab's training step could be against `transformers`, if only its matrix products cost.

The bench's training case (`attnlab bench`'s shapes, the fused step as `attnlab bench --fused`
runs it) against `transformers`' GPT-2 step, and a third call that makes just the matrix products
of attnlab's step: per block the q/k/v, output and two MLP projections forward, and for each its
weight and input gradients backward, plus the tied head's three, with MKL, into preallocated
outputs, each thread single-threaded on its own sequences, as the kernels make them. The
attention's own products are not among them: they are attnlab's kernel, counted with the rest.
The three alternate within every round; medians.

`transformers` / products is the ceiling of the ratio the bench can show on this machine: the
step would reach it with every one of attnlab's own loops (attention, LayerNorm, GELU, the
optimizer) free. It also prints how much of the step is left for those loops at the 1.3x and 1.5x
targets.

    python benchmarks/step_ceiling.py [--shape 6x6x384] [--block 256] [--batch 12] [--rounds 9] [--out FILE.json]
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import transformers
from run_info import run_info
from train_case import add_train_case_arguments, train_case

from attnlab.studies import bench

TARGETS = (1.3, 1.5)


def products_of_step(shape: str, block: int, batch: int) -> tuple[Callable[[], None], float]:
    """A call that makes the matrix products of one training step of `shape` on one thread's
    `batch` sequences -> (call, FLOPs)."""
    s = bench.SHAPES[shape]
    n, c = batch * block, s["d_model"]
    f = 4 * c
    linears = [(3 * c, c), (c, c), (f, c), (c, f)] * s["n_layers"] + [(bench.VOCAB, c)]  # (out, in)
    calls: list[Callable[[], object]] = []
    flops = 0.0
    for out_features, in_features in linears:
        x, w = torch.randn(n, in_features), torch.randn(out_features, in_features)
        y, dy = torch.empty(n, out_features), torch.randn(n, out_features)
        dw, dx = torch.empty(out_features, in_features), torch.empty(n, in_features)
        calls += [
            lambda x=x, w=w, y=y: torch.mm(x, w.t(), out=y),  # forward
            lambda dy=dy, x=x, dw=dw: torch.mm(dy.t(), x, out=dw),  # weight gradient
            lambda dy=dy, w=w, dx=dx: torch.mm(dy, w, out=dx),  # input gradient
        ]
        flops += 3 * 2 * n * in_features * out_features

    def run() -> None:
        for call in calls:
            call()

    return run, flops


def split_products(shape: str, block: int, batch: int, threads: int) -> tuple[Callable[[], None], float]:
    """The products of one step as attnlab's kernels make them: each of `threads` threads takes its
    own sequences, its products single-threaded -> (call, FLOPs)."""
    parts = [products_of_step(shape, block, len(seqs)) for seqs in torch.arange(batch).chunk(threads)]
    pool = ThreadPoolExecutor(len(parts))

    def run() -> None:
        torch.set_num_threads(1)  # MKL's too: each product on its caller's thread
        try:
            for f in [pool.submit(part) for part, _ in parts]:
                f.result()
        finally:
            torch.set_num_threads(threads)

    return run, sum(flops for _, flops in parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_train_case_arguments(p, "6x6x384", 256)
    p.add_argument("--rounds", type=int, default=9, help="rounds of the three calls, alternating")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()

    cpu = torch.device("cpu")
    case = train_case(args)
    models = bench.build_models(args.shape, args.block, cpu, transformers)
    products, product_flops = split_products(args.shape, args.block, args.batch, torch.get_num_threads())
    calls = {
        "attnlab": bench._train_step("attnlab", models["attnlab"], case, cpu, fused=True),
        "transformers": bench._train_step("transformers", models["transformers"], case, cpu),
        "products": products,
    }
    for call in calls.values():  # warm-up: the kernels' build or load, allocator growth
        call()
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(args.rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
        print(f"round {r}: " + ", ".join(f"{k} {1e3 * v[-1]:.0f} ms" for k, v in times.items()), flush=True)

    ms = {name: 1e3 * statistics.median(v) for name, v in times.items()}
    own = ms["attnlab"] - ms["products"]
    result = {
        **run_info(),
        "case": case.label,
        "rounds": args.rounds,
        "ms_per_step": ms,
        "product_gflop_per_s": product_flops / ms["products"] / 1e6,
        "ratio": ms["transformers"] / ms["attnlab"],
        "ceiling": ms["transformers"] / ms["products"],
        "attnlab_own_ms": own,
        "own_ms_allowed": {f"{t}x": ms["transformers"] / t - ms["products"] for t in TARGETS},
    }
    print(f"{case.label}, {torch.get_num_threads()} threads, medians of {args.rounds} rounds")
    print(
        f"attnlab {ms['attnlab']:.0f} ms, transformers {ms['transformers']:.0f} ms, "
        f"products alone {ms['products']:.0f} ms ({result['product_gflop_per_s']:.1f} GFLOP/s)"
    )
    print(f"ratio {result['ratio']:.3f}x; ceiling with attnlab's own loops free {result['ceiling']:.3f}x")
    for t in TARGETS:
        allowed = result["own_ms_allowed"][f"{t}x"]
        print(f"{t}x leaves {allowed:.0f} ms for attnlab's own loops; they take {own:.0f} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
