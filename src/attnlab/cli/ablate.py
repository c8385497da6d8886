"""attnlab ablate SPEC [--variants A,B,...] [--seeds N] [--out DIR] [--jobs J | --backend ray [--address ADDR]]
[--data-dir DIR] [--device D] [--quiet] [--json]"""

import argparse
from pathlib import Path

from attnlab.cli import positive_int
from attnlab.cli.arguments import (
    add_backend_arguments,
    add_data_dir_argument,
    add_device_argument,
    add_json_argument,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ablate",
        help="train model variants alike and compare them (Narang et al. 2021's table)",
        description="Train every variant of an ablation spec with the same data, steps, batch and schedule, "
        "S seeds each, and print the table: params, FLOPs per token (counted on a training step), steps/s, "
        "early loss (at 1/4 of training), final loss (mean ± sd over seeds) and the downstream metric. Writes "
        "OUT/<variant>/seed<k>/ (ordinary run folders), OUT/ablation.csv and OUT/ablation.png. Resumable: "
        "finished runs are kept, stopped ones continue from their checkpoint.",
    )
    p.add_argument("spec", metavar="SPEC", help="a shipped spec name (shakespeare-char, wikitext2) or a .toml file")
    p.add_argument(
        "--variants",
        metavar="A,B,...",
        help="train and tabulate these variants of the spec alone (comma-separated names; the study "
        "folder keeps the others' runs)",
    )
    p.add_argument("--seeds", type=positive_int, metavar="N", help="seeds per variant (default: the spec's, else 3)")
    p.add_argument("--out", type=Path, help="study folder (default runs/ablate-<spec name>)")
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        metavar="J",
        help="train J runs at once, in J processes with cores/J torch threads each (default 1)",
    )
    add_backend_arguments(p)
    add_data_dir_argument(p, "for a language model, the folder its data.path is read from")
    add_device_argument(p, sets_config=True)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_json_argument(p, "the table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import sys

    from attnlab.studies.ablation import format_table, load_spec, run_ablation, select_variants
    from attnlab.studies.backends import make_backend

    spec = load_spec(args.spec)
    if args.variants is not None:
        spec = select_variants(spec, [name.strip() for name in args.variants.split(",") if name.strip()])
    backend = make_backend(args.backend, jobs=args.jobs, address=args.address)
    out = args.out if args.out is not None else Path("runs") / f"ablate-{spec.name}"
    log = None if args.quiet or args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    result = run_ablation(
        spec, out, seeds=args.seeds, backend=backend, data_dir=args.data_dir, device=args.device, log=log
    )
    if not result.complete:
        left = sum(o.status not in ("done", "trained") for o in result.outcomes)
        sys.stderr.write(f"attnlab ablate: stopped with {left} run(s) unfinished; the same command continues\n")
        return 0
    from attnlab.viz.studies import plot_ablation_curves

    plot = plot_ablation_curves(result.curves, out / "ablation.png", title=f"{spec.name}: validation loss")
    if args.json:
        from attnlab.cli import print_json

        print_json({"rows": [dataclasses.asdict(r) for r in result.rows], "csv": str(out / "ablation.csv")})
    else:
        print(format_table(result))
        print(f"table: {out / 'ablation.csv'}, curves: {plot}")
    return 0
