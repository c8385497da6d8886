"""attnlab plot RUN [--out FILE.png]

Calls `attnlab.viz.plot_run`."""

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw a run's training curves",
        description="Draw the curves of a run's metrics.csv: training and validation loss, the validation metric "
        "(BLEU, accuracy or perplexity), the learning rate and the throughput, against the step.",
    )
    p.add_argument("run_dir", metavar="RUN", help="a run folder written by `attnlab train`")
    p.add_argument("--out", type=Path, help="the PNG to write (default RUN/curves.png)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.errors import UserError
    from attnlab.viz.curves import plot_run
    from attnlab.viz.figure import png_size

    if not Path(args.run_dir).is_dir():
        raise UserError(f"run folder {args.run_dir} does not exist; give a folder written by `attnlab train`")
    path = args.out if args.out is not None else Path(args.run_dir) / "curves.png"
    plot = plot_run(args.run_dir, path)
    width, height = png_size(path)
    print(f"{', '.join(plot.panels)} saved to {path} ({width} x {height} px)")
    return 0
