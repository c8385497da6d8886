"""What a path given as a checkpoint is, and the one line every command says about a path it cannot
take: read without PyTorch, so that the command line refuses bad input before importing it.

`what_is(path)` tells apart an attnlab run folder (config.toml), a Hugging Face folder (config.json,
whose `model_type` names its family in `attnlab.families`), a GGUF file (by its magic, b"GGUF", not
its name) and anything else; `refusal(source, command)` is what `attnlab COMMAND` says about a path
it cannot take (what the path is, and what to do), `refuse` raises it. What passes is loaded by
`attnlab.tasks.sources.load_checkpoint`.

It sits on the ground floor, beside the families' table, because `attnlab.tasks`' package imports
PyTorch (the task registry) and the command line reads this first.

GGUF: llama.cpp's gguf.h (`gguf_type`) and its docs/gguf.md for the header read here.
"""

import dataclasses
import difflib
import json
import struct
from pathlib import Path
from typing import BinaryIO

import attnlab.families as families
from attnlab.config import RUN_CONFIG
from attnlab.errors import CheckpointError
from attnlab.families import CAUSAL_LM, ENCODER, Family

RUN, HF_FOLDER, GGUF = "run", "hf-folder", "gguf"
"""The checkpoints attnlab reads: a run folder, a Hugging Face folder, a GGUF file."""
PUBLISHED = (HF_FOLDER, GGUF)
"""The checkpoints that are not runs: a model alone, with no task, data split or training."""
MISSING, OTHER_FILE, OTHER_FOLDER = "missing", "file", "folder"
"""The paths it cannot read: nothing there, a file of another kind, a folder holding no checkpoint."""

HF_CONFIG = "config.json"
GGUF_MAGIC = b"GGUF"

# The kinds of checkpoint (`attnlab.families`' kinds) each command takes besides run folders; a
# command not named here takes run folders only (translate, classify, tag, plot, report, export).
TAKES: dict[str, tuple[str, ...]] = {
    "sample": (CAUSAL_LM,),
    "chat": (CAUSAL_LM,),
    "eval": (CAUSAL_LM,),
    "attention": (CAUSAL_LM, ENCODER),
    "embed": (ENCODER,),
    "serve": (CAUSAL_LM, ENCODER),
    "train --init-from": (CAUSAL_LM, ENCODER),
}
KIND_WORDS = {CAUSAL_LM: "a causal language model", ENCODER: "an encoder"}


@dataclasses.dataclass(frozen=True)
class SourceKind:
    """What `what_is` found at a path."""

    path: Path
    form: str
    """RUN, HF_FOLDER or GGUF; MISSING, OTHER_FILE or OTHER_FOLDER."""
    model_type: object = None
    """config.json's `model_type` (a Hugging Face folder) or `general.architecture` (a GGUF file)."""
    family: Family | None = None
    """The row of `attnlab.families` that `model_type` names; None for a run and for a type attnlab
    does not build."""
    near: Path | None = None
    """MISSING: the sibling whose name is close to the one given ("lama" beside "llama")."""
    readable: bool = True
    """False for a config.json that is not a JSON object: the loader says what is wrong with it."""
    holds_runs: bool = False
    """OTHER_FOLDER: run folders one or two levels down (a study of `attnlab ablate`, `scale`)."""

    @property
    def kind(self) -> str | None:
        """The family's kind (`attnlab.families.CAUSAL_LM`, `ENCODER`); None without a family."""
        return self.family.kind if self.family is not None else None


def what_is(path: str | Path) -> SourceKind:
    """What `path` is, read from its first bytes or its config, never its weights.
    Example: a folder holding config.json with model_type "llama" -> HF_FOLDER, family Llama."""
    path = Path(path)
    if path.is_dir():
        if (path / RUN_CONFIG).is_file():  # a run folder may hold an exported config.json too
            return SourceKind(path, RUN)
        if (path / HF_CONFIG).is_file():
            return _hf_folder(path)
        return SourceKind(path, OTHER_FOLDER, holds_runs=_holds_runs(path))
    if path.is_file():
        if _first_bytes(path, len(GGUF_MAGIC)) != GGUF_MAGIC:
            return SourceKind(path, OTHER_FILE)
        architecture = gguf_architecture(path)
        return SourceKind(path, GGUF, architecture, families.by_gguf_architecture(architecture))
    return SourceKind(path, MISSING, near=_near(path))


def _hf_folder(path: Path) -> SourceKind:
    try:
        config = json.loads((path / HF_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        config = None
    if not isinstance(config, dict):
        return SourceKind(path, HF_FOLDER, readable=False)
    model_type = config.get("model_type")
    return SourceKind(path, HF_FOLDER, model_type, families.by_model_type(model_type))


def _holds_runs(folder: Path) -> bool:
    """Whether run folders sit one or two levels down (`attnlab.checkpoints.runs_inside`'s depths)."""
    return any(next(folder.glob("*/" * level + RUN_CONFIG), None) for level in (1, 2))


def _first_bytes(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _near(path: Path) -> Path | None:
    """A sibling of `path` with a close name, for a "did you mean"; None when there is none."""
    try:
        names = [p.name for p in path.parent.iterdir()] if path.parent.is_dir() else []
    except OSError:
        names = []
    # 0.7, the command line's cutoff for options too: at difflib's 0.6 unrelated short names match.
    match = difflib.get_close_matches(path.name, names, n=1, cutoff=0.7)
    return path.with_name(match[0]) if match else None


# -- GGUF: the header's metadata, read as far as general.architecture -----------------------------
# gguf_type -> the size in bytes of a scalar value; 8 is a string, 9 an array.
GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGUF_STRING, GGUF_ARRAY = 8, 9
GGUF_KEYS_READ = 64  # llama.cpp writes general.* first; past this many keys, the file has none


def gguf_architecture(path: str | Path) -> str | None:
    """The `general.architecture` of the GGUF file at `path` (version 2 or 3), read from its
    header without reading a tensor; None where the header is not one or has no such key."""
    try:
        with open(path, "rb") as f:
            magic, version, _, n_keys = struct.unpack("<4sIQQ", f.read(24))
            if magic != GGUF_MAGIC or version < 2:  # version 1 wrote 32-bit lengths
                return None
            for _ in range(min(n_keys, GGUF_KEYS_READ)):
                key, (value_type,) = _gguf_string(f), struct.unpack("<I", f.read(4))
                if key == "general.architecture" and value_type == GGUF_STRING:
                    return _gguf_string(f)
                _skip_gguf_value(f, value_type)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return None  # a truncated or foreign header: the GGUF reader names what is wrong
    return None


def _gguf_string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", f.read(8))
    return f.read(length).decode("utf-8")


def _skip_gguf_value(f: BinaryIO, value_type: int) -> None:
    if value_type in GGUF_SCALAR_SIZES:
        f.seek(GGUF_SCALAR_SIZES[value_type], 1)
    elif value_type == GGUF_STRING:
        f.seek(struct.unpack("<Q", f.read(8))[0], 1)
    elif value_type == GGUF_ARRAY:
        item_type, count = struct.unpack("<IQ", f.read(12))
        if item_type in GGUF_SCALAR_SIZES:
            f.seek(GGUF_SCALAR_SIZES[item_type] * count, 1)
        else:
            for _ in range(count):
                _skip_gguf_value(f, item_type)
    else:
        raise ValueError(f"unknown GGUF value type {value_type}")


# -- the one refusal --------------------------------------------------------------------------------
def refuse(path: str | Path, command: str, kinds: tuple[str, ...] | None = None) -> SourceKind:
    """`what_is(path)` when `attnlab COMMAND` takes it, else a `CheckpointError` with `refusal`'s line."""
    source = what_is(path)
    line = refusal(source, command, kinds)
    if line is not None:
        raise CheckpointError(line)
    return source


def refusal(source: SourceKind, command: str, kinds: tuple[str, ...] | None = None) -> str | None:
    """The one line `attnlab COMMAND` says about `source`: what it is and what to do; None when the
    command takes it (a Python function is named as it is: command "attnlab.load"). kinds: the
    families' kinds the command takes (default `TAKES[command]`; a task's --init-from takes one).
    A run of the wrong task is the command's to refuse, once its config is read
    (`attnlab.cli.kinds.require_kind`).
    Example: "runs/lama does not exist: no such folder or file (did you mean runs/llama?); ..."."""
    kinds = TAKES.get(command, ()) if kinds is None else kinds
    who = command if command.startswith("attnlab.") else f"attnlab {command}"  # a function: "attnlab.load"
    takes = f"{who} takes {takes_words(kinds)}"
    path, form = source.path, source.form
    if form == MISSING:
        near = f" (did you mean {source.near}?)" if source.near is not None else ""
        return f"{path} does not exist: no such folder or file{near}; {takes}"
    if form == OTHER_FILE:
        return f"{path} is a file but not a checkpoint (a GGUF file starts with {GGUF_MAGIC.decode()}); {takes}"
    if form == OTHER_FOLDER and not source.holds_runs and not kinds:
        return f"{path} is not a run folder: it has no {RUN_CONFIG}; {takes}"
    if form == OTHER_FOLDER and not source.holds_runs:
        return (
            f"{path} is not a checkpoint: a folder with neither {RUN_CONFIG} (an attnlab run) nor {HF_CONFIG} "
            f"(a Hugging Face checkpoint) in it; {takes}"
        )
    if form in (RUN, OTHER_FOLDER) or (kinds and not source.readable) or (form == GGUF and source.model_type is None):
        # The loader names what is wrong: the runs in a study folder, an unreadable config.json, a
        # GGUF header cut short or corrupt (the GGUF reader says where).
        return None
    if source.family is None and source.readable:
        key = "config.json's model_type" if form == HF_FOLDER else "its general.architecture"
        builds = f"it builds {families.names()}"
        return f"{path}: {key} is {source.model_type!r}, a family attnlab does not build ({builds}); {takes}"
    if source.kind in kinds:
        return None
    return f"{path} is {_described(source)}, which {who} does not take; {takes}{_uses(source, command)}"


def takes_words(kinds: tuple[str, ...]) -> str:
    """What a command taking `kinds` takes, in words: "a run folder written by attnlab train, a
    Hugging Face folder of F1 or F2 (config.json's model_type t1, t2) or a GGUF file of F1"."""
    chosen = [f for f in families.FAMILIES if f.kind in kinds]
    parts = ["a run folder written by attnlab train"]
    if chosen:
        types = ", ".join(t for f in chosen for t in f.model_types)
        parts.append(f"a Hugging Face folder of {listed([f.name for f in chosen])} (config.json's model_type {types})")
    if gguf := [f.name for f in chosen if f.gguf_architectures]:
        parts.append(f"a GGUF file of {listed(gguf)}")
    return listed(parts)


def listed(words: list[str]) -> str:
    """Words as a sentence's list, as `attnlab.families.names` writes the families of one kind:
    ["a", "b", "c"] -> "a, b or c" (here for any selection: two kinds, the families with GGUF files)."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _described(source: SourceKind) -> str:
    """'a Hugging Face BERT folder (config.json's model_type is 'bert': an encoder)'."""
    family = source.family
    if source.form == GGUF:
        where, key = "a GGUF file of", "general.architecture"
    else:
        where, key = "a Hugging Face", "config.json's model_type"
    if family is None:  # an unreadable config.json, given to a command for run folders only
        return f"{where} checkpoint"
    name = f"{where} {family.name}" + (" folder" if source.form == HF_FOLDER else "")
    return f"{name} ({key} is {source.model_type!r}: {KIND_WORDS[family.kind]})"


def _uses(source: SourceKind, command: str) -> str:
    """'; use it with attnlab embed, attnlab serve' for the commands that take `source`'s kind."""
    fits = [c for c, kinds in TAKES.items() if source.kind in kinds and c != command]
    return "; use it with " + ", ".join(f"attnlab {c}" for c in fits) if fits else ""
