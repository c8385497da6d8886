"""A/B checks behind three decoding choices, each variant alternating with the other in one process.

- `reset`: compiled greedy decoding of a 4×4×128 GPT, right after compiling a 6×6×384 one, with and
  without `torch.compiler.reset()` in between (why `attnlab bench` resets between its cases).
- `attention`: compiled greedy decoding with the one-query attention as the written-out formula
  (what attnlab does) or as the fused SDPA kernel.
- `wrapper`: compiled greedy decoding with inductor's wrapper code in Python (what attnlab does)
  or in C++ (`cpp_wrapper`).
- `operators`: compiled greedy decoding with the weight products as attnlab's operators (what
  attnlab does) or left to the compiler (both decoding routes switched off).
- `beam`: beam search (beam 5, one sentence per call) of a trained translation run with the
  reordered-weight threshold of `attnlab.accel.projection`, with the one-row threshold, and with
  neither decoding route.

    python benchmarks/decode_ab.py reset attention wrapper operators [--rounds 4]
    python benchmarks/decode_ab.py beam --run runs/mt-transformer-v2 --data-dir ../shared/data/multi30k

Prints one JSON line per check: medians of tokens/s (sentences/s for `beam`) per variant.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlab.accel.plan as plan
import attnlab.accel.projection as projection
import attnlab.nn.attention as attention
from attnlab.decode import greedy
from attnlab.models import GPT, GPTConfig

NEW_TOKENS = 200


def gpt(shape: str) -> GPT:
    layers, heads, width = map(int, shape.split("x"))
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=256, n_layers=layers, n_heads=heads, d_model=width)
    return GPT(config).eval()


def alternate(variants: dict[str, Callable[[], None]], units: float, rounds: int) -> dict[str, float]:
    """Median units/s of each variant; each variant's setup-and-warm-up call is untimed."""
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            timed = run()
            start = time.perf_counter()
            timed()
            rates[name].append(units / (time.perf_counter() - start))
    return {name: round(statistics.median(r), 1) for name, r in rates.items()}


def check_reset(rounds: int) -> dict:
    small, large = gpt("4x4x128"), gpt("6x6x384")
    prompt = torch.randint(0, 65, (1, 8), generator=torch.Generator().manual_seed(1))

    def variant(reset: bool) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            torch.compiler.reset()
            greedy(large, prompt, 20, compile=True)  # another model's compiled entries
            if reset:
                torch.compiler.reset()
            greedy(small, prompt, 20, compile=True)
            return lambda: greedy(small, prompt, NEW_TOKENS, compile=True)

        return setup

    return alternate({"kept": variant(False), "reset": variant(True)}, NEW_TOKENS, rounds)


def fused_kernel(q, k, v, mask=None, *, dropout_p=0.0):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None


def check_attention(shape: str, rounds: int) -> dict:
    model = gpt(shape)
    prompt = torch.randint(0, 65, (1, 8), generator=torch.Generator().manual_seed(1))
    formula = attention.scaled_dot_product_attention

    def variant(fn) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            attention.scaled_dot_product_attention = fn
            torch.compiler.reset()
            greedy(model, prompt, 20, compile=True)
            return lambda: greedy(model, prompt, NEW_TOKENS, compile=True)

        return setup

    try:
        return alternate({"formula": variant(formula), "fused kernel": variant(fused_kernel)}, NEW_TOKENS, rounds)
    finally:
        attention.scaled_dot_product_attention = formula


def check_wrapper(shape: str, batch: int, rounds: int) -> dict:
    model = gpt(shape)
    prompt = torch.randint(0, 65, (batch, 8), generator=torch.Generator().manual_seed(1))
    default = dict(plan.CPU_COMPILE_OPTIONS)

    def variant(cpp: bool) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            plan.CPU_COMPILE_OPTIONS = {**default, "cpp_wrapper": cpp}
            torch.compiler.reset()
            greedy(model, prompt, 20, compile=True)
            return lambda: greedy(model, prompt, NEW_TOKENS, compile=True)

        return setup

    try:
        return alternate({"C++ wrapper": variant(True), "Python wrapper": variant(False)}, batch * NEW_TOKENS, rounds)
    finally:
        plan.CPU_COMPILE_OPTIONS = default


def check_operators(shape: str, batch: int, rounds: int) -> dict:
    model = gpt(shape)
    prompt = torch.randint(0, 65, (batch, 8), generator=torch.Generator().manual_seed(1))
    defaults = projection.PACKED_MIN_WEIGHT, projection.GEMV_MIN_WEIGHT

    def variant(packed_min: int, gemv_min: int) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            projection.PACKED_MIN_WEIGHT, projection.GEMV_MIN_WEIGHT = packed_min, gemv_min
            torch.compiler.reset()
            greedy(model, prompt, 20, compile=True)
            return lambda: greedy(model, prompt, NEW_TOKENS, compile=True)

        return setup

    never = 1 << 62
    try:
        return alternate(
            {"attnlab operators": variant(*defaults), "compiler's products": variant(never, never)},
            batch * NEW_TOKENS,
            rounds,
        )
    finally:
        projection.PACKED_MIN_WEIGHT, projection.GEMV_MIN_WEIGHT = defaults


def check_beam(run_dir: Path, data_dir: str, sentences: int, rounds: int) -> dict:
    from attnlab import load
    from attnlab.decode.seq2seq import beam_search
    from attnlab.tasks import Translation

    run = load(run_dir)
    data = run.config.data.__class__(**{**vars(run.config.data), "data_dir": data_dir})
    task = Translation(data, run.config.model, run_dir, resume=True, splits=("test2016",))
    sources = [torch.tensor([list(s)]) for s in task.encoded["test2016"].src[:sentences] if len(s) > 0]
    defaults = projection.PACKED_MIN_WEIGHT, projection.GEMV_MIN_WEIGHT

    def variant(packed_min: int, gemv_min: int) -> Callable[[], Callable[[], None]]:
        def translate() -> None:
            for src in sources:
                beam_search(run.model, src, beam_size=5, bos_id=task.bos_id, eos_id=task.eos_id)

        def setup() -> Callable[[], None]:
            projection.PACKED_MIN_WEIGHT, projection.GEMV_MIN_WEIGHT = packed_min, gemv_min
            translate()
            return translate

        return setup

    never = 1 << 62
    try:
        return alternate(
            {
                "reordered from 32k": variant(*defaults),
                "reordered from 128k": variant(defaults[1], defaults[1]),
                "neither route": variant(never, never),
            },
            len(sources),
            rounds,
        )
    finally:
        projection.PACKED_MIN_WEIGHT, projection.GEMV_MIN_WEIGHT = defaults


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checks", nargs="+", choices=["reset", "attention", "wrapper", "operators", "beam"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--run", type=Path, default=Path("runs/mt-transformer-v2"))
    p.add_argument("--data-dir", default="../shared/data/multi30k")
    p.add_argument("--sentences", type=int, default=30)
    args = p.parse_args()
    for check in args.checks:
        if check == "reset":
            print(json.dumps({"check": "reset", "shape": "4x4x128", **check_reset(args.rounds)}), flush=True)
        elif check == "attention":
            for shape in ("4x4x128", "6x6x384"):
                print(json.dumps({"check": "attention", "shape": shape, **check_attention(shape, args.rounds)}))
        elif check == "wrapper":
            for shape, batch in (("4x4x128", 1), ("6x6x384", 1), ("6x6x384", 8)):
                rates = check_wrapper(shape, batch, args.rounds)
                print(json.dumps({"check": "wrapper", "shape": shape, "batch": batch, **rates}), flush=True)
        elif check == "operators":
            for batch in (1, 8):
                rates = check_operators("6x6x384", batch, args.rounds)
                print(json.dumps({"check": "operators", "shape": "6x6x384", "batch": batch, **rates}), flush=True)
        else:
            rates = check_beam(args.run, args.data_dir, args.sentences, args.rounds)
            print(json.dumps({"check": "beam", "sentences_per_sec": rates}), flush=True)


if __name__ == "__main__":
    main()
