"""Where a masked-LM pre-training step of the `wikitext2-mlm` shape spends its time on this CPU.

The `wikitext2-mlm` preset's model (4 post-norm layers, d_model 256, FFN 1024, a 16k vocabulary,
128-token blocks, batch 32) takes full optimizer steps — forward with the loss at the chosen
positions, backward, clip 1.0, AdamW — on random ids with 40% of positions chosen, as the CPU
runs of BENCHMARKS.md do. The variants alternate within every repeat:
- "bf16, fused attention, PyTorch's loss": the step as the preset ran it until 2026-11-24 (bf16
  autocast, no dropout, PyTorch's fused attention kernel, PyTorch's loss of the logits' fp32 copy);
- "bf16, PyTorch's loss": the same with the attention formula that bf16 training on a CPU now
  takes at <= 128 keys (attnlab.accel.rules.FORMULA_MAX_KEYS);
- "bf16, attnlab's kernels": the preset's step now (train.fused_kernels: the loss through attnlab's
  cross-entropy kernel over the bf16 logits, and ClippingAdamW);
- "fp32" (PyTorch's loss), "fp32, attnlab's kernels" and, with --dropout, "bf16, dropout 0.1"
  (BERT's, the preset's until 2026-11-23); with --compile, the kernels' step through torch.compile
  (compiled at the warm-up step, untimed).
Then a `torch.profiler` table of the kernels' step.

    python benchmarks/mlm_step.py [--steps 5] [--repeats 3] [--dropout] [--compile] [--vocab 16000]
        [--no-keep-freed-memory] [--bf16-anyway] [--out FILE.json]

On a CPU without bf16 matrix kernels (AVX2 alone: a bf16 step takes ~40x as long as fp32) the bf16
variants are left out unless --bf16-anyway.

--vocab sets the vocabulary size (the preset's 16k by default): the masked-LM head's products and
log-softmax scale with it. The trainer has glibc keep freed blocks (attnlab.device.keep_freed_memory)
and so does this script, unless --no-keep-freed-memory: run it both ways to see what that is worth
(a process-wide switch, so two processes).

Medians over repeats. No data files: the step's cost does not depend on which ids it sees.
"""

import argparse
import contextlib
import copy
import json
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import torch
from run_info import run_info

import attnlab.nn.attention
from attnlab.accel import for_training, kernels, reference_cross_entropy, rules
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.device import autocast, cpu_description, cpu_has_bf16_matmul, keep_freed_memory
from attnlab.models.bert import Bert, BertConfig
from attnlab.tasks.masked_lm import masked_lm_loss
from attnlab.train.optim import adamw

BATCH, BLOCK, CHOSEN = 32, 128, 0.4


class Variant(NamedTuple):
    bf16: bool
    dropout: bool = False
    kernels: bool = False
    fused_attention: bool = False
    compiled: bool = False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="steps per timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vocab", type=int, default=16000, help="vocabulary size (the preset's: 16000)")
    p.add_argument("--dropout", action="store_true", help="add bf16 with dropout 0.1")
    p.add_argument("--compile", action="store_true", help="add the kernels' step through torch.compile")
    p.add_argument("--no-keep-freed-memory", action="store_true", help="leave glibc's allocator as it is")
    p.add_argument("--bf16-anyway", action="store_true", help="time bf16 on a CPU without bf16 matrix kernels too")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    kept = False if args.no_keep_freed_memory else keep_freed_memory()

    torch.manual_seed(0)
    model = Bert(BertConfig(vocab_size=args.vocab, max_len=BLOCK, d_model=256, n_heads=4, n_layers=4, d_ff=1024))
    cpu = torch.device("cpu")
    ids = torch.randint(5, args.vocab, (BATCH, BLOCK))
    labels = torch.where(torch.rand(BATCH, BLOCK) < CHOSEN, ids, IGNORE_INDEX)
    # Training mode throughout (the kernels run in training mode), dropout 0 unless a variant asks.
    models = {False: model, True: for_training(copy.deepcopy(model)).model}  # the trainer's two paths
    compiled = {on: torch.compile(m) for on, m in models.items()} if args.compile else models
    optimizers = {  # the trainer's: ClippingAdamW where the kernels are on
        on: adamw(m, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, device=cpu, kernel=on) for on, m in models.items()
    }

    def step(v: Variant) -> None:
        model = models[v.kernels].train()
        _set_dropout(model, 0.1 if v.dropout else 0.0)
        cross_entropy = kernels.cross_entropy if v.kernels else reference_cross_entropy
        with contextlib.ExitStack() as stack:
            if v.fused_attention:
                stack.enter_context(_fused_attention())
            with autocast(cpu, "bfloat16" if v.bf16 else "float32"):  # as the trainer's train.dtype
                forward = compiled[v.kernels] if v.compiled else model
                loss = masked_lm_loss(forward, ids, labels, cross_entropy=cross_entropy)  # the trainer's loss
            loss.backward()
        optimizer = optimizers[v.kernels]
        if hasattr(optimizer, "clip_grad_norm_"):
            optimizer.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    variants = {
        "bf16, fused attention, PyTorch's loss": Variant(True, fused_attention=True),
        "bf16, PyTorch's loss": Variant(True),
        "bf16, attnlab's kernels": Variant(True, kernels=True),
        "fp32": Variant(False),
        "fp32, attnlab's kernels": Variant(False, kernels=True),
    }
    if args.dropout:
        variants["bf16, dropout 0.1"] = Variant(True, dropout=True)
    if args.compile:
        variants["bf16, attnlab's kernels, compiled"] = Variant(True, kernels=True, compiled=True)
    if not (cpu_has_bf16_matmul() or args.bf16_anyway):
        print(f"{cpu_description()}: no bf16 matrix kernels on this CPU (~40x slower than fp32), fp32 variants only")
        variants = {name: v for name, v in variants.items() if not v.bf16}
    profiled = "bf16, attnlab's kernels" if "bf16, attnlab's kernels" in variants else "fp32, attnlab's kernels"
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for v in variants.values():  # warm-up (and compilation)
        step(v)
    for _ in range(args.repeats):
        for name, v in variants.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step(v)
            seconds[name].append((time.perf_counter() - start) / args.steps)
    rows = {
        name: {"ms_per_step": 1e3 * statistics.median(s), "tokens_per_sec": BATCH * BLOCK / statistics.median(s)}
        for name, s in seconds.items()
    }
    width = max(map(len, rows))
    print(
        f"masked-LM step, {BATCH}x{BLOCK} tokens, vocabulary {args.vocab}, {torch.get_num_threads()} threads, "
        f"glibc keeps freed blocks: {kept}, medians of {args.repeats}"
    )
    for name, row in rows.items():
        print(f"  {name:<{width}} {row['ms_per_step']:8.0f} ms/step {row['tokens_per_sec']:8,.0f} tokens/s")

    with torch.profiler.profile() as prof:
        for _ in range(args.steps):
            step(variants[profiled])
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=45)
    print(f"\n{profiled}, {args.steps} steps:\n{table}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    **run_info(),
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "vocab": args.vocab,
                    "keep_freed_memory": kept,
                    "variants": rows,
                    "profiled": profiled,
                    "profile": table,
                },
                indent=1,
            )
            + "\n"
        )


def _set_dropout(model: torch.nn.Module, p: float) -> None:
    """Every dropout of the model at rate p (0: as in eval mode, the modules still training)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p
        elif isinstance(m, attnlab.nn.attention.MultiHeadAttention):
            m.dropout = p


@contextlib.contextmanager
def _fused_attention():
    """PyTorch's fused attention kernel at every length, as before the formula's rule."""
    before = rules.FORMULA_MAX_KEYS
    rules.FORMULA_MAX_KEYS = 0
    try:
        yield
    finally:
        rules.FORMULA_MAX_KEYS = before


if __name__ == "__main__":
    main()
