"""attnlab demo: the quick start — a small GPT trained on the bundled Tiny Shakespeare, then a sample."""

import argparse
import shlex
import sys
from pathlib import Path

from attnlab.cli import non_negative_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="train a small GPT on Tiny Shakespeare (a few minutes on a CPU) and print a sample",
        description="Train the `demo` preset on the bundled Tiny Shakespeare, then print a sample. "
        "Run it again and it resumes or reuses the finished run in --out.",
    )
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="run folder (default runs/demo)")
    p.add_argument("--prompt", default="ROMEO:", help="text to continue (default ROMEO:)")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=500, help="characters to generate (default 500)")
    p.add_argument("--seed", type=int, default=1337, help="sampling seed (default 1337)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a value of the demo preset, e.g. --set train.max_iters=300 for a quicker look (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab import load
    from attnlab.checkpoints import CONFIG, has_checkpoint
    from attnlab.config import load_preset_or_file, parse_overrides
    from attnlab.decode import complete, sampling_picker
    from attnlab.train import resolve, train
    from attnlab.train.config import apply_overrides
    from attnlab.train.signals import StopRequest

    _, doc = load_preset_or_file("demo")
    config = resolve(apply_overrides(doc, parse_overrides(args.overrides)))
    resume = (args.out / CONFIG).exists() and has_checkpoint(args.out)
    print(
        f"Training a {config.model.n_layer}-layer GPT on Tiny Shakespeare into {args.out} "
        f"({config.train.max_iters} steps{', resuming' if resume else ''}) ...",
        flush=True,
    )
    with StopRequest() as stop:  # Ctrl-C: finish the step, save; running the demo again resumes
        result = train(config, args.out, resume=resume, progress=not args.quiet, stop=stop)
    if result.stopped_by is not None:
        sys.stderr.write(
            f"attnlab demo: stopped at step {result.step} ({result.stopped_by}); checkpoint saved, "
            f"continue with: {shlex.join(['attnlab', 'demo', '--out', str(args.out), *_sets(args.overrides)])}\n"
        )
        return 0
    print(f"Done: step {result.step}, val loss {result.val_loss:.4f}, {result.elapsed_sec:.0f}s of training.\n")
    run = load(args.out)
    pick = sampling_picker(temperature=0.8, generator=torch.Generator().manual_seed(args.seed))
    print(args.prompt + complete(run.model, run.tokenizer, args.prompt, args.max_new_tokens, pick))
    print(f"\nMore: attnlab sample {args.out} --prompt 'JULIET:'   |   attnlab eval {args.out}")
    return 0


def _sets(overrides: list[str]) -> list[str]:
    return [word for kv in overrides for word in ("--set", kv)]
