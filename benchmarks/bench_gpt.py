"""attnlab GPT versus `transformers` GPT-2 of the same shape, measured side by side in one run.

Training: tokens/s of full optimizer steps (forward, backward, clip, AdamW) on random batches.
Generation: new tokens/s of greedy decoding, 200 new tokens after an 8-token prompt, at batch 1
and 8, with each library's KV cache. Peers alternate within every repeat, so both see the same
machine state; the table reports medians and the attnlab/peer ratio.

MFU: model FLOPs per token (6N + 12·L·T·C, the PaLM/nanoGPT estimate) × tokens/s, divided by the
machine's fp32 matmul peak measured in the same run (a 2048³ GEMM).

    python benchmarks/bench_gpt.py --out benchmarks/results/bench_gpt.json
"""

import argparse
import json
import platform
import statistics
import time
from datetime import date

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from attnlab.decode import greedy
from attnlab.models import GPT, GPTConfig

SHAPES = {
    "4x4x128": dict(n_layer=4, n_head=4, n_embd=128),
    "6x6x384": dict(n_layer=6, n_head=6, n_embd=384),
}
VOCAB = 65  # Tiny Shakespeare characters


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / min(times)


def build(shape: str, block: int):
    s = SHAPES[shape]
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=VOCAB, block_size=block, bias=True, activation="gelu_tanh", **s))
    torch.manual_seed(0)
    hf_config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=block,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        **s,
    )
    theirs = GPT2LMHeadModel(hf_config)
    return {"attnlab": ours, "transformers": theirs}


def train_step_fn(name: str, model, batch: int, block: int):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    x = torch.randint(0, VOCAB, (batch, block))
    y = torch.randint(0, VOCAB, (batch, block))
    model.train()

    def step():
        if name == "attnlab":
            _, loss = model(x, y)
        else:
            loss = model(input_ids=x, labels=y).loss  # shifts labels inside: same token count
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def generate_fn(name: str, model, batch: int, new_tokens: int):
    prompt = torch.randint(0, VOCAB, (batch, 8))
    model.eval()
    if name == "attnlab":
        return lambda: greedy(model, prompt, new_tokens)

    def run():
        with torch.inference_mode():
            return model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    return run


def timed(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def flops_per_token(model: GPT, block: int) -> float:
    c = model.config
    return 6 * model.num_parameters() + 12 * c.n_layer * block * c.n_embd


def compare(label: str, fns: dict, units_per_call: float, steps: int, repeats: int) -> dict:
    for fn in fns.values():  # warm-up
        fn()
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(units_per_call / timed(fn, steps))
    med = {name: statistics.median(v) for name, v in samples.items()}
    row = {"case": label, **{f"{k}_per_sec": round(v, 1) for k, v in med.items()}}
    row["ratio"] = round(med["attnlab"] / med["transformers"], 3)
    row["repeats"] = repeats
    print(
        f"{label:<44} attnlab {med['attnlab']:>10,.0f}/s   transformers {med['transformers']:>10,.0f}/s   "
        f"ratio {row['ratio']:.2f}x",
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--quick", action="store_true", help="tiny numbers of steps: checks the script runs")
    args = p.parse_args()
    steps, new_tokens = (2, 20) if args.quick else (10, 200)

    peak = matmul_peak_flops()
    print(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s on {torch.get_num_threads()} threads")
    rows = []
    # Training: nanoGPT's CPU recipe shape (block 64, batch 12).
    models = build("4x4x128", 64)
    fns = {name: train_step_fn(name, m, 12, 64) for name, m in models.items()}
    row = compare("train 4x4x128 block 64 batch 12 (tokens)", fns, 12 * 64, steps, args.repeats)
    row["attnlab_mfu"] = round(row["attnlab_per_sec"] * flops_per_token(models["attnlab"], 64) / peak, 3)
    row["transformers_mfu"] = round(row["transformers_per_sec"] * flops_per_token(models["attnlab"], 64) / peak, 3)
    rows.append(row)
    # Generation: 200 new tokens needs more than 64 positions, so these models get block 256.
    for shape in ("4x4x128", "6x6x384"):
        models = build(shape, 256)
        for batch in (1, 8):
            fns = {name: generate_fn(name, m, batch, new_tokens) for name, m in models.items()}
            rows.append(
                compare(f"generate {shape} batch {batch} (new tokens)", fns, batch * new_tokens, 1, args.repeats)
            )

    result = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
