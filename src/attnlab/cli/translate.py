"""attnlab translate RUN [TEXT ...] [--input FILE] [--beam N] [--fused | --no-fused] [--attention out.png]

Calls `Translation.translate_ids` of the run's task (`attnlab.tasks.open_task(attnlab.load(RUN))`); --attention
also `attnlab.viz.attention.draw_alignment`."""

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.cli.arguments import add_checkpoint_argument, add_device_argument, add_json_argument

if TYPE_CHECKING:
    from attnlab.accel.plan import DecodePlan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate sentences with a trained translation model",
        description="Translate the TEXT arguments, or every line of --input (one line in, one line out; "
        "an empty line gives an empty line).",
    )
    p.add_argument("run_dir", metavar="RUN", help="a translation run folder written by `attnlab train`")
    p.add_argument("text", nargs="*", metavar="TEXT", help="sentences to translate")
    p.add_argument("--input", type=Path, help="a UTF-8 file with one sentence per line ('-' for stdin)")
    p.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy (default 5)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="score / length^p (default 1.0)")
    p.add_argument("--max-len-ratio", type=float, default=1.5, help="output length limit per source token")
    p.add_argument(
        "--fused",
        action=argparse.BooleanOptionalAction,
        help="run each decoder step as one C++ call (fp32 Transformer models on a CPU): the default where "
        "`attnlab kernels build` has built it; --fused builds it first if need be (~1 minute), --no-fused "
        "keeps PyTorch's path",
    )
    p.add_argument("--attention", type=Path, metavar="PNG", help="save the first sentence's alignment heatmap")
    add_checkpoint_argument(p)
    add_device_argument(p)
    add_json_argument(p, '{"translations": [...]}')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab import load
    from attnlab.accel.plan import plan_decoding
    from attnlab.cli import read_text_arguments
    from attnlab.cli.kinds import require_kind
    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.tasks import open_task

    if args.beam < 1:
        raise UserError(f"--beam must be >= 1, got {args.beam}")
    lines = read_text_arguments(args.text, args.input, "translate")
    device = resolve_device(args.device)
    run = load(args.run_dir, device=device, checkpoint=args.checkpoint)
    require_kind(args.run_dir, run.config, "translate")
    task = open_task(run)
    # decided once, here (no flag: the C++ step where it is built and covers the model)
    plan = plan_decoding(run.model, fused=args.fused)
    sources, cut = task.encode_sources(lines)
    if cut:
        sys.stderr.write(
            f"attnlab translate: warning: {cut} input line(s) longer than {task.data_config.max_len} tokens "
            "were cut to fit the model\n"
        )
    outputs = task.translate_ids(run.model, sources, device, beam=args.beam, **_search_options(args, plan))
    if args.attention is not None:
        from attnlab.viz.attention import draw_alignment

        path = draw_alignment(
            task, run.model, sources[0], args.attention, device, beam=args.beam, **_search_options(args, plan)
        )
        sys.stderr.write(f"alignment saved to {path}\n")
    if args.json:
        from attnlab.cli import print_json

        print_json({"translations": outputs})
    else:
        for line in outputs:
            print(line)
    return 0


def _search_options(args: argparse.Namespace, plan: "DecodePlan") -> dict:
    """The beam search settings the command line sets, besides the beam size, with the decoding plan."""
    return dict(length_penalty=args.length_penalty, max_len_ratio=args.max_len_ratio, plan=plan)
