"""Where a masked-LM pre-training step of the `wikitext2-mlm` shape spends its time on this CPU.

The `wikitext2-mlm` preset's model (4 post-norm layers, d_model 256, FFN 1024, a 16k vocabulary,
128-token blocks, batch 32) takes full optimizer steps — forward with the loss at the chosen
positions, backward, clip 1.0, AdamW — on random ids with 40% of positions chosen, as the CPU
runs of BENCHMARKS.md do. Four variants alternate within every repeat: bf16 autocast (the
recipe) and fp32, each with dropout 0.1 (BERT's, and the preset's until it dropped it) and without
(the model in eval mode, the same work otherwise; the preset's now). With --compile, a fifth:
bf16 without dropout through torch.compile, as the trainer's train.compile runs it (compiled at
the warm-up step, untimed). Then a `torch.profiler` table of the bf16 step with dropout.

    python benchmarks/mlm_step.py [--steps 5] [--repeats 3] [--compile] [--vocab 16000] [--out FILE.json]

--vocab sets the vocabulary size (the preset's 16k by default): the masked-LM head's products and
log-softmax scale with it.

Medians over repeats. No data files: the step's cost does not depend on which ids it sees.
"""

import argparse
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from attnlab.data.mlm import IGNORE_INDEX
from attnlab.device import autocast
from attnlab.models.bert import Bert, BertConfig
from attnlab.tasks.mlm import masked_lm_loss
from attnlab.train.optim import adamw

BATCH, BLOCK, CHOSEN = 32, 128, 0.4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="steps per timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vocab", type=int, default=16000, help="vocabulary size (the preset's: 16000)")
    p.add_argument("--compile", action="store_true", help="add bf16 without dropout through torch.compile")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()

    torch.manual_seed(0)
    model = Bert(BertConfig(vocab_size=args.vocab, max_len=BLOCK, d_model=256, n_heads=4, n_layers=4, d_ff=1024))
    cpu = torch.device("cpu")
    optimizer = adamw(model, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, device=cpu)
    ids = torch.randint(5, args.vocab, (BATCH, BLOCK))
    labels = torch.where(torch.rand(BATCH, BLOCK) < CHOSEN, ids, IGNORE_INDEX)

    compiled = torch.compile(model) if args.compile else model  # shares the parameters

    def step(bf16: bool, compile: bool) -> None:
        with autocast(cpu, "bfloat16" if bf16 else "float32"):  # as the trainer's train.dtype
            loss = masked_lm_loss(compiled if compile else model, ids, labels)  # the trainer's mlm loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    variants = {  # (bf16, dropout, compiled)
        "bf16, dropout 0.1": (True, True, False),
        "bf16, no dropout": (True, False, False),
        "fp32, dropout 0.1": (False, True, False),
        "fp32, no dropout": (False, False, False),
    }
    if args.compile:
        variants["bf16, no dropout, compiled"] = (True, False, True)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for bf16, dropout, compile in variants.values():  # warm-up (and compilation)
        model.train(dropout)
        step(bf16, compile)
    for _ in range(args.repeats):
        for name, (bf16, dropout, compile) in variants.items():
            model.train(dropout)
            start = time.perf_counter()
            for _ in range(args.steps):
                step(bf16, compile)
            seconds[name].append((time.perf_counter() - start) / args.steps)
    rows = {
        name: {"ms_per_step": 1e3 * statistics.median(s), "tokens_per_sec": BATCH * BLOCK / statistics.median(s)}
        for name, s in seconds.items()
    }
    print(f"masked-LM step, {BATCH}x{BLOCK} tokens, {torch.get_num_threads()} threads, medians of {args.repeats}")
    for name, row in rows.items():
        print(f"  {name:<20} {row['ms_per_step']:8.0f} ms/step {row['tokens_per_sec']:8,.0f} tokens/s")

    model.train(True)
    with torch.profiler.profile() as prof:
        for _ in range(args.steps):
            step(True, False)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=45)
    print(f"\nthe bf16 step with dropout 0.1, {args.steps} steps:\n{table}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "date": date.today().isoformat(),
                    "machine": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "compile": args.compile,
                    "vocab": args.vocab,
                    "variants": rows,
                    "profile": table,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
