"""attnlab eval RUN|HF_FOLDER|GGUF --chat-mix DIR [--limit N] [--json]: a chat model's scores on the
instruction mix's test conversations, through its chat template (`attnlab.studies.chat_eval`)."""

import argparse
import sys
from pathlib import Path

from attnlab.errors import UserError

OTHER_FLAGS = ("split", "beam", "context", "max_tokens", "stride", "data_dir")


def run_chat_mix(args: argparse.Namespace) -> int:
    """Load the model and its template as `attnlab chat` does, reply to every test prompt greedily,
    print the scores (a table, or JSON with the replies' counts and each score's note)."""
    from attnlab.cli.chat import chat_template
    from attnlab.device import resolve_device
    from attnlab.eval.chat_scores import table
    from attnlab.studies.chat_eval import ChatModel, score_mix
    from attnlab.train.load import load_any

    given = [f"--{name.replace('_', '-')}" for name in OTHER_FLAGS if getattr(args, name) is not None]
    if given or args.data is not None:
        raise UserError(f"{', '.join(given) or '--data'}: not with --chat-mix, which scores the mix's test files")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    mix = Path(args.chat_mix)
    if not (mix / "test").is_dir():
        raise UserError(f"--chat-mix {mix} has no test/ folder; write the mix with `attnlab data chat-mix`")
    device = resolve_device(args.device)
    loaded = load_any(args.run_dir, command="eval", device=device, checkpoint=args.checkpoint)
    chat = ChatModel(loaded.model, loaded.tokenizer, chat_template(Path(args.run_dir), loaded))
    scores, _ = score_mix(chat, mix, limit=args.limit)
    if args.json:
        from attnlab.cli import print_json

        rows = [{"task": s.task, "metric": s.metric, "score": s.score, "n": s.n, "note": s.note} for s in scores]
        print_json({"model": str(args.run_dir), "chat_mix": str(mix), "limit": args.limit, "scores": rows})
    else:
        sys.stdout.write(f"{args.run_dir} on {mix / 'test'}" + (f" (first {args.limit} of each)" if args.limit else ""))
        sys.stdout.write("\n" + table(scores) + "\n")
    return 0
