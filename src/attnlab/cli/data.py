"""attnlab data list | attnlab data download NAME [--to DIR] [--mirror URL]
attnlab data chat-mix --data-dir DIR [--out OUT] [--translation N ...] [--max-chars N] [--seed S]

Calls `attnlab.data.download.download` and `attnlab.data.chat_mix.write_mix`."""

import argparse
from pathlib import Path

from attnlab.cli import non_negative_int, positive_int
from attnlab.cli.arguments import add_data_dir_argument, add_seed_argument

DEFAULT_MIX = "data/chat-mix"  # the chat-mix-pretrain and chat-mix-sft presets' data.path and data_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data",
        help="list and download the data sets the presets train on",
        description="The data sets the presets use, from their published sources: SHA-256 verified, "
        "resumed where a download was interrupted, a file appearing only once complete and verified.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(p))
    ls = verbs.add_parser("list", help="the data sets, their presets and licences")
    ls.set_defaults(run=run_list)
    dl = verbs.add_parser("download", help="download a data set into a folder")
    dl.add_argument("name", metavar="NAME", help="a data set from `attnlab data list`")
    dl.add_argument("--to", type=Path, help="the folder to write (default data/NAME)")
    dl.add_argument("--mirror", metavar="URL", help="fetch each file from URL/FILE_NAME instead of its source")
    dl.set_defaults(run=run_download)
    register_chat_mix(verbs)


def register_chat_mix(verbs: argparse._SubParsersAction) -> None:
    """`data chat-mix`: one option per field of `attnlab.data.chat_mix.MixOptions`, its default shown."""
    from attnlab.data.chat_mix import TASKS, MixOptions

    defaults = MixOptions()
    mix = verbs.add_parser(
        "chat-mix",
        help="write an instruction mix of the lectures' data sets for chat-sft",
        description="Conversations in OpenAI's fine-tuning JSONL: translate German to English (Multi30k), the "
        "sentiment of a review (SST-2), the parts of speech of a sentence (UD English EWT), continue a speech "
        "(Tiny Shakespeare), arithmetic word problems answered with the calculator tool and without it. Writes "
        "OUT/train.jsonl, OUT/val.jsonl, OUT/test/TASK.jsonl (the data sets' test splits, kept apart from "
        "training), OUT/pretrain.txt (the training texts, to pretrain on) and OUT/mix.json (options, counts).",
    )
    add_data_dir_argument(mix, "the folder holding multi30k/, sst2/, ud-english-ewt/ (and tinyshakespeare/)")
    mix.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_MIX),
        help=f"the folder to write (default {DEFAULT_MIX}, where the chat-mix presets read it)",
    )
    for task in TASKS:
        n = getattr(defaults, task)
        what = "problems, each asked with and without the tool," if task == "arithmetic" else "examples"
        mix.add_argument(
            f"--{task}", type=non_negative_int, default=n, metavar="N", help=f"{task} {what} in training (default {n})"
        )
    for name, help in (("val", "validation examples per task"), ("arithmetic_test", "arithmetic test problems")):
        n = getattr(defaults, name)
        mix.add_argument(
            f"--{name.replace('_', '-')}", type=non_negative_int, default=n, metavar="N", help=f"{help} (default {n})"
        )
    mix.add_argument(
        "--max-chars",
        type=positive_int,
        default=defaults.max_chars,
        metavar="N",
        help="leave out training and validation conversations longer than N characters "
        f"(default {defaults.max_chars}); task chat skips, with a count, any still past the context in tokens",
    )
    add_seed_argument(mix)
    mix.set_defaults(run=run_chat_mix)


def run_list(args: argparse.Namespace) -> int:
    from attnlab.data.download import DATASETS, ELSEWHERE

    for data in DATASETS.values():
        size = sum(f.size for f in data.files)
        print(f"{data.name}: {data.about}; {len(data.files)} files, {size / 1e6:.1f} MB")
        print(f"  presets: {', '.join(data.presets)}")
        print(f"  licence: {data.licence}")
    for other in ELSEWHERE.values():
        print(f"{other.name}: {other.about}; not downloaded by attnlab")
        print(f"  presets: {', '.join(other.presets)}")
        print(f"  licence: {other.licence}")
        print(f"  get it: {other.how}")
    return 0


def run_download(args: argparse.Namespace) -> int:
    from attnlab.data.download import download

    folder = args.to if args.to is not None else Path("data") / args.name
    data = download(args.name, folder, mirror=args.mirror)
    if data.name == "tinyshakespeare":  # the presets read the copy attnlab ships
        print(f"ready: attnlab train {data.presets[0]} --set data.path={folder / data.files[0].name}")
    else:
        print(f"ready: attnlab train {data.presets[0]} --data-dir {folder}")
    return 0


def run_chat_mix(args: argparse.Namespace) -> int:
    from attnlab.data.chat_mix import TASKS, MixOptions, write_mix
    from attnlab.errors import UserError

    if not args.data_dir:
        raise UserError(
            "data chat-mix needs --data-dir DIR, the folder holding the data sets (see `attnlab data list`)"
        )
    names = (*TASKS, "val", "arithmetic_test", "max_chars")
    options = MixOptions(**{n: getattr(args, n) for n in names}, seed=args.seed)
    mix = write_mix(args.data_dir, args.out, options)
    print(f"{'task':<14}{'train':>7}{'val':>6}{'test':>6}  left out (too long, in val or test)")
    for task, c in mix.counts.items():
        print(f"{task:<14}{c.train:>7}{c.val:>6}{c.test:>6}  {c.too_long}, {c.overlap}")
    print(f"wrote {len(mix.train)} training and {len(mix.val)} validation conversations, the tests and pretrain.txt")
    print(f"to {args.out}")
    default = args.out == Path(DEFAULT_MIX)  # where the presets look
    pretrain = "" if default else f" --set 'data.path=\"{args.out / 'pretrain.txt'}\"'"
    sft = "" if default else f" --data-dir {args.out}"
    print(f"ready: attnlab train chat-mix-pretrain{pretrain}, then attnlab train chat-mix-sft{sft}")
    return 0
