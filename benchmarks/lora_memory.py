"""Peak memory of a LoRA training step against full fine-tuning, on a GPT-2-124M-shaped model.

Each mode runs in a fresh process (the CPU's peak resident size is a process-wide high-water
mark): the model is built, `train.lora`'s `apply_lora` freezes it and adds adapters (LoRA mode),
AdamW is built over the trainable parameters as the trainer builds it, and a few training steps
run on random tokens. Reported per mode: the peak memory of the whole process (CPU: the resident
set's high-water mark; CUDA: `torch.cuda.max_memory_allocated`) and its rise over the built model,
the bytes of gradients and optimizer state that the step holds (counted from the tensors
themselves), the trainable parameters, and tokens per second.

    python benchmarks/lora_memory.py [--layers 12 --heads 12 --d-model 768 --vocab 50257]
        [--batch 2 --seq 256 --steps 3 --rank 8 --targets query,value] [--device cpu|cuda] [--out FILE.json]
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
from run_info import run_info

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train.config import LoRAConfig
from attnlab.train.lora import apply_lora
from attnlab.train.optim import adamw

MODES = ("full", "lora")


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default="query,value")
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in a child process
    p.add_argument("--out", help="write the results as JSON here")
    return p.parse_args()


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def one_mode(args: argparse.Namespace) -> dict:
    """Build, (LoRA: freeze and adapt), then train `args.steps` steps; the figures of this process."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=args.vocab,
        block_size=max(args.seq, 1024),
        n_layers=args.layers,
        n_heads=args.heads,
        d_model=args.d_model,
        dropout=0.0,
    )
    model = GPT(config).to(device)
    if args.mode == "lora":
        apply_lora(model, LoRAConfig(rank=args.rank, alpha=2.0 * args.rank, targets=tuple(args.targets.split(","))))
    optimizer = adamw(model, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, device=device)
    built = peak_bytes(device)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    start = time.perf_counter()
    for _ in range(args.steps):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keep the gradients: they are part of the step's memory
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    params = {id(p): p for p in model.parameters()}.values()
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return {
        "mode": args.mode,
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "peak_bytes": peak_bytes(device),
        "peak_over_model_bytes": peak_bytes(device) - built,
        "gradient_bytes": tensor_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state_bytes": tensor_bytes(state),
        "tokens_per_sec": args.batch * args.seq * args.steps / seconds,
    }


def print_table(results: list[dict]) -> None:
    gib, mib = 2**30, 2**20
    head = ("mode", "trainable", "peak GiB", "over model", "grads MiB", "Adam MiB", "tok/s")
    print("{:<6} {:>12} {:>9} {:>11} {:>10} {:>9} {:>8}".format(*head))
    for r in results:
        row = (
            r["mode"],
            f"{r['trainable']:,}",
            f"{r['peak_bytes'] / gib:.2f}",
            f"{r['peak_over_model_bytes'] / gib:.2f}",
            f"{r['gradient_bytes'] / mib:.1f}",
            f"{r['optimizer_state_bytes'] / mib:.1f}",
            f"{r['tokens_per_sec']:.0f}",
        )
        print("{:<6} {:>12} {:>9} {:>11} {:>10} {:>9} {:>8}".format(*row))


def main() -> None:
    args = arguments()
    if args.mode is not None:
        print(json.dumps(one_mode(args)))
        return
    settings = {k: v for k, v in vars(args).items() if k not in ("mode", "out")}
    child = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    results = []
    for mode in MODES:
        out = subprocess.run(
            [sys.executable, __file__, *child, "--mode", mode], capture_output=True, text=True, check=True
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print_table(results)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"settings": settings, "results": results, "run": run_info()}, f, indent=2)


if __name__ == "__main__":
    main()
