"""The errors every task gives for the same two mistakes: a split it does not have, and no data folder."""

from collections.abc import Iterable, Sequence

from attnlab.errors import UserError


def unknown_split(split: str, known: Sequence[str]) -> UserError:
    """The error for a split a task does not have."""
    return UserError(f"unknown split {split!r}; choose one of {', '.join(known)}")


def check_splits(splits: Iterable[str], known: Sequence[str]) -> None:
    """Raise `unknown_split` for the first of `splits` that is not one of `known`."""
    for split in splits:
        if split not in known:
            raise unknown_split(split, known)


def need_data_dir(data_dir: str, task: str, hint: str) -> None:
    """Raise a `UserError` when a task that reads files was given no `--data-dir`. hint: what the folder holds."""
    if not data_dir:
        raise UserError(f"{task} needs its data: pass --data-dir DIR ({hint})")
