"""attnlab eval RUN [--split NAME] [--beam N] [--context N] [--json]

Calls `attnlab.train.evaluate.evaluate_run`."""

import argparse

from attnlab.cli.arguments import add_checkpoint_argument, add_data_dir_argument, add_device_argument, add_json_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a trained run on held-out data",
        description="Evaluate a run on a split: loss and perplexity for language models (every block, "
        "deterministic); BLEU for translation models (sacreBLEU with its signature, and lowercased tokenized BLEU); "
        "accuracy for classification, tagging, node and image classification; bits per dimension for image density "
        "models (PixelCNN, Gated PixelCNN, pixel GPT); NLL and bits per sample for WaveNet.",
    )
    p.add_argument("run_dir", metavar="RUN", help="a run folder written by `attnlab train`")
    p.add_argument(
        "--split",
        default="val",
        help="val or train (LM); val, test2016 or test2017 (translation); val, dev or test (classification, "
        "tagging); val or test (masked LM, node classification, images, audio)",
    )
    p.add_argument("--beam", type=int, default=5, help="beam size for translation (default 5)")
    p.add_argument(
        "--context",
        type=int,
        help="language models: evaluate on blocks of N tokens instead of the training block_size (does "
        "the position scheme extrapolate? learned positions cannot go past their table)",
    )
    p.add_argument("--max-tokens", type=int, help="language models: only the split's first N tokens")
    add_data_dir_argument(p, "the split is read from it")
    add_checkpoint_argument(p)
    add_device_argument(p)
    add_json_argument(p, "the metrics")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.device import resolve_device
    from attnlab.errors import UserError
    from attnlab.train.evaluate import evaluate_run

    if args.beam < 1:
        raise UserError(f"--beam must be >= 1, got {args.beam}")
    run, metrics = evaluate_run(
        args.run_dir,
        args.split,
        device=resolve_device(args.device),
        checkpoint=args.checkpoint,
        data_dir=args.data_dir,
        beam=args.beam,
        context=args.context,
        max_tokens=args.max_tokens,
    )
    if args.json:
        from attnlab.cli import print_json

        extra = {flag: getattr(args, flag) for flag in ("context", "max_tokens") if getattr(args, flag) is not None}
        print_json({"run": str(run.path), "step": run.step, "split": args.split, **extra, **metrics})
    else:
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        print(f"{run.path} (step {run.step}), {args.split} split: {shown}")
    return 0
