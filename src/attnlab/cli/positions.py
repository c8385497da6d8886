"""attnlab positions [--d-model D] [--n N] [--out FILE.png]"""

import argparse
from pathlib import Path

from attnlab.cli import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "positions",
        help="draw the sinusoidal positional encodings",
        description="Draw the sinusoidal position table of 'Attention Is All You Need' (§3.5) as a heatmap, beside "
        "the dot product PE[p] · PE[p + k] against the offset k for a few positions p: one curve, whatever p.",
    )
    p.add_argument("--d-model", type=positive_int, default=128, help="model width, the table's columns (default 128)")
    p.add_argument("--n", type=positive_int, default=100, help="positions, the table's rows (default 100)")
    p.add_argument("--out", type=Path, default=Path("positions.png"), help="the PNG to write (default positions.png)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.errors import UserError
    from attnlab.viz.positions import plot_positions

    if args.d_model < 2 or args.n < 2:
        raise UserError(f"--d-model and --n must be >= 2, got {args.d_model} and {args.n}")
    plot = plot_positions(args.d_model, args.n, args.out)
    width, height = plot.size
    print(f"sinusoidal positions ({args.n} x {args.d_model}) saved to {plot.path} ({width} x {height} px)")
    return 0
