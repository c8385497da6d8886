"""What attnlab's ClippingAdamW saves in the bench's fused GPT training step on this CPU.

Two copies of the bench's attnlab model (shape, block, batch: 4x4x128, 64, 12 by default), both
training through attnlab's C++ block kernels, alternate within every round: one clips with
`torch.nn.utils.clip_grad_norm_` and steps PyTorch's fused AdamW (the bench's step before
ClippingAdamW, and the peer's optimizer), the other steps as `attnlab bench --fused` and
`train.fused_kernels` do now (`ClippingAdamW`: one C++ call for the global norm, one for the
update). Prints the median ms per step of each and the median of the per-round ratios, and the
clipping plus optimizer step alone, timed the same way on fixed gradients.

    python benchmarks/optimizer_step.py [--shape 4x4x128] [--rounds 40] [--out FILE.json]
"""

import argparse
import copy
import json
import statistics

import torch
from run_info import run_info
from train_case import add_rounds_arguments, add_train_case_arguments, alternate, train_case

from attnlab.accel import for_training
from attnlab.studies import bench
from attnlab.train.optim import adamw


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_train_case_arguments(p)
    add_rounds_arguments(p, rounds=40)
    args = p.parse_args()

    cpu = torch.device("cpu")
    case = train_case(args)
    model = bench.build_models(args.shape, args.block, cpu, None)["attnlab"]
    pytorch_model = copy.deepcopy(model)
    steps = {
        "clip_grad_norm_ + torch AdamW": _pytorch_optimizer_step(pytorch_model, case, cpu),
        "ClippingAdamW": bench._train_step("attnlab", model, case, cpu, fused=True),
    }
    optimizers = {
        "clip_grad_norm_ + torch AdamW": _optimizer_alone(copy.deepcopy(model), cpu, kernel=False),
        "ClippingAdamW": _optimizer_alone(copy.deepcopy(model), cpu, kernel=True),
    }
    results = {}
    for what, fns in (("full step", steps), ("clip + optimizer step", optimizers)):
        ms = alternate(fns, args.rounds)
        old, new = ms["clip_grad_norm_ + torch AdamW"], ms["ClippingAdamW"]
        results[what] = {name: statistics.median(v) for name, v in ms.items()} | {
            "per_round_ratio_median": statistics.median(n / o for n, o in zip(new, old, strict=True))
        }
        print(
            f"{what}: " + ", ".join(f"{name} {statistics.median(v):.3f} ms" for name, v in ms.items()),
            f"(ClippingAdamW / PyTorch per round: median {results[what]['per_round_ratio_median']:.3f})",
        )
    if args.out:
        meta = {
            **run_info(),
            "case": vars(args) | {"out": str(args.out)},
        }
        args.out.write_text(json.dumps(meta | results, indent=1) + "\n")


def _pytorch_optimizer_step(model: torch.nn.Module, case: bench.TrainCase, device: torch.device):
    """The bench's fused attnlab step with PyTorch's clipping and fused AdamW instead of ClippingAdamW."""
    optimizer = adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, device=device)
    x = torch.randint(0, bench.VOCAB, (case.batch, case.block))
    y = torch.randint(0, bench.VOCAB, (case.batch, case.block))

    for_training(model.train())  # the bench's fused step: attnlab's kernels for the blocks

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _optimizer_alone(model: torch.nn.Module, device: torch.device, kernel: bool):
    """Clip to 1.0 and step on fixed random gradients (set again before every call)."""
    optimizer = adamw(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, device=device, kernel=kernel)
    params = list(model.parameters())
    grads = [torch.randn_like(p) for p in params]

    def step() -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        if kernel:
            optimizer.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return step


if __name__ == "__main__":
    main()
