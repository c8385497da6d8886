"""attnlab bench [--device cpu|cuda|auto] [--json] [--quick] [--compile | --fused | --no-fused] [--repeats N]
[--weights fp32|bf16|int8|int4|q4_k] [--out FILE.json]"""

import argparse
import sys

from attnlab.cli import positive_int
from attnlab.cli.arguments import add_device_argument, add_json_argument, add_weights_argument, check_weights_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure speed and attention memory on this machine, beside transformers",
        description="Measure, on this machine and in one run, the matmul peak, training tokens/s and MFU, "
        "greedy generation tokens/s (attnlab GPT beside transformers GPT-2 of the same shape, alternating "
        "within every repeat; medians) and the peak memory of explicit versus fused attention.",
    )
    add_device_argument(p)
    p.add_argument(
        "--repeats", type=positive_int, help="repeats per case; the median is reported (default 5, 1 with --quick)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny steps and sizes: a check that every case runs, not a measurement; it still starts both "
        "libraries and runs every case: a minute or two on a 2-core CPU (105 s on a busy one)",
    )
    p.add_argument(
        "--compile", action="store_true", help="run attnlab's training forward and decoding step through torch.compile"
    )
    p.add_argument(
        "--fused",
        action=argparse.BooleanOptionalAction,
        help="run attnlab's training blocks through its C++ kernels and its decoding step as one C++ call "
        "(fp32 pre-norm GPTs on a CPU): the default on a CPU where `attnlab kernels build` has built them, as "
        "for `attnlab train` and `attnlab sample`; --fused builds them first if need be, --no-fused measures "
        "PyTorch's path",
    )
    add_weights_argument(p, by_checkpoint=False)
    add_json_argument(p, "the results")
    p.add_argument("--out", metavar="FILE.json", help="also write the results as JSON to this file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.fileio import atomic_write_text
    from attnlab.studies.bench import format_table, run_benchmarks

    device = resolve_device(args.device)
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"attnlab bench runs on cpu or cuda, not {args.device!r}; use --device cpu or cuda")
    out = Path(args.out) if args.out else None
    # Checked before measuring, not after minutes of it.
    if out is not None and not out.parent.is_dir():
        raise UserError(f"--out {out}: folder {out.parent} does not exist; create it or choose another path")

    def progress(line: str) -> None:
        sys.stderr.write(f"bench: {line}\n")
        sys.stderr.flush()

    if args.compile and args.fused:
        raise UserError("--compile and --fused are two ways to run attnlab's steps; pick one")
    if args.fused and device.type != "cpu":
        raise UserError("--fused runs attnlab's CPU kernels; use --device cpu")
    check_weights_options(args)
    if args.weights != "fp32" and device.type != "cpu":
        raise UserError(f"--weights {args.weights} is read by the fused decoding step, on the CPU; use --device cpu")
    if args.fused is None and args.weights != "fp32":  # the fused step, built first if need be
        args.fused = True
    if args.fused is None:  # the defaults' paths, which the other commands take
        from attnlab.accel import fused, kernels

        args.fused = device.type == "cpu" and not args.compile and kernels.is_built() and fused.is_built()
        if device.type == "cpu" and not args.compile:
            progress(
                "attnlab's C++ kernels: "
                + ("on (built here)" if args.fused else "off: not built here (`attnlab kernels build`, once)")
            )
    result = run_benchmarks(
        device,
        quick=args.quick,
        repeats=args.repeats,
        progress=progress,
        compile=args.compile,
        fused=args.fused,
        weights=args.weights,
    )
    if out is not None:
        atomic_write_text(out, json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
    if args.json:
        from attnlab.cli import print_json

        print_json(result.to_json())
    else:
        print(format_table(result))
    return 0
