"""attnlab report RUN [--out report.html] [--text TEXT]

Calls `attnlab.viz.write_report`."""

import argparse
from pathlib import Path

from attnlab.cli import positive_int
from attnlab.cli.arguments import add_checkpoint_argument, add_device_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write one HTML page about a trained run",
        description="Write one self-contained HTML page about a run: its configuration, training curves, "
        "a sample (language models), translations of validation sentences beside their references (translation), "
        "validation accuracy and predictions (classification, tagging), and its attention maps.",
    )
    p.add_argument("run_dir", metavar="RUN", help="a run folder written by `attnlab train`")
    p.add_argument("--out", type=Path, help="the page to write (default RUN/report.html)")
    p.add_argument("--text", help="text of the attention view (default the first example shown)")
    p.add_argument("--examples", type=positive_int, default=4, help="sentences translated or classified (default 4)")
    add_checkpoint_argument(p)
    add_device_argument(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from attnlab.device import resolve_device
    from attnlab.viz.report import write_report

    path = args.out if args.out is not None else Path(args.run_dir) / "report.html"
    report = write_report(
        args.run_dir,
        path,
        text=args.text,
        n_examples=args.examples,
        device=resolve_device(args.device),
        checkpoint=args.checkpoint,
    )
    for message in report.notes:
        sys.stderr.write(f"attnlab report: warning: section left out: {message}\n")
    print(f"report ({', '.join(report.sections)}) saved to {report.path}")
    return 0
