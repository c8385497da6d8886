"""Two builds of attnlab's training kernels side by side: one pre-norm block's forward + backward.

A change to `src/attnlab/nn/kernels.cpp` worth a percent or two is below the spread of whole
training steps between runs; this times the block's C++ call itself, the two builds alternating
in one process (the order flipped every round), on the same inputs, and checks first that both
give the same outputs. Build each source once (`python -c "from attnlab.nn.kernels import
extension; extension()"`) and copy the module it leaves in
`~/.cache/torch_extensions/*/attnlab_kernels/attnlab_kernels.so` aside:

    python benchmarks/kernels_ab.py OLD.so NEW.so [--shape 4x4x128] [--block 64] [--rounds 61] [--out FILE.json]

The ratio is OLD's time over NEW's: above 1, NEW is faster. Run it in both orders (NEW.so OLD.so
too): the order has moved the ratio by about 1% on this machine, so a change smaller than that is
not resolved by it.
"""

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path
from types import ModuleType

import torch
from run_info import run_info
from train_case import add_train_case_arguments, train_case

from attnlab import bench
from attnlab.nn import kernels


def load(path: Path) -> ModuleType:
    """The kernels module built at `path` (each path its own copy, under the module's one name)."""
    spec = importlib.util.spec_from_file_location("attnlab_kernels", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"kernels_ab: {path} is not a Python extension module; pass a built attnlab_kernels .so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path, help="the first build (the baseline)")
    p.add_argument("new", type=Path, help="the second build")
    add_train_case_arguments(p)
    p.add_argument("--rounds", type=int, default=61, help="rounds of both builds, alternating")
    p.add_argument("--calls", type=int, default=0, help="forward + backward calls per timing (0: ~0.3 s' worth)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    for path in (args.old, args.new):
        if not path.is_file():
            raise SystemExit(f"kernels_ab: no file {path}; build the kernels and copy the .so there first")

    case = train_case(args)
    block = bench.build_models(args.shape, args.block, torch.device("cpu"), None)["attnlab"].blocks[0]
    width = block.norm1.weight.numel()
    x, dy = torch.randn(case.batch, case.block, width), torch.randn(case.batch, case.block, width)
    params = [t.detach() for t in kernels._params(block)]
    activation = kernels.ACTIVATION_CODES[block.ffn.activation]
    runs = {
        name: load(path).PreNormBlock(block.attn.n_heads, True, activation, block.norm1.eps)
        for name, path in (("old", args.old), ("new", args.new))
    }

    def call(kernel: object) -> list[torch.Tensor]:
        return [kernel.forward(x, params), *kernel.backward(dy)]

    with torch.no_grad():
        outputs = {name: call(kernel) for name, kernel in runs.items()}
        diff = max((a - b).abs().max().item() for a, b in zip(*outputs.values(), strict=True) if a.numel())
        start = time.perf_counter()
        call(runs["old"])
        calls = args.calls or max(1, round(0.3 / (time.perf_counter() - start)))
        times: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(args.rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                start = time.perf_counter()
                for _ in range(calls):
                    call(runs[name])
                times[name].append((time.perf_counter() - start) / calls)

    ms = {name: 1e3 * statistics.median(v) for name, v in times.items()}
    result = {
        **run_info(),
        "case": case.label,
        "builds": {"old": str(args.old), "new": str(args.new)},
        "rounds": args.rounds,
        "calls_per_timing": calls,
        "max_abs_difference": diff,
        "ms_per_block_forward_backward": ms,
        "speedup": ms["old"] / ms["new"],
    }
    print(f"{case.label}, one block, {torch.get_num_threads()} threads, medians of {args.rounds} rounds")
    print(f"outputs differ by at most {diff:.3g}")
    print(f"old {ms['old']:.3f} ms, new {ms['new']:.3f} ms: new is {result['speedup']:.3f}x")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
