"""attnlab cost [--lengths 64,128,...] [--width K] [--layers D] [--heads H] [--repeats N] [--passes N] [--threads N]
[--max-memory MIB] [--fit-from T] [--attention window,bigbird] [--attention-window W] [--attention-block B] [--quick]
[--out DIR] [--json]
attnlab cost --autoregressive [--json]"""

import argparse
import sys

from attnlab.cli import positive_int
from attnlab.cli.arguments import add_json_argument


def lengths_list(text: str) -> tuple[int, ...]:
    """ "64,128,256" -> (64, 128, 256); anything else is an argparse error (one line, exit 2)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, e.g. 64,128,256; got {text!r}"
        ) from None


def names_list(text: str) -> tuple[str, ...]:
    """ "window,bigbird" -> ("window", "bigbird"); the names are checked by CostSettings."""
    return tuple(part.strip() for part in text.split(","))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost",
        help="measure the lectures' cost table (RNN, RNN+attention, Transformer) on this machine",
        description="For an RNN, an RNN with attention and a Transformer of the same width and depth, measure "
        "the time and peak memory of one training step and of generating t tokens as t grows (each case in a "
        "fresh process), count sequential steps and maximum path length, and fit the exponent of t on log-log "
        "axes beside the lectures' theory. --attention adds Transformers with sparse attention patterns (window, "
        "BigBird) as extra columns. Writes cost.json and log-log plots to --out.",
    )
    p.add_argument(
        "--lengths",
        type=lengths_list,
        help="sequence lengths t, strictly increasing (default 64,128,256,512,1024; 8,16,32 with --quick)",
    )
    p.add_argument("--width", type=positive_int, help="model width k of every model (default 64; 16 with --quick)")
    p.add_argument("--layers", type=positive_int, help="layers d of every model (default 2; 1 with --quick)")
    p.add_argument("--heads", type=positive_int, help="Transformer attention heads, must divide --width (default 4)")
    p.add_argument(
        "--repeats",
        type=positive_int,
        help="timed calls per case; the output is the fastest of them (default 3; 1 with --quick)",
    )
    p.add_argument("--passes", type=positive_int, help="sweeps over all cases, the smallest reading kept (default 1)")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads of every case (default 1: the slopes, not peak speed; a busy machine stalls a pool)",
    )
    p.add_argument(
        "--max-memory",
        type=positive_int,
        metavar="MIB",
        help="skip a case whose peak, extrapolated from the previous length, would exceed this (default 4096)",
    )
    p.add_argument(
        "--fit-from", type=positive_int, metavar="T", help="fit exponents on lengths >= T (default: the larger half)"
    )
    p.add_argument(
        "--attention",
        type=names_list,
        metavar="PATTERNS",
        help="also measure a Transformer with each of these attention patterns, as extra columns: window, bigbird "
        "(default none; linformer cannot be causal)",
    )
    p.add_argument(
        "--attention-window",
        type=positive_int,
        metavar="W",
        help="keys a query of 'window' sees (default 64; 8 with --quick)",
    )
    p.add_argument(
        "--attention-block",
        type=positive_int,
        metavar="B",
        help="block length of 'bigbird' (default 32; 4 with --quick)",
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny lengths and model: checks that it runs in seconds, measures little"
    )
    p.add_argument(
        "--autoregressive",
        action="store_true",
        help="instead: count the receptive field and sequential steps (training, generation) of the image and audio "
        "presets' models (PixelCNN, Gated PixelCNN, pixel Transformer, WaveNet) beside an RNN; measures nothing",
    )
    p.add_argument("--out", metavar="DIR", help="write cost.json and the PNG plots into this folder (created)")
    add_json_argument(p, "the results")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from attnlab.errors import UserError
    from attnlab.fileio import atomic_write_text
    from attnlab.studies.cost import QUICK_LENGTHS, CostSettings, format_table, measure_cost

    if args.autoregressive:
        return _autoregressive(args)
    # --quick: patterns narrower than its lengths, so that they leave keys out as at full size.
    quick = (
        dict(lengths=QUICK_LENGTHS, width=16, layers=1, heads=2, repeats=1, attention_window=8, attention_block=4)
        if args.quick
        else {}
    )
    given = dict(
        lengths=args.lengths,
        width=args.width,
        layers=args.layers,
        heads=args.heads,
        repeats=args.repeats,
        passes=args.passes,
        fit_from=args.fit_from,
        max_memory_mib=args.max_memory,
        attention=args.attention,
        attention_window=args.attention_window,
        attention_block=args.attention_block,
    )
    try:
        settings = CostSettings(**{**quick, **{k: v for k, v in given.items() if v is not None}})
    except ValueError as e:
        raise UserError(f"{e}; see attnlab cost --help") from None
    out = Path(args.out) if args.out else None
    # Checked before minutes of measuring, not after.
    if out is not None:
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out} is a file; give a folder")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"--out {out}: cannot create the folder ({e.strerror}); choose another") from None

    result = measure_cost(settings, threads=args.threads, progress=True)
    if out is not None:
        from attnlab.viz.cost import plot_cost

        atomic_write_text(out / "cost.json", json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
        for path in plot_cost(result, out):
            sys.stderr.write(f"cost: wrote {path}\n")
    if args.json:
        from attnlab.cli import print_json

        print_json(result.to_json())
    else:
        print(format_table(result))
    return 0


def _autoregressive(args: argparse.Namespace) -> int:
    """--autoregressive: the counted table of `attnlab.studies.receptive`, alone."""
    from attnlab.errors import UserError
    from attnlab.studies.receptive import autoregressive_rows, format_rows

    measuring = [f"--{k.replace('_', '-')}" for k, v in vars(args).items() if k in MEASURING and v not in (None, False)]
    if measuring:
        raise UserError(f"--autoregressive counts and measures nothing: drop {', '.join(measuring)}")
    rows = autoregressive_rows()
    if args.json:
        from attnlab.cli import print_json

        print_json({"rows": [r.to_json() for r in rows]})
    else:
        print(format_rows(rows))
    return 0


MEASURING = (
    "lengths",
    "width",
    "layers",
    "heads",
    "repeats",
    "passes",
    "max_memory",
    "fit_from",
    "attention",
    "attention_window",
    "attention_block",
    "quick",
    "out",
)
