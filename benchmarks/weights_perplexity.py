"""Perplexity of a trained attnlab language model through its fused decoding step, with the weights
stored as fp32, bf16, int8 (GGUF's q8_0) and int4 (GGUF's Q4_0) (`attnlab.accel.fused.WEIGHT_FORMATS`):
what storing the weights in fewer bytes costs in quality, measured by the path that decodes with them.

The text is tokenized by the run's tokenizer and cut into consecutive windows of the model's block
size; each window is decoded from an empty cache, one token a step, 8 windows side by side (the
step's rows), and every token after a window's first is scored given the ones before it in the
window. The same windows through the model's own forward (PyTorch, fp32) give the reference the
fused fp32 figure must match.

With --prompt P each window's first P tokens are instead prefilled as prompts, the group's windows
in one call (P × rows rows: the many-row products), and its tokens from P + 1 on scored as they
decode. That is the path where bf16 weights on a CPU with bf16 instructions multiply the prompt's
rows in bf16 (`attnlab.accel.fused.NATIVE_BF16`), measured beside bf16 widened ("bf16-widened").

    python benchmarks/weights_perplexity.py RUN --data ../shared/data/wikitext-2/valid.txt
        [--rows 8] [--max-tokens N] [--prompt P] [--formats fp32,int4] [--json FILE]

Prints one JSON object: the run, the tokens scored, the bytes a weight each format stores (as the
step holds it in memory: its values and scales), the perplexity per precision and each one's
relative difference from fp32's.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import attnlab
from attnlab.accel.fused import NATIVE_BF16, WEIGHT_FORMATS, FusedStep, extension, stored_weight, supports

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402


def windows(ids: list[int], block: int, rows: int) -> torch.Tensor:
    """The ids cut into consecutive windows of `block` tokens `(N, block)`, N a multiple of `rows`
    (the tail that does not fill a group of rows is left out)."""
    n = len(ids) // (block * rows) * rows
    return torch.tensor(ids[: n * block]).view(n, block)


def fused_nll(
    model: torch.nn.Module,
    chunks: torch.Tensor,
    rows: int,
    weights: str,
    prompt: int = 0,
    native_bf16: bool | None = None,
) -> float:
    """Summed negative log-likelihood (nats) of every window's tokens after its first (after its
    first `prompt`, prefilled in one call for the group), decoded by the fused step with `weights`,
    `rows` windows at a time."""
    total = 0.0
    with torch.inference_mode():
        for group in chunks.split(rows):
            cache = model.new_cache(rows)
            step = FusedStep(model, extension(), cache, weights, native_bf16=native_bf16)
            if prompt:
                logits = step.prefill(group[:, :prompt].tolist(), 0)  # (rows, V): the next token of each
                total -= logits.log_softmax(-1).gather(1, group[:, prompt : prompt + 1]).sum().item()
            for t in range(prompt, group.size(1) - 1):
                logits = step(group[:, t : t + 1], cache, t)[:, -1]  # (rows, V)
                total -= logits.log_softmax(-1).gather(1, group[:, t + 1 : t + 2]).sum().item()
    return total


def eager_nll(model: torch.nn.Module, chunks: torch.Tensor, rows: int, prompt: int = 0) -> float:
    """The same sum through the model's own forward over whole windows (fp32, PyTorch)."""
    total = 0.0
    first = max(0, prompt - 1)  # the logits that predict the first scored token
    with torch.inference_mode():
        for group in chunks.split(rows):
            logits = model(group[:, :-1])[:, first:]  # (rows, block - 1 - first, V)
            total -= logits.log_softmax(-1).gather(2, group[:, first + 1 :, None]).sum().item()
    return total


def bytes_per_weight(model: torch.nn.Module, weights: str) -> float:
    """The bytes a weight the step holds for `model`'s linear layers in format `weights`: their
    stored values and scales over the weights they stand for."""
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    stored = sum(t.nbytes for w in linears for t in stored_weight(w, weights))
    return stored / sum(w.numel() for w in linears)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a run folder written by `attnlab train` (a language model)")
    p.add_argument("--data", type=Path, required=True, help="the text to score, e.g. WikiText-2's valid.txt")
    p.add_argument("--rows", type=int, default=8, help="windows decoded side by side (default 8)")
    p.add_argument("--max-tokens", type=int, help="score at most about this many tokens (default: the whole text)")
    p.add_argument("--prompt", type=int, default=0, help="prefill each window's first P tokens (default 0: none)")
    p.add_argument(
        "--formats", default=",".join(WEIGHT_FORMATS), help="weight formats to score, comma-separated (default: all)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args()
    chosen = args.formats.split(",")
    if "fp32" not in chosen or not set(chosen) <= set(WEIGHT_FORMATS):
        raise SystemExit(f"--formats must include fp32 and name only {', '.join(WEIGHT_FORMATS)}")
    torch.set_num_threads(args.threads)
    run = attnlab.load(args.run)
    model = run.model.eval()
    if extension() is None or not supports(model, model.new_cache(1)):
        raise SystemExit("the fused decoding step is not built here or does not cover this model")
    ids = run.tokenizer.encode(args.data.read_text(encoding="utf-8"))
    if args.max_tokens:
        ids = ids[: args.max_tokens]
    chunks = windows(ids, model.config.block_size, args.rows)
    if not 0 <= args.prompt < model.config.block_size - 1:
        raise SystemExit(f"--prompt must be in 0..{model.config.block_size - 2}")
    scored = chunks.numel() - chunks.size(0) * max(1, args.prompt)
    ppl, seconds = {}, {}
    reference = math.exp(eager_nll(model, chunks, args.rows, args.prompt) / scored)
    formats = {w: (w, None) for w in chosen}  # label -> (weights, native_bf16: None for the default)
    if args.prompt:  # prompts are where bf16 may multiply in bf16: bf16 with fp32 rows beside it
        formats["bf16-widened"] = ("bf16", False)
    for label, (weights, native) in formats.items():
        start = time.perf_counter()
        ppl[label] = math.exp(fused_nll(model, chunks, args.rows, weights, args.prompt, native) / scored)
        seconds[label] = round(time.perf_counter() - start, 1)
    result = {
        **run_info(),
        "run": str(args.run),
        "data": str(args.data),
        "block_size": model.config.block_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "windows": chunks.size(0),
        "prompt": args.prompt,
        "bf16_native_here": NATIVE_BF16,
        "tokens_scored": scored,
        "bytes_per_weight": {w: round(bytes_per_weight(model, w), 4) for w in chosen},
        "perplexity_pytorch_fp32": round(reference, 4),
        "perplexity": {w: round(v, 4) for w, v in ppl.items()},
        "relative_to_fp32": {w: round(ppl[w] / ppl["fp32"] - 1, 5) for w in ppl},
        "within_1_percent": all(abs(ppl[w] / ppl["fp32"] - 1) < 0.01 for w in ppl),
        "seconds": seconds,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
