"""attnlab scale [--data FILE] [--sizes LxC,...] [--tokens N] [--set key=value ...] [--out DIR]
[--jobs J | --backend ray [--address ADDR]]"""

import argparse
from pathlib import Path

from attnlab.cli import positive_int
from attnlab.cli.arguments import add_backend_arguments, add_device_argument, add_json_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scale",
        help="train a ladder of GPT sizes and fit a scaling law (Kaplan et al. 2020)",
        description="Train GPTs of several sizes on the same text for the same number of tokens, fit "
        "L(N) = (N_c/N)^alpha and L(N) = E + (N_c/N)^alpha to their validation loss against non-embedding "
        "parameters N, keep the one with the smaller residual standard error, and report alpha beside Kaplan "
        "et al.'s 0.076 and the compute-optimal frontier. Writes OUT/<size>/ (run folders), OUT/scale.csv, "
        "OUT/scale_fit.json and OUT/scale.png. Resumable like `attnlab ablate`.",
    )
    p.add_argument("--data", default="", metavar="FILE", help="a UTF-8 text file (default: bundled Tiny Shakespeare)")
    # The defaults live in attnlab.studies.scaling (DEFAULT_SIZES, DEFAULT_TOKENS), which imports torch:
    # not at parser time.
    p.add_argument(
        "--sizes",
        metavar="LxC,...",
        help="the ladder: layers x width, heads of 16, e.g. 1x32,2x64,4x128 (default: 6 sizes from 1x32 "
        "to 4x128, 12k to 790k non-embedding parameters)",
    )
    p.add_argument(
        "--tokens", type=positive_int, metavar="N", help="training tokens for every size (default 6,000,000)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value of every run (repeatable), e.g. --set data.tokenizer=bpe; "
        "train.learning_rate replaces the per-size rate",
    )
    p.add_argument("--out", type=Path, default=Path("runs/scale"), help="study folder (default runs/scale)")
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        metavar="J",
        help="train J sizes at once, in J processes with cores/J torch threads each (default 1)",
    )
    add_backend_arguments(p)
    add_device_argument(p, sets_config=True)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_json_argument(p, "the fits and frontier")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from attnlab.config import flatten, parse_overrides
    from attnlab.studies.backends import make_backend
    from attnlab.studies.scaling import (
        DEFAULT_SIZES,
        DEFAULT_TOKENS,
        fit_summary,
        format_report,
        parse_sizes,
        run_scale,
    )

    backend = make_backend(args.backend, jobs=args.jobs, address=args.address)
    sizes = parse_sizes(args.sizes or DEFAULT_SIZES)
    tokens = args.tokens or DEFAULT_TOKENS
    overrides = flatten(parse_overrides(args.overrides))
    log = None if args.quiet or args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    result = run_scale(
        sizes, tokens, args.out, data=args.data, overrides=overrides, backend=backend, device=args.device, log=log
    )
    if not result.complete:
        left = sum(o.status not in ("done", "trained") for o in result.outcomes)
        sys.stderr.write(f"attnlab scale: stopped with {left} size(s) unfinished; the same command continues\n")
        return 0
    from attnlab.viz.studies import plot_scaling

    plot = plot_scaling(result, args.out / "scale.png")
    if args.json:
        from attnlab.cli import print_json

        print_json(fit_summary(result))
    else:
        print(format_report(result))
        print(f"table: {args.out / 'scale.csv'}, fit: {args.out / 'scale_fit.json'}, plot: {plot}")
    return 0
