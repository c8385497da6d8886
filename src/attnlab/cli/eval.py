"""attnlab eval RUN [--split NAME] [--beam N] [--context N] [--json]
attnlab eval RUN|HF_FOLDER|GGUF --data FILE [--context N] [--stride S] [--json]
attnlab eval RUN|HF_FOLDER|GGUF --chat-mix DIR [--limit N] [--json]

A run on its task's split: `attnlab.train.evaluate.evaluate_run`. Any language model on any text
(--data): `attnlab.eval.perplexity.text_perplexity`. A chat model on the instruction mix's tests
(--chat-mix): `attnlab.cli.eval_chat`."""

import argparse
from pathlib import Path

from attnlab.cli.arguments import add_checkpoint_argument, add_data_dir_argument, add_device_argument, add_json_argument
from attnlab.errors import UserError
from attnlab.families import CAUSAL_LM, names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a trained run on held-out data, or any language model's perplexity on a text",
        description="Evaluate a run on a split: loss and perplexity for language models (every block, "
        "deterministic); BLEU for translation models (sacreBLEU with its signature, and lowercased tokenized BLEU); "
        "accuracy for classification, tagging, node and image classification; bits per dimension for image density "
        "models (PixelCNN, Gated PixelCNN, pixel GPT); NLL and bits per sample for WaveNet. With --data: the "
        f"perplexity of a text file under a language-model run or a Hugging Face {names(CAUSAL_LM)} folder "
        "or GGUF file, through the strided sliding window of transformers' perplexity guide.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN",
        help="a run folder written by `attnlab train`; with --data also a Hugging Face causal-LM folder "
        "(config.json, model.safetensors, tokenizer.json) or a GGUF file",
    )
    p.add_argument(
        "--split",
        help="val or train (LM); val, test2016 or test2017 (translation); val, dev or test (classification, "
        "tagging); val or test (masked LM, node classification, images, audio); default val",
    )
    p.add_argument("--beam", type=int, help="beam size for translation (default 5)")
    p.add_argument(
        "--context",
        type=int,
        help="language models: evaluate on blocks (with --data: windows) of N tokens instead of the model's "
        "context (does the position scheme extrapolate? learned positions cannot go past their table)",
    )
    p.add_argument("--max-tokens", type=int, help="language models: only the split's first N tokens")
    p.add_argument(
        "--data",
        type=Path,
        metavar="FILE",
        help="a UTF-8 text file: its perplexity under the language model, instead of a split of the run's data",
    )
    p.add_argument(
        "--stride",
        type=int,
        help="with --data: start a window every S tokens, each scoring what the one before did not "
        "(default half the context; equal to --context, the windows do not overlap)",
    )
    p.add_argument(
        "--chat-mix",
        metavar="DIR",
        help="a chat model (a chat run, or a chat model's folder or GGUF file) on the test conversations of "
        "the instruction mix `attnlab data chat-mix` wrote to DIR: greedy replies through its chat template, "
        "scored (BLEU, sentiment accuracy, UPOS accuracy, arithmetic with the calculator and without)",
    )
    p.add_argument(
        "--limit", type=int, metavar="N", help="with --chat-mix: the first N test conversations of each task"
    )
    add_data_dir_argument(p, "the split is read from it")
    add_checkpoint_argument(p)
    add_device_argument(p)
    add_json_argument(p, "the metrics")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.sources import HF_FOLDER, PUBLISHED, what_is

    if args.chat_mix is not None:
        from attnlab.cli.eval_chat import run_chat_mix

        return run_chat_mix(args)
    if args.limit is not None:
        raise UserError("--limit goes with --chat-mix DIR (the first N test conversations of each task)")
    if args.data is not None:
        return _run_text(args)
    if args.stride is not None:
        raise UserError("--stride moves the window over a text: it goes with --data FILE")
    form = what_is(args.run_dir).form
    if form in PUBLISHED:
        what = "a Hugging Face folder" if form == HF_FOLDER else "a GGUF file"
        raise UserError(f"{args.run_dir} is {what}, which has no data split of its own: give it a text with --data")
    return _run_split(args)


def _run_split(args: argparse.Namespace) -> int:
    """A run scored on a split of its own data, with its task's metric."""
    from attnlab.device import resolve_device
    from attnlab.train.evaluate import evaluate_run

    split = args.split or "val"
    beam = 5 if args.beam is None else args.beam
    if beam < 1:
        raise UserError(f"--beam must be >= 1, got {beam}")
    run, metrics = evaluate_run(
        args.run_dir,
        split,
        device=resolve_device(args.device),
        checkpoint=args.checkpoint,
        data_dir=args.data_dir,
        beam=beam,
        context=args.context,
        max_tokens=args.max_tokens,
    )
    if args.json:
        from attnlab.cli import print_json

        extra = {flag: getattr(args, flag) for flag in ("context", "max_tokens") if getattr(args, flag) is not None}
        print_json({"run": str(run.path), "step": run.step, "split": split, **extra, **metrics})
    else:
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        print(f"{run.path} (step {run.step}), {split} split: {shown}")
    return 0


def _run_text(args: argparse.Namespace) -> int:
    """The perplexity of the text file --data under the run's or folder's language model."""
    from attnlab.data.text import read_corpus
    from attnlab.device import resolve_device
    from attnlab.eval.perplexity import text_perplexity
    from attnlab.studies.language_model import load_language_model

    split_flags = {"--split": args.split, "--beam": args.beam, "--max-tokens": args.max_tokens}
    given = [flag for flag, value in {**split_flags, "--data-dir": args.data_dir}.items() if value is not None]
    if given:
        raise UserError(
            f"{', '.join(given)}: for a split of the run's own data, not with --data FILE (which scores that file)"
        )
    if not args.data.is_file():
        raise UserError(f"--data {args.data}: no such file; give a UTF-8 text file")
    text = read_corpus(str(args.data))
    lm = load_language_model(
        args.run_dir, device=resolve_device(args.device), checkpoint=args.checkpoint, command="eval"
    )
    result = text_perplexity(lm, text, context=args.context, stride=args.stride)
    if args.json:
        from attnlab.cli import print_json

        print_json(
            {
                "model": str(lm.path),
                "data": str(args.data),
                "perplexity": result.perplexity,
                "mean_nll": result.mean_nll,
                "tokens": result.tokens,
                "windows": result.windows,
                "context": result.context,
                "stride": result.stride,
                "seconds": result.seconds,
                "tokens_per_second": result.tokens_per_second,
            }
        )
    else:
        print(
            f"{lm.path}, {args.data}: perplexity {result.perplexity:.4f} (mean NLL {result.mean_nll:.4f} nats) over "
            f"{result.tokens} tokens; context {result.context}, stride {result.stride}, {result.windows} windows; "
            f"{result.tokens_per_second:.0f} tokens/s"
        )
    return 0
