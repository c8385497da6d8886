"""Configuration plumbing: TOML files and `--set key=value` overrides into frozen dataclasses.

A run's configuration is a TOML document with one table per section (`[model]`, `[data]`,
`[train]`). Each section becomes a frozen dataclass; an unknown key, a wrong type or an invalid
value is a `ConfigError` that names the key and suggests close matches.
"""

import dataclasses
import difflib
import functools
import tomllib
import types
import typing
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from attnlab.errors import ConfigError

T = TypeVar("T")


RUN_CONFIG = "config.toml"
"""The file of a run folder that holds its resolved configuration. Named here, on the torch-free
ground floor, so that `attnlab.sources` and the CLI's early checks read it too;
`attnlab.checkpoints.CONFIG` is this name."""

RUN_SECTIONS = ("model", "data", "train", "log")
"""The tables of a run's config. With `task` and `format_version` they are its top-level keys, which
`check_run_keys` checks here, without the task modules (and PyTorch), so that the CLI can refuse a
mistyped section at once."""


def check_run_keys(doc: dict[str, Any]) -> None:
    """Raise ConfigError for a top-level key of a run's config that is neither a section nor
    `task` or `format_version`: `{"modle": {...}}` -> "unknown config key 'modle' (did you mean 'model'?)"."""
    allowed = {"format_version", "task", *RUN_SECTIONS}
    for key in doc:
        if key not in allowed:
            raise ConfigError(
                f"unknown config key {key!r}{close_matches(key, allowed)}; top-level keys are {sorted(allowed)}"
            )


def presets(folder: str = "presets") -> list[str]:
    """Names of the presets shipped with attnlab (TOML files in `attnlab/presets`), or of the
    named files in another folder of the package (`"presets/ablations"`: the ablation specs)."""
    root = resources.files("attnlab").joinpath(*folder.split("/"))
    return sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml"))


def close_matches(word: str, choices: typing.Iterable[str]) -> str:
    """A ' (did you mean ...?)' hint, or '' when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(repr(m) for m in matches)}?)" if matches else ""


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None


def load_preset_or_file(name: str, folder: str = "presets", what: str = "preset") -> tuple[str, dict[str, Any]]:
    """Read a preset by exact name, or a TOML file by path. Returns `(run name, document)`.

    Presets are an exact table of names; a path is anything ending in `.toml` or naming a file, or
    a folder holding a config.toml (a run folder) that is not a preset's name.
    `folder` and `what` name another table of shipped files, e.g. ("presets/ablations", "ablation spec").
    """
    path = Path(name)
    if name.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"config file {name} does not exist")
        stem = path.parent.name if path.name == RUN_CONFIG else path.stem
        return stem, read_toml(path)
    names = presets(folder)
    if name not in names and (path / RUN_CONFIG).is_file():  # a run folder: its resolved config
        return path.name, read_toml(path / RUN_CONFIG)
    if name not in names:
        raise ConfigError(
            f"unknown {what} {name!r}{close_matches(name, names)}; "
            f"{what}s are {', '.join(names)}, or give a path to a .toml file"
        )
    text = resources.files("attnlab").joinpath(*folder.split("/"), f"{name}.toml").read_text(encoding="utf-8")
    return name, tomllib.loads(text)


def parse_overrides(items: typing.Sequence[str]) -> dict[str, Any]:
    """`["train.max_iters=10", "data.path=x.txt"]` -> `{"train": {"max_iters": 10}, "data": {"path": "x.txt"}}`.

    Values are read as TOML (`10`, `1e-3`, `true`, `"text"`, `[0.9, 0.95]`); anything that is not
    valid TOML is taken as a plain string, so `data.path=input.txt` needs no quotes.
    """
    pairs = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        pairs.append((key, value))
    return nest(pairs)


def nest(pairs: typing.Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Dotted keys to nested tables, later pairs winning:
    `[("model.n_layers", 2), ("train.seed", 1)]` -> `{"model": {"n_layers": 2}, "train": {"seed": 1}}`."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set {key}: {p} is a value, not a section")
        node[leaf] = value
    return out


def flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables to dotted keys, the inverse of `nest`:
    `{"model": {"n_layers": 2}, "task": "lm"}` -> `{"model.n_layers": 2, "task": "lm"}`."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: values in `overrides` win; nested tables merge key by key."""
    out = dict(base)
    for k, v in overrides.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _check_type(value: Any, annotation: Any, where: str) -> Any:
    """Return value converted to the annotated type (int -> float is allowed), or raise ConfigError."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        (item_type, *_rest) = typing.get_args(annotation)
        return tuple(_check_type(v, item_type, where) for v in value)
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):  # a table within the section
        return build(annotation, value, where)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, bool) or not isinstance(value, annotation):
        name = getattr(annotation, "__name__", str(annotation))
        raise ConfigError(f"{where} must be of type {name}, got {value!r} ({type(value).__name__})")
    return value


def build(cls: type[T], values: dict[str, Any], section: str) -> T:
    """Build the frozen dataclass `cls` from a TOML table, checking names, types and values."""
    if not isinstance(values, dict):
        raise ConfigError(f"[{section}] must be a table of key = value pairs")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(
                f"unknown config key {section}.{key}{close_matches(key, fields)}; "
                f"[{section}] accepts {', '.join(sorted(fields))}"
            )
        kwargs[key] = _check_type(value, hints[key], f"{section}.{key}")
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ConfigError(f"[{section}] {e}") from None


def old_field_names(table: dict[str, str]) -> typing.Callable[[type[T]], type[T]]:
    """A class decorator (above `@dataclass`): the dataclass's constructor also takes each field's
    old name in `table` (old -> today's name, e.g. `attnlab.names.OLD_FIELDS`, the table TOML files
    and `--set` are read with), with a DeprecationWarning naming today's field:
    `GPTConfig(n_layer=2)` -> `GPTConfig(n_layers=2)`. Both names at once is a TypeError."""

    def decorate(cls: type[T]) -> type[T]:
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        renames = {old: new for old, new in table.items() if new in fields and old not in fields}
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: N807 (the constructor it wraps)
            for old in [old for old in renames if old in kwargs]:  # (in the table's order: one warning each)
                new = renames[old]
                if new in kwargs:
                    raise TypeError(f"{cls.__name__}() got {old} and {new}: {old} is the old name of {new}, give one")
                warnings.warn(
                    f"{cls.__name__}({old}=...) is deprecated: the field is {new} now", DeprecationWarning, stacklevel=2
                )
                kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return decorate


def as_dict(obj: Any) -> dict[str, Any]:
    """A dataclass as a TOML-ready table: None values are left out (TOML has no null)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):  # a table within the section (train.lora)
            out[f.name] = as_dict(value)
        elif value is not None:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def dump_toml(doc: dict[str, Any]) -> str:
    return tomli_w.dumps(doc)
