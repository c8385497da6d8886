"""The command-line options of the benchmarks that time one of `attnlab bench`'s training cases,
and how they time two variants of its step against each other."""

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.studies import bench


def add_train_case_arguments(p: argparse.ArgumentParser, shape: str = "4x4x128", block: int = 64) -> None:
    """--shape, --block and --batch, defaulting to `shape`, `block` and the bench's batch of 12."""
    p.add_argument("--shape", default=shape, choices=sorted(bench.SHAPES))
    p.add_argument("--block", type=int, default=block)
    p.add_argument("--batch", type=int, default=12)


def add_rounds_arguments(p: argparse.ArgumentParser, rounds: int) -> None:
    """--rounds (default `rounds`) and --out, for a script that times two variants with `alternate`."""
    p.add_argument("--rounds", type=int, default=rounds, help="rounds of 10 steps, the two variants alternating")
    p.add_argument("--out", type=Path, help="write the results as JSON here")


def train_case(args: argparse.Namespace) -> bench.TrainCase:
    """The training case the options name."""
    return bench.TrainCase(args.shape, args.block, args.batch)


def alternate(steps: dict[str, Callable[[], object]], rounds: int, calls: int = 10) -> dict[str, list[float]]:
    """ms per call of each of `steps`, `calls` calls a turn, the steps taking turns in every round
    (the order reversed every other round, so that neither always follows the other), after five
    warm-up calls each (the kernels' build or load, an optimizer's state)."""
    for fn in steps.values():
        for _ in range(5):
            fn()
    ms: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            ms[name].append(1e3 * bench._seconds_per_call(steps[name], calls, torch.device("cpu")))
    return ms
