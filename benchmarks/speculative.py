"""Speculative decoding at batch 1: accepted tokens per target step and wall-clock tokens/s, with
and without speculation, on a trained character GPT.

- `draft`: a smaller GPT trained on the same text (the same characters: the same tokenizer)
  drafts k tokens (`attnlab.decode.ModelDrafter`, its steps on the fused C++ step where it is
  built), greedy and sampled (temperature 0.8), on Shakespeare-style prompts;
- `lookup`: prompt lookup (`attnlab.decode.PromptLookup`, no second model) on a text-editing
  prompt: a passage, then the instruction to write it again with one change, and its first words.

Each drafter's rows come twice where the fused C++ step is built (`attnlab kernels build`): the
target checking the drafts with PyTorch's forward, and "on fused target", in one fused call
(`FusedStep.extend`). The baselines decode the same prompts without speculation: PyTorch's step
and the fused step; `speedup` is over the first, `vs_fused` over the second. Greedy speculative
text is checked to be the baseline's, character for character. Tokens/s: the median of
`--repeats` rounds of generations of `--tokens` tokens each (every way once a round, in turn), one
torch threads as OMP_NUM_THREADS says (run with 1 or 2).

Without `--target`/`--draft`, both are trained first into a temporary folder from the
shakespeare-char-cpu preset (the target as it is but for `--block` and `--iters`; the drafter one
layer of width 64). The prompts and `--tokens` fit the default block of 256, where the target
checks the drafts through its KV cache (past the block each position's window is recomputed, as
plain decoding does, and the k + 1 windows of a step cost about k + 1 plain steps):

    python benchmarks/speculative.py [--target RUN --draft RUN | --out DIR] [--iters 600] [--block 256]
        [--tokens 90] [--repeats 3] [--json F]
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import attnlab
from attnlab.decode import (
    ModelDrafter,
    PromptLookup,
    Speculation,
    encode_prompt,
    generate_tokens,
    sampling_picker,
    speculative_generate,
)

sys.path.insert(0, str(Path(__file__).parent))
from run_info import run_info  # noqa: E402

PROMPTS = ("ROMEO:\n", "First Citizen:\nWe are accounted poor citizens", "KING RICHARD II:\n")
PASSAGE = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n"
EDIT_PROMPT = f"{PASSAGE}\nThe same, with summer made spring:\nNow is the winter of our discontent\nMade glorious "


def train_pair(folder: Path, iters: int, block: int) -> tuple[Path, Path]:
    """The target (the preset's 4 x 128 GPT) and a drafter (1 layer x 64), trained on Tiny Shakespeare."""
    from attnlab.cli import main

    common = ["--set", f"train.max_iters={iters}", "--set", f"train.lr_decay_iters={iters}"]
    common += ["--set", f"train.eval_interval={iters}", "--set", f"model.block_size={block}"]
    small = ["--set", "model.n_layers=1", "--set", "model.d_model=64", "--set", "model.n_heads=2"]
    for name, extra in (("target", []), ("draft", small)):
        code = main(["train", "shakespeare-char-cpu", *common, *extra, "--out", str(folder / name)])
        if code != 0:
            raise SystemExit(f"training the {name} failed")
    return folder / "target", folder / "draft"


def generator_of(model, prompt_ids, n: int, way: dict):
    """A function decoding the prompt as `way` says -> its tokens, and its `Speculation` (or None)."""
    spec = Speculation(way["drafter"], way["k"]) if way.get("drafter") is not None else None

    def generate() -> list[int]:
        pick = sampling_picker(way["temperature"], generator=torch.Generator().manual_seed(1234))
        if spec is None:
            return [int(t) for t in generate_tokens(model, prompt_ids, n, pick, fused=way.get("fused", False))]
        fused = way.get("fused_target", False)
        return [int(t) for t in speculative_generate(model, prompt_ids, n, pick, spec, fused=fused)]

    return generate, spec


def measure(model, prompt_ids, n: int, ways: list[dict], repeats: int) -> list[dict]:
    """Each way of decoding one prompt: its median tokens/s (the ways taken in turn in each round,
    so that a load that comes and goes on the machine falls on all of them), and speculation's
    statistics over the timed runs."""
    made = [generator_of(model, prompt_ids, n, way) for way in ways]
    tokens = [generate() for generate, _ in made]  # the warm-up, and the texts compared
    times: list[list[float]] = [[] for _ in ways]
    for _ in range(repeats):
        for (generate, _), spent in zip(made, times, strict=True):
            start = time.perf_counter()
            generate()
            spent.append(time.perf_counter() - start)
    rows = []
    for way, (_, spec), spent, toks in zip(ways, made, times, tokens, strict=True):
        row = {k: v for k, v in way.items() if k not in ("drafter", "fused_target")}
        row |= {"tokens_per_s": round(len(toks) / statistics.median(spent), 1), "tokens": toks}
        if spec is not None:
            stats = spec.stats
            row |= {"tokens_per_step": round(stats.tokens_per_step, 3), "acceptance": round(stats.acceptance, 3)}
        rows.append(row)
    return rows


def ways(draft_model, fused: bool) -> list[dict]:
    plain = [{"way": "plain PyTorch", "temperature": t} for t in (0.0, 0.8)]
    plain += [{"way": "plain fused C++", "temperature": t, "fused": True} for t in (0.0, 0.8)] if fused else []
    targets = (False, True) if fused else (False,)

    def on(way: dict, fused_target: bool) -> dict:
        suffix = " on fused target" if fused_target else ""
        return way | {"way": way["way"] + suffix, "fused_target": fused_target}

    drafted = [
        on({"way": f"draft k={k}", "temperature": t, "drafter": ModelDrafter(draft_model, fused=fused), "k": k}, f)
        for f in targets
        for t in (0.0, 0.8)
        for k in (2, 4, 8)
    ]
    lookup = [
        on({"way": f"lookup k={k}", "temperature": 0.0, "drafter": PromptLookup(max_ngram=3), "k": k}, f)
        for f in targets
        for k in (4, 8)
    ]
    return plain + drafted, [w for w in plain if w["temperature"] == 0] + lookup


def compare(rows: list[dict]) -> list[dict]:
    """Speed-ups over the plain PyTorch step (`speedup`) and the plain fused step (`vs_fused`) at the
    same temperature; greedy texts checked equal."""
    for r in rows:
        plain = next(p for p in rows if p["way"] == "plain PyTorch" and p["temperature"] == r["temperature"])
        r["speedup"] = round(r["tokens_per_s"] / plain["tokens_per_s"], 2)
        fused = [p for p in rows if p["way"] == "plain fused C++" and p["temperature"] == r["temperature"]]
        if fused:
            r["vs_fused"] = round(r["tokens_per_s"] / fused[0]["tokens_per_s"], 2)
        if r["temperature"] == 0:
            r["same_text"] = r["tokens"] == plain["tokens"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=90)
    parser.add_argument("--out", help="train the two runs into this folder and keep them (default: a temporary one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.target is None or args.draft is None:
            args.target, args.draft = train_pair(Path(args.out or tmp), args.iters, args.block)
        target, draft = attnlab.load(args.target), attnlab.load(args.draft)
    from attnlab.accel.fused import by_default

    fused = by_default(target.model, "fp32")
    drafted, lookup = ways(draft.model, fused)
    results = []
    for case, prompts, case_ways in (("draft", PROMPTS, drafted), ("lookup", (EDIT_PROMPT,), lookup)):
        for prompt in prompts:
            ids = encode_prompt(target.tokenizer, prompt)
            rows = compare(measure(target.model, ids, args.tokens, case_ways, args.repeats))
            for r in rows:
                tokens = r.pop("tokens")
                results.append({"case": case, "prompt": prompt[:30]} | r)
                if r["way"] == "plain PyTorch" and r["temperature"] == 0:
                    print(f"[{case}] {prompt!r} -> {target.tokenizer.decode(tokens)[:120]!r}", file=sys.stderr)
    report(results)
    if args.json:
        sizes = {n: sum(p.numel() for p in m.model.parameters()) for n, m in (("target", target), ("draft", draft))}
        Path(args.json).write_text(json.dumps({"run": run_info(), "parameters": sizes, "rows": results}, indent=1))


def report(results: list[dict]) -> None:
    cols = ("case", "way", "temperature", "tokens_per_s", "speedup", "vs_fused", "tokens_per_step", "acceptance")
    cols += ("same_text",)
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(str(r.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
