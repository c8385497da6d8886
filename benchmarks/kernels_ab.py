"""Two builds of attnlab's training kernels side by side: one pre-norm block, its attention, or the optimizer.

A change to `src/attnlab/accel/kernels.cpp` worth a percent or two is below the spread of whole
training steps between runs; this times the C++ calls themselves, forward + backward, the two
builds taking turns (the order flipped every round) on the same inputs, after checking what each
gives. Build each source once (`python -c "from attnlab.accel.kernels import extension;
extension()"`) and copy the module it leaves in
`~/.cache/torch_extensions/attnlab_kernels_*/attnlab_kernels_*.so` (`attnlab kernels status` says
which folder) aside:

    python benchmarks/kernels_ab.py OLD.so NEW.so [--part block|attention|optimizer] [--shape 4x4x128] [--block 64]
        [--pairs 6] [--rounds 15] [--out FILE.json]

Each build runs in a worker process of its own, told when to run by this one, so that the two
never run at once. They must: CPython hands a second load of an extension module under the same
name (every build's is `attnlab_kernels`) the module it loaded first, whatever the file, so two
builds loaded in one process are the first one twice. (Until 2026-11-25 this script did that, and
its "A/B" timed one build against itself: about ±1% between orders, the noise of the method.)
The pair of processes is started afresh `--pairs` times: where a process's buffers land moved one
pair's ratio by up to ±4% on this 2-core machine, so the ratio is the median of the pairs' own
(each the ratio of its medians), all printed; which worker starts first alternates between pairs.

The ratio is OLD's time over NEW's: above 1, NEW is faster. Pass the same file twice for the
spread of the method itself.
"""

import argparse
import hashlib
import io
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from run_info import run_info
from train_case import add_train_case_arguments, train_case

PARTS = ("block", "attention", "optimizer")  # optimizer: ClippingAdamW's global norm and AdamW step


def module_name(build: Path) -> str:
    """The name the build's module was compiled under (`attnlab_kernels`, or `attnlab_kernels_`
    and its build's digest), read from its `PyInit_` symbol: CPython finds the module by it."""
    import re

    found = re.search(rb"PyInit_(attnlab_kernels(?:_[0-9a-f]+)?)\x00", build.read_bytes()) if build.is_file() else None
    return found.group(1).decode() if found else "attnlab_kernels"


def worker(build: Path, part: str, shape: str, block: int, batch: int) -> None:
    """Load `build`, make the inputs (the same in every worker: fixed seed), then answer this
    process's commands on stdin: `outputs` (the outputs, torch.save'd, hex on one line) and
    `time N` (seconds per forward + backward over N calls)."""
    import importlib.util
    import time

    answers, sys.stdout = sys.stdout, sys.stderr  # stdout carries the answers alone

    from attnlab.accel import kernels
    from attnlab.studies import bench

    spec = importlib.util.spec_from_file_location(module_name(build), build)
    if spec is None or spec.loader is None:
        raise SystemExit(f"kernels_ab: {build} is not a Python extension module; pass a built attnlab_kernels .so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = bench.build_models(shape, block, torch.device("cpu"), None)["attnlab"]
    layer = model.blocks[0]
    width, heads = layer.norm1.weight.numel(), layer.attn.n_heads
    if part == "optimizer":
        call = _optimizer_call(module, model)
    elif part == "block":
        x, dy = torch.randn(batch, block, width), torch.randn(batch, block, width)
        params = [t.detach() for t in kernels._params(layer)]
        kernel = module.PreNormBlock(heads, True, kernels.ACTIVATION_CODES[layer.ffn.activation], layer.norm1.eps)

        def call() -> list[torch.Tensor]:
            return [kernel.forward(x, params), *kernel.backward(dy)]
    else:
        qkv, dy = torch.randn(batch, block, 3 * width), torch.randn(batch, block, width)

        def call() -> list[torch.Tensor]:
            y, lse = module.attention_forward(qkv, heads, True)
            return [y, lse, module.attention_backward(dy, qkv, y, lse, heads, True)]

    print(f"ready {module.__file__}", file=answers, flush=True)
    with torch.no_grad():
        for line in sys.stdin:
            command = line.split()
            if command[0] == "outputs":
                buffer = io.BytesIO()
                torch.save(call(), buffer)
                print(buffer.getvalue().hex(), file=answers, flush=True)
            else:
                calls = int(command[1])
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                print((time.perf_counter() - start) / calls, file=answers, flush=True)


def _optimizer_call(module: ModuleType, model: torch.nn.Module) -> Callable[[], list[torch.Tensor]]:
    """ClippingAdamW's two calls on the whole model, as a training step makes them: the gradients'
    global norm, then the AdamW step (clipping factor 1), on fixed random gradients, the parameters
    in the optimizer's order (its weight-decay group first). Each call steps the parameters and the
    state on, in both workers alike; the data stays in the caches between calls here, where a
    training step's activations would push it out."""
    from attnlab.train.optim import adamw

    groups = adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, device=torch.device("cpu")).param_groups
    params = [p.detach() for g in groups for p in g["params"]]
    decay = [float(g["weight_decay"]) for g in groups for _ in g["params"]]
    grads = [torch.randn_like(p) for p in params]
    exp_avg, exp_avg_sq = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    steps = [torch.zeros(()) for _ in params]
    n = len(params)

    def call() -> list[torch.Tensor]:
        norm = module.global_norm(grads)
        settings = ([1e-3] * n, decay, [0.9] * n, [0.99] * n, [1e-8] * n)
        module.adamw_step(params, grads, exp_avg, exp_avg_sq, steps, *settings, 1.0)
        return [torch.tensor(norm), *params]

    return call


class Worker:
    """One build in its own process."""

    def __init__(self, build: Path, args: argparse.Namespace) -> None:
        command = [sys.executable, __file__, "--worker", str(build)]
        command += ["--part", args.part, "--shape", args.shape, "--block", str(args.block), "--batch", str(args.batch)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.loaded = self._answer().removeprefix("ready ")

    def _answer(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"kernels_ab: the worker for a build stopped (exit code {self.process.wait()})")
        return line.strip()

    def ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def outputs(self) -> list[torch.Tensor]:
        return torch.load(io.BytesIO(bytes.fromhex(self.ask("outputs"))))

    def seconds_per_call(self, calls: int) -> float:
        return float(self.ask(f"time {calls}"))

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Optional to argparse only so that a worker's command line can leave them out.
    p.add_argument("old", type=Path, nargs="?", help="the first build (the baseline)")
    p.add_argument("new", type=Path, nargs="?", help="the second build")
    p.add_argument("--part", choices=PARTS, default="block", help="what to time (default: a block)")
    add_train_case_arguments(p)
    p.add_argument("--pairs", type=int, default=6, help="fresh pairs of worker processes, one after another")
    p.add_argument("--rounds", type=int, default=15, help="rounds of both builds per pair, alternating")
    p.add_argument("--calls", type=int, default=0, help="forward + backward calls per timing (0: ~0.3 s' worth)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.part, args.shape, args.block, args.batch)
        return
    if args.new is None:
        p.error("the two builds are needed: OLD.so NEW.so")
    for path in (args.old, args.new):
        if not path.is_file():
            raise SystemExit(f"kernels_ab: no file {path}; build the kernels and copy the .so there first")

    case = train_case(args)
    builds = {"old": args.old, "new": args.new}
    times: dict[str, list[float]] = {name: [] for name in builds}
    pair_ratios, loaded, diff, calls = [], {}, 0.0, args.calls
    for k in range(args.pairs):
        # Which of the two is started first alternates too: in runs of one build against itself
        # the second-started worker was the faster by ~2%.
        order = list(builds) if k % 2 == 0 else list(reversed(builds))
        runs = {name: Worker(builds[name], args) for name in order}
        try:
            outputs = {name: run.outputs() for name, run in runs.items()}
            diff = max(
                [diff] + [(a - b).abs().max().item() for a, b in zip(*outputs.values(), strict=True) if a.numel()]
            )
            calls = calls or max(1, round(0.3 / runs["old"].seconds_per_call(1)))
            these: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(args.rounds):
                for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    these[name].append(runs[name].seconds_per_call(calls))
        finally:
            for run in runs.values():
                run.close()
        loaded = {name: run.loaded for name, run in runs.items()}
        pair_ratios.append(statistics.median(these["old"]) / statistics.median(these["new"]))
        for name in times:
            times[name] += these[name]

    ms = {name: 1e3 * statistics.median(v) for name, v in times.items()}
    result = {
        **run_info(),
        "case": case.label,
        "part": args.part,
        "builds": {name: {"path": str(path), "sha256": sha256(path)} for name, path in builds.items()},
        "loaded": loaded,
        "pairs_of_processes": args.pairs,
        "rounds_per_pair": args.rounds,
        "calls_per_timing": calls,
        "max_abs_difference": diff,
        "ms_per_forward_backward": ms,
        "speedup": statistics.median(pair_ratios),
        "speedup_per_pair": pair_ratios,
        "speedup_of_pooled_medians": ms["old"] / ms["new"],
    }
    what = {"block": "one block", "attention": "one block's attention", "optimizer": "the optimizer step"}[args.part]
    threads = torch.get_num_threads()
    print(f"{case.label}, {what}, {threads} threads, {args.pairs} pairs of processes x {args.rounds} rounds")
    print(f"outputs differ by at most {diff:.3g}")
    print("new/old by pair: " + " ".join(f"{r:.3f}x" for r in pair_ratios))
    print(f"old {ms['old']:.3f} ms, new {ms['new']:.3f} ms (medians of all rounds)")
    print(f"new is {result['speedup']:.3f}x (the median pair)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
