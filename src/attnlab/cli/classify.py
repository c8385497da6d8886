"""attnlab classify RUN [TEXT ... | --input FILE] [--json]

Calls `TextClassification.classify` of the run's task (`attnlab.tasks.open_task(attnlab.load(RUN))`)."""

import argparse

from attnlab.cli import add_text_arguments
from attnlab.cli.arguments import add_json_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "classify",
        help="label sentences with a trained classifier (e.g. SST-2 sentiment)",
        description="Print the most likely label of each sentence and its probability.",
    )
    add_text_arguments(p, "text-classification")
    add_json_argument(p, "labels and probabilities")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.cli import open_task_run, print_json, read_text_arguments

    texts = read_text_arguments(args.text, args.input, "classify")
    run, task, device = open_task_run(args.run_dir, "text-classification", args.device, args.checkpoint)
    results = task.classify(run.model, texts, device)
    if args.json:
        print_json({"results": [{"text": t, **r} for t, r in zip(texts, results, strict=True)]})
    else:
        for r in results:
            print(f"{r['label']}\t{r['probabilities'][r['label']]:.3f}" if r else "")
    return 0
