"""What one continuous-batching step costs: the C++ rows step (`FusedStep.rows`) of a GPT run at
1, 8 and 32 cache rows, and, at 32 rows, the four weight products of one block alone, as PyTorch's
matrix product and as oneDNN's over the reordered weight (`attnlab.accel.projection.reordered_weight`).
The 32-row step is also timed with PyTorch's products in place of the reordered weights it takes
past 8 rows, the two ways alternating three times.

    python benchmarks/rows_step.py RUN [--threads 1] [--json F]

The rows hold serve_load.py's prompts and are stepped a few times first, so their positions are
those of a real batch. Medians of repeated calls, in milliseconds.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlab
from attnlab.accel.projection import reordered_weight
from attnlab.decode.batching import Batcher, Sequence

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402
from serve_load import PROMPTS  # noqa: E402


def median_ms(call, repeats: int = 50) -> float:
    for _ in range(5):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3)


def rows_step_ms(model, tokenizer, rows: int, reordered: bool = True) -> float:
    """The C++ step of `rows` cache rows at their own positions (rewriting the same slots each call);
    reordered=False: PyTorch's matrix product where the step would take oneDNN's reordered weights."""
    batcher = Batcher(model, max_batch=rows, fused=True)
    if not reordered:
        batcher.runner.fused.reordered = False
    batcher.join_all([Sequence(tokenizer.encode(PROMPTS[i % len(PROMPTS)]), 200) for i in range(rows)])
    for _ in range(5):
        batcher.step()
    tokens = torch.tensor([s.tokens[-1] for s in batcher.scheduler.cached])
    positions = torch.tensor([s.filled for s in batcher.scheduler.cached])
    return median_ms(lambda: batcher.runner.fused.rows(tokens, positions))


def block_products_ms(model, rows: int) -> dict[str, float]:
    """One block's q/k/v, output and two MLP products for `rows` rows, PyTorch's and oneDNN's."""
    block = model.blocks[0]
    layers = [block.attn.in_proj, block.attn.out_proj, block.ffn.fc1, block.ffn.fc2]
    inputs = [torch.randn(rows, layer.weight.size(1)) for layer in layers]
    packed = [reordered_weight(layer.weight) for layer in layers]

    def pytorch():
        for layer, x in zip(layers, inputs, strict=True):
            F.linear(x, layer.weight, layer.bias)

    def onednn():
        for layer, x, w in zip(layers, inputs, packed, strict=True):
            torch.ops.mkldnn._linear_pointwise(x, w, layer.bias, "none", [], "")

    return {"pytorch_ms": median_ms(pytorch), "onednn_reordered_ms": median_ms(onednn)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a GPT run folder the C++ step covers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = attnlab.load(args.run)
    model = run.model.eval()
    with torch.no_grad():
        result = {f"rows_step_ms_{r}": rows_step_ms(model, run.tokenizer, r) for r in (1, 8, 32)}
        ab = {"reordered": [], "pytorch": []}
        for _ in range(3):
            for way in ab:
                ab[way].append(rows_step_ms(model, run.tokenizer, 32, reordered=way == "reordered"))
        result["rows_step_ms_32_products"] = ab
        result["block_products_32_rows"] = block_products_ms(model, 32)
    result["blocks"] = len(model.blocks)
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps({"run": str(args.run), **run_info(), **result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
