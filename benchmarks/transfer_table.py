"""Do Transformer modifications transfer from a language model to translation? Our two columns
beside Narang et al. 2021's "Final loss" and "WMT EnDe", with Spearman rank correlations.

    python benchmarks/transfer_table.py runs/ablate-wikitext2 runs/ablate-multi30k \
        --data-dir data/multi30k --out transfer.md --json transfer.json

LM_STUDY is an `attnlab ablate wikitext2` folder: its ablation.csv gives each variant's final
validation loss (mean ± sd over seeds). MT_STUDY is an `attnlab ablate multi30k` folder: each of
its run folders OUT/<variant>/seed<k>/ is scored on Multi30k's test2016 (sacreBLEU, beam search,
as `attnlab eval RUN --split test2016` does) and the result kept in the run folder as
test2016.json, so that a second call decodes nothing; mean ± sd over seeds (without MT_STUDY, the
language-model column alone, beside the paper's). The rows are the
language-model study's variants in its spec's order, then the translation study's own (the rows
that exist only in an encoder–decoder); a cell is blank where a column lacks the row. Δ is each
column's difference from its own vanilla row.

Below the table: Spearman's ρ (with the number of rows both columns have) between our LM column
and the paper's final loss, our MT column and the paper's WMT EnDe BLEU, and our two columns.
Losses are negated first, so that in every pair higher is better and ρ > 0 means the two columns
rank the rows alike from best to worst.

The paper's numbers (PAPER below): Narang et al. 2021, Table 1 (every row of the table is in it;
the appendix's extra attention variants are not used). The stored copies of the paper that the
`pages` search corpus holds (arxiv-vanity, ar5iv, the SPIQA raw-TeX 2102.11972v2.txt) answered
only with the paper's opening; no excerpt of the table came back. Every number below was read in
a Markdown conversion of the paper's PDF in a public GitHub repository (search-index file id
63376893525, "Table 1: Results for all architecture variants ..."); the vanilla, RMS Norm, Rezero,
Rezero + LayerNorm, Rezero + RMS Norm and Fixup rows also agree with two independent lecture-slide
transcriptions of the table (file ids 58152443951 and 58033710442). In that conversion the Dynamic
convolution row's Ops, Step/s and Early loss cells are merged with garbage, its Final loss (2.047)
and WMT EnDe (17.03) cells are whole; the Factorized & shared embeddings row carries a garbled
second copy (its first, clean line is used). No row of Table 1 is missing.
"""

import argparse
import csv
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from attnlab.cli.arguments import checkpoint_choice
from attnlab.errors import UserError

# Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
# Applications?", Table 1: (Final loss, WMT EnDe BLEU) per row, keyed by attnlab's variant names,
# the paper's row name in the comment. Final loss: T5-base pre-training loss on C4 after 524,288
# steps (lower is better); WMT EnDe: BLEU on WMT'14 English-German, trained without pre-training.
PAPER: dict[str, tuple[float, float]] = {
    "vanilla": (1.838, 26.62),  # Vanilla Transformer
    "gelu": (1.838, 26.47),  # GeLU
    "swish": (1.847, 26.75),  # Swish
    "elu": (1.932, 26.08),  # ELU
    "glu": (1.814, 27.12),  # GLU
    "geglu": (1.792, 26.87),  # GeGLU
    "reglu": (1.803, 27.02),  # ReGLU
    "selu": (1.948, 25.99),  # SeLU
    "swiglu": (1.789, 27.02),  # SwiGLU
    "liglu": (1.798, 26.53),  # LiGLU
    "sigmoid": (1.867, 26.30),  # Sigmoid
    "softplus": (1.850, 26.89),  # Softplus
    "rmsnorm": (1.821, 27.14),  # RMS Norm
    "rezero": (1.939, 26.37),  # Rezero
    "rezero+layernorm": (1.858, 26.29),  # Rezero + LayerNorm
    "rezero+rmsnorm": (1.875, 26.19),  # Rezero + RMS Norm
    "fixup": (2.067, 26.31),  # Fixup
    "shape-24l": (1.843, 26.89),  # 24 layers, d_ff = 1536, H = 6
    "shape-18l": (1.831, 27.10),  # 18 layers, d_ff = 2048, H = 8
    "shape-8l": (1.847, 26.85),  # 8 layers, d_ff = 4608, H = 18
    "shape-6l": (1.857, 26.66),  # 6 layers, d_ff = 6144, H = 24
    "block-sharing": (2.164, 25.48),  # Block sharing
    "block-sharing+factorized": (2.183, 25.27),  # Block sharing + Factorized embeddings
    "block-sharing+factorized-shared": (2.385, 25.19),  # Block sharing + Factorized & shared embeddings
    "shared-encoder-only": (1.929, 26.23),  # Encoder only block sharing
    "shared-decoder-only": (2.082, 26.08),  # Decoder only block sharing
    "factorized-untied": (1.855, 26.50),  # Factorized Embedding
    "factorized-embeddings": (1.952, 26.44),  # Factorized & shared embeddings
    "tied-encoder-decoder-inputs": (1.840, 26.49),  # Tied encoder/decoder input embeddings
    "tied-decoder-input-output": (1.827, 26.67),  # Tied decoder input and output embeddings
    "untied-embeddings": (1.834, 26.48),  # Untied embeddings
    "adaptive-input": (1.899, 26.66),  # Adaptive input embeddings
    "adaptive-softmax": (1.982, 25.56),  # Adaptive softmax
    "adaptive-softmax-unprojected": (1.914, 25.72),  # Adaptive softmax without projection
    "mos": (1.821, 26.82),  # Mixture of softmaxes
    "transparent-attention": (1.874, 26.80),  # Transparent attention
    "dynamic-conv": (2.047, 17.03),  # Dynamic convolution
    "lightweight-conv": (1.989, 24.73),  # Lightweight convolution
    "evolved": (1.863, 26.58),  # Evolved Transformer
    "synthesizer-dense": (1.962, 26.63),  # Synthesizer (dense)
    "synthesizer-dense+": (1.840, 26.71),  # Synthesizer (dense plus)
    "synthesizer-dense+alpha": (1.828, 26.61),  # Synthesizer (dense plus alpha)
    "synthesizer-factorized": (1.968, 26.42),  # Synthesizer (factorized)
    "synthesizer-random": (2.009, 26.44),  # Synthesizer (random)
    "synthesizer-random+": (1.842, 26.43),  # Synthesizer (random plus)
    "synthesizer-random+alpha": (1.828, 26.39),  # Synthesizer (random plus alpha)
    "universal": (2.053, 23.91),  # Universal Transformer
    "moe-top2": (1.785, 26.94),  # Mixture of experts
    "switch": (1.758, 26.81),  # Switch Transformer
    "funnel": (1.918, 23.20),  # Funnel Transformer
    "weighted-transformer": (1.989, 26.30),  # Weighted Transformer
    "product-key-memory": (1.798, 26.73),  # Product key memory
}

BASELINE = "vanilla"
SPLIT = "test2016"
CACHE_FILE = f"{SPLIT}.json"


@dataclass(frozen=True)
class Stat:
    """A column's value for one variant: mean and sample sd over its seeds (sd nan for one seed)."""

    mean: float
    sd: float
    seeds: int


@dataclass(frozen=True)
class Row:
    """One line of the table; None where a column lacks the variant."""

    variant: str
    lm: Stat | None
    lm_delta: float | None
    mt: Stat | None
    mt_delta: float | None
    paper_loss: float | None
    paper_bleu: float | None


@dataclass(frozen=True)
class Correlation:
    label: str
    rho: float
    n: int


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span: [10, 20, 20, 5] -> [2, 3.5, 3.5, 1]."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            out[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (ties averaged). nan for fewer than two
    pairs or a column whose values are all equal (its ranks have no spread)."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs columns of one length, got {len(xs)} and {len(ys)}")
    if len(xs) < 2:
        return math.nan
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def read_ablation(study: Path, what: str) -> dict[str, dict[str, str]]:
    """The rows of STUDY/ablation.csv by variant, in the file's (the spec's) order."""
    path = study / "ablation.csv"
    if not path.is_file():
        raise UserError(
            f"{what} {study} has no ablation.csv: give the folder `attnlab ablate` wrote (its --out), "
            "after every run has finished"
        )
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = {"variant", "final_loss", "final_loss_sd", "seeds"} - set(rows[0] if rows else {})
    if missing:
        raise UserError(f"{path} is not an `attnlab ablate` table: it lacks the column(s) {', '.join(sorted(missing))}")
    by_variant = {r["variant"]: r for r in rows}
    if BASELINE not in by_variant:
        raise UserError(f"{path} has no {BASELINE!r} row, the baseline every Δ is measured against; run it too")
    return by_variant


def lm_column(study: Path) -> dict[str, Stat]:
    """The language-model column: each variant's final validation loss from ablation.csv."""
    rows = read_ablation(study, "LM_STUDY")
    return {v: Stat(float(r["final_loss"]), float(r["final_loss_sd"]), int(r["seeds"])) for v, r in rows.items()}


def cached_bleu(run_dir: Path, key: dict) -> float | None:
    """The BLEU kept in RUN/test2016.json when it was measured the way `key` says, else None."""
    path = run_dir / CACHE_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record["bleu"] if {k: record.get(k) for k in key} == key and "bleu" in record else None


def trained_to(run_dir: Path) -> int | None:
    """The last evaluated step in metrics.csv: a run trained further (or anew) scores anew."""
    from attnlab.studies.sweep import eval_rows

    if not (run_dir / "metrics.csv").is_file():
        return None
    rows = eval_rows(run_dir)
    return int(rows[-1]["step"]) if rows else None


def score_run(
    run_dir: Path, *, data_dir: str | None, beam: int, checkpoint: str | int, device: str
) -> tuple[float, bool]:
    """(test2016 BLEU, whether it came from the cache) of one translation run folder."""
    key = {"split": SPLIT, "beam": beam, "checkpoint": checkpoint, "trained_to": trained_to(run_dir)}
    cached = cached_bleu(run_dir, key)
    if cached is not None:
        return cached, True
    from attnlab.device import resolve_device
    from attnlab.fileio import atomic_write_text
    from attnlab.train.evaluate import evaluate_run

    run, metrics = evaluate_run(
        run_dir, SPLIT, device=resolve_device(device), checkpoint=checkpoint, data_dir=data_dir, beam=beam
    )
    record = key | {"step": run.step, **metrics}
    atomic_write_text(run_dir / CACHE_FILE, json.dumps(record, indent=1) + "\n")
    return metrics["bleu"], False


def run_folders(study: Path) -> dict[str, list[Path]]:
    """MT_STUDY's run folders by variant (OUT/<variant>/seed<k>/ for the seeds ablation.csv counts),
    every one checked before any is decoded."""
    folders = {}
    for variant, row in read_ablation(study, "MT_STUDY").items():
        folders[variant] = [study / variant / f"seed{k}" for k in range(int(row["seeds"]))]
        for run_dir in folders[variant]:
            if not run_dir.is_dir():
                raise UserError(f"{run_dir} does not exist, though {study}/ablation.csv lists {variant!r} with it")
    return folders


def mt_column(folders: dict[str, list[Path]], log: Callable[[str], object], **scoring) -> dict[str, Stat]:
    """The translation column: each variant's run folders scored on test2016, mean ± sd over seeds.
    `scoring`: score_run's data_dir, beam, checkpoint and device."""
    column = {}
    for variant, run_dirs in folders.items():
        scores = []
        for run_dir in run_dirs:
            bleu, cached = score_run(run_dir, **scoring)
            kept = " (kept from an earlier call)" if cached else ""
            log(f"{variant}/{run_dir.name}: {SPLIT} BLEU {bleu:.2f}{kept}")
            scores.append(bleu)
        sd = statistics.stdev(scores) if len(scores) > 1 else math.nan
        column[variant] = Stat(statistics.fmean(scores), sd, len(scores))
    return column


def build_rows(lm: dict[str, Stat], mt: dict[str, Stat]) -> list[Row]:
    """The table's lines: the LM study's variants in order, then the MT study's own."""
    names = list(lm) + [v for v in mt if v not in lm]
    rows = []
    for name in names:
        a, b = lm.get(name), mt.get(name)
        paper = PAPER.get(name)
        rows.append(
            Row(
                name,
                a,
                None if a is None else a.mean - lm[BASELINE].mean,
                b,
                None if b is None else b.mean - mt[BASELINE].mean,
                None if paper is None else paper[0],
                None if paper is None else paper[1],
            )
        )
    return rows


def _lm(r: Row) -> float | None:
    return None if r.lm is None else -r.lm.mean


def _mt(r: Row) -> float | None:
    return None if r.mt is None else r.mt.mean


def _paper_loss(r: Row) -> float | None:
    return None if r.paper_loss is None else -r.paper_loss


def _paper_bleu(r: Row) -> float | None:
    return r.paper_bleu


def _pair(
    rows: Sequence[Row], label: str, x: Callable[[Row], float | None], y: Callable[[Row], float | None]
) -> Correlation:
    both = [(x(r), y(r)) for r in rows if x(r) is not None and y(r) is not None]
    return Correlation(label, spearman([a for a, _ in both], [b for _, b in both]), len(both))


def correlations(rows: Sequence[Row]) -> list[Correlation]:
    """Spearman's ρ of the three pairs, each on the rows both its columns have, losses negated so
    that higher is better in every column."""
    return [
        _pair(rows, "ours LM (WikiText-2 final loss) vs paper final loss", _lm, _paper_loss),
        _pair(rows, f"ours MT (Multi30k {SPLIT} BLEU) vs paper WMT EnDe BLEU", _mt, _paper_bleu),
        _pair(rows, "ours LM vs ours MT", _lm, _mt),
    ]


def _cell(stat: Stat | None, delta: float | None, digits: int) -> str:
    if stat is None or delta is None:
        return ""
    sd = "" if math.isnan(stat.sd) else f" ± {stat.sd:.{digits}f}"
    return f"{stat.mean:.{digits}f}{sd} ({delta:+.{digits}f})"


def markdown(rows: Sequence[Row], corrs: Sequence[Correlation]) -> str:
    """The table and the correlations as Markdown."""
    lines = [
        f"| variant | LM final loss (Δ vs {BASELINE}) | MT {SPLIT} BLEU (Δ vs {BASELINE}) | paper final loss "
        "| paper WMT EnDe BLEU |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        paper_loss = "" if r.paper_loss is None else f"{r.paper_loss:.3f}"
        paper_bleu = "" if r.paper_bleu is None else f"{r.paper_bleu:.2f}"
        lm, mt = _cell(r.lm, r.lm_delta, 3), _cell(r.mt, r.mt_delta, 2)
        lines.append(f"| {r.variant} | {lm} | {mt} | {paper_loss} | {paper_bleu} |")
    lines += ["", "Spearman's ρ (losses negated: ρ > 0 means both columns rank the rows alike, best to worst):", ""]
    for c in corrs:
        rho = "n/a" if math.isnan(c.rho) else f"{c.rho:+.2f}"
        lines.append(f"- {c.label}: ρ = {rho} (n = {c.n})")
    return "\n".join(lines) + "\n"


def _no_nan(value):
    """`value` with every nan (a single seed's sd, a ρ without spread) as None: JSON has no nan."""
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def _log(line: str) -> None:
    print(line, file=sys.stderr)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="transfer_table", description=__doc__.splitlines()[0])
    p.add_argument("lm_study", type=Path, metavar="LM_STUDY", help="an `attnlab ablate wikitext2` folder")
    p.add_argument(
        "mt_study",
        type=Path,
        nargs="?",
        metavar="MT_STUDY",
        help="an `attnlab ablate multi30k` folder (without it: the language-model column alone)",
    )
    p.add_argument("--data-dir", help="the Multi30k folder, where the runs' own data.data_dir is not it")
    p.add_argument("--beam", type=int, default=5, help="beam size of the test decoding (default 5)")
    p.add_argument(
        "--checkpoint",
        type=checkpoint_choice,
        default="best",
        help="which weights: best, last or a step (default best)",
    )
    p.add_argument("--device", default="auto", help="where to decode: auto, cpu, cuda (default auto)")
    p.add_argument("--out", type=Path, help="also write the Markdown to this file")
    p.add_argument("--json", type=Path, help="write the rows and correlations as JSON to this file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        lm = lm_column(args.lm_study)
        folders = {} if args.mt_study is None else run_folders(args.mt_study)  # bad input before any decoding
        scoring = {"data_dir": args.data_dir, "beam": args.beam, "checkpoint": args.checkpoint, "device": args.device}
        mt = mt_column(folders, _log, **scoring)
    except UserError as e:
        print(f"transfer_table: error: {e}", file=sys.stderr)
        return 2
    rows = build_rows(lm, mt)
    corrs = correlations(rows)
    text = markdown(rows, corrs)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    if args.json:
        doc = {"split": SPLIT, "rows": [asdict(r) for r in rows], "correlations": [asdict(c) for c in corrs]}
        args.json.write_text(json.dumps(_no_nan(doc), indent=1, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
