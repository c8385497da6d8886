"""attnlab positions [--kind KIND] [--d-model D] [--n N] [--heads H] [--shift D] [--max-distance K] [--out FILE.png]

Calls `attnlab.viz.positions.draw_positions`."""

import argparse
from pathlib import Path

from attnlab.cli import positive_int
from attnlab.names import DRAWN_SCHEMES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "positions",
        help=f"draw a position scheme: {', '.join(DRAWN_SCHEMES[:-1])} or {DRAWN_SCHEMES[-1]}",
        description="Draw a position scheme as two panels: what it is, and what attention sees of it against the "
        "offset between a query and a key. sinusoidal: the §3.5 table and PE[p] · PE[p + k] (one curve, whatever p); "
        "fourier: the lecture's basis and the scores of a query whose W_Q is the shift matrix R(d); rope: the "
        "rotation angles and the rotated dot products; alibi: each head's linear bias; relative: which of Shaw et "
        "al.'s clipped offset vectors each (query, key) pair reads.",
    )
    p.add_argument("--kind", default="sinusoidal", help=f"one of {', '.join(DRAWN_SCHEMES)} (default sinusoidal)")
    p.add_argument("--d-model", type=positive_int, default=None, help="width (default 128; 64 for fourier and rope)")
    p.add_argument("--n", type=positive_int, default=None, help="positions drawn (default 100; 64 but sinusoidal)")
    p.add_argument("--heads", type=positive_int, default=8, help="alibi: the number of heads (default 8)")
    p.add_argument("--shift", type=positive_int, default=3, help="fourier: the shift d of R(d) (default 3)")
    p.add_argument("--max-distance", type=positive_int, default=8, help="relative: the clipping k (default 8)")
    p.add_argument("--out", type=Path, default=Path("positions.png"), help="the PNG to write (default positions.png)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.viz.positions import PositionsPlot, draw_positions

    plot = draw_positions(
        args.kind,
        args.out,
        d_model=args.d_model,
        n_positions=args.n,
        n_heads=args.heads,
        shift=args.shift,
        max_distance=args.max_distance,
    )
    width, height = plot.size
    if isinstance(plot, PositionsPlot):
        n, d_model = plot.table.shape
        print(f"sinusoidal positions ({n} x {d_model}) saved to {plot.path} ({width} x {height} px)")
    else:
        print(f"{args.kind} positions ({plot.n_positions} positions) saved to {plot.path} ({width} x {height} px)")
    return 0
