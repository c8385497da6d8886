"""attnlab eval RUN [--split val] [--json]"""

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a trained run on its held-out data",
        description="Evaluate a run on every block of a split (deterministic).",
    )
    p.add_argument("run_dir", metavar="RUN", help="a run folder written by `attnlab train`")
    p.add_argument("--split", default="val", choices=["val", "train"], help="which split (default val)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab import load
    from attnlab.device import resolve_device
    from attnlab.tasks import TASKS

    device = resolve_device(args.device)
    run = load(args.run_dir, device=device)
    task = TASKS[run.config.task](run.config.data, run.config.model, run.path, resume=True)
    metrics = task.evaluate(run.model, device, split=args.split)
    if args.json:
        from attnlab.cli import print_json

        print_json({"run": str(run.path), "step": run.step, **metrics})
    else:
        print(
            f"{run.path} (step {run.step}), {args.split} split: "
            + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        )
    return 0
