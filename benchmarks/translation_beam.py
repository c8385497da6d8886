"""Beam search (beam 5), attnlab versus transformers' MarianMT `generate()`, on the same trained model.

The attnlab translation run is exported to a `MarianMTModel` computing the same function
(`attnlab.models.hf.to_marian`, parity-tested), so both libraries search the same distribution and
write nearly the same translations: the comparison is of the decoders alone. Both get the same
sentences in the same batches, beam 5, length penalty 1, and stop a sentence once it has 5 finished
hypotheses (transformers `early_stopping=True`, fairseq's rule, which attnlab follows). The peers
alternate within every repeat; medians of sentences/s.

    python benchmarks/translation_beam.py runs/mt-transformer-v2 --data-dir ../shared/data/multi30k \
        --out benchmarks/results/translation-beam.json

`--fused` runs attnlab's decoder steps as one C++ call each (`beam_search(..., fused=True)`).
"""

import argparse
import json
import math
import platform
import time
from datetime import date
from pathlib import Path

import torch

from attnlab import load
from attnlab.decode.seq2seq import beam_search
from attnlab.eval.bleu import bleu
from attnlab.models.hf import to_marian
from attnlab.studies.bench import compare
from attnlab.tasks import Translation

MAX_LEN_RATIO, MAX_LEN_EXTRA = 1.5, 10  # attnlab's per-sentence limit: ceil(1.5 · source) + 10


def batches(sources: list[list[int]], size: int, pad_id: int) -> list[torch.Tensor]:
    """Consecutive groups of `size` sentences, padded on the right: `(B, S)` long each."""
    out = []
    for start in range(0, len(sources), size):
        group = sources[start : start + size]
        src = torch.full((len(group), max(len(s) for s in group)), pad_id, dtype=torch.long)
        for row, s in enumerate(group):
            src[row, : len(s)] = torch.tensor(s)
        out.append(src)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--split", default="test2016")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fused", action="store_true", help="attnlab's fused C++ decoder step (attnlab.accel.fused)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    run = load(args.run)
    data = run.config.data.__class__(**{**vars(run.config.data), "data_dir": args.data_dir})
    task = Translation(data, run.config.model, args.run, resume=True, splits=(args.split,))
    model = run.model.eval()
    marian = to_marian(model, bos_id=task.bos_id, eos_id=task.eos_id)
    sources = [list(s) for s in task.encoded[args.split].src[: args.sentences] if len(s) > 0]
    refs = [tgt for _, tgt in task.corpora[args.split].pairs[: len(sources)]]
    detok = lambda ids: task.tokenizer.decode(ids, skip_special=True).strip()  # noqa: E731

    def ours(groups: list[torch.Tensor]) -> list[list[int]]:
        out = []
        for src in groups:
            out += beam_search(
                model, src, beam_size=args.beam, bos_id=task.bos_id, eos_id=task.eos_id,
                max_len_ratio=MAX_LEN_RATIO, max_len_extra=MAX_LEN_EXTRA, fused=args.fused,
            )  # fmt: skip
        return out

    @torch.inference_mode()
    def theirs(groups: list[torch.Tensor]) -> list[list[int]]:
        out = []
        for src in groups:
            longest = int((src != task.pad_id).sum(1).max())
            ids = marian.generate(
                src,
                attention_mask=(src != task.pad_id).long(),
                num_beams=args.beam,
                do_sample=False,
                early_stopping=True,
                length_penalty=1.0,
                max_new_tokens=math.ceil(longest * MAX_LEN_RATIO) + MAX_LEN_EXTRA,
            )
            out += [[t for t in row[1:] if t not in (task.eos_id, task.pad_id)] for row in ids.tolist()]
        return out

    results = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "run": str(args.run),
        "split": args.split,
        "sentences": len(sources),
        "beam": args.beam,
        "attnlab_step": "fused" if args.fused else "eager",
        "repeats": args.repeats,
        "cases": [],
    }
    for size in args.batch:
        groups = batches(sources, size, task.pad_id)
        outputs = {"attnlab": ours(groups), "transformers": theirs(groups)}
        same = sum(a == b for a, b in zip(outputs["attnlab"], outputs["transformers"], strict=True))
        speed = compare(
            {"attnlab": lambda g=groups: ours(g), "transformers": lambda g=groups: theirs(g)},
            len(sources), 1, args.repeats, torch.device("cpu"),
        )  # fmt: skip
        case = {
            "batch": size,
            "sentences_per_sec": {k: round(v, 2) for k, v in speed.items()},
            "ratio": round(speed["attnlab"] / speed["transformers"], 2),
            "identical_translations": same,
            "bleu": {k: round(bleu([detok(x) for x in v], refs).score, 2) for k, v in outputs.items()},
        }
        results["cases"].append(case)
        print(json.dumps(case), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
