"""The command-line options of the benchmarks that time one of `attnlab bench`'s training cases."""

import argparse

from attnlab import bench


def add_train_case_arguments(p: argparse.ArgumentParser, shape: str = "4x4x128", block: int = 64) -> None:
    """--shape, --block and --batch, defaulting to `shape`, `block` and the bench's batch of 12."""
    p.add_argument("--shape", default=shape, choices=sorted(bench.SHAPES))
    p.add_argument("--block", type=int, default=block)
    p.add_argument("--batch", type=int, default=12)


def train_case(args: argparse.Namespace) -> bench.TrainCase:
    """The training case the options name."""
    return bench.TrainCase(args.shape, args.block, args.batch)
