"""attnlab data list | attnlab data download NAME [--to DIR] [--mirror URL]

Calls `attnlab.data.download.download`."""

import argparse
from pathlib import Path


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
