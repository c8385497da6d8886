"""attnlab tag RUN [TEXT ... | --input FILE] [--json]

Calls `TokenClassification.tag` of the run's task (`attnlab.tasks.open_task(attnlab.load(RUN))`)."""

import argparse

from attnlab.cli import add_text_arguments
from attnlab.cli.arguments import add_json_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tag",
        help="tag each word of sentences with a trained tagger (e.g. UD part of speech)",
        description="Split each sentence into words (as UD English does) and print word/TAG for each word.",
    )
    add_text_arguments(p, "token-classification")
    add_json_argument(p, "[[word, tag], ...] per sentence")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.cli import open_task_run, print_json, read_text_arguments

    texts = read_text_arguments(args.text, args.input, "tag")
    run, task, device = open_task_run(args.run_dir, "token-classification", args.device, args.checkpoint)
    tagged = task.tag(run.model, texts, device)
    if args.json:
        print_json({"sentences": [[list(p) for p in pairs] for pairs in tagged]})
    else:
        for pairs in tagged:
            print(" ".join(f"{w}/{t}" for w, t in pairs))
    return 0
