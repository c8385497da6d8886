"""The run folder: everything needed to use or resume a model.

    config.toml          resolved configuration (TOML, with a format version)
    tokenizer.json       the tokenizer
    model.safetensors    weights (safetensors: no pickle)
    train_state.pt       optimizer, step, RNG states: tensors and plain containers only,
                         loaded with `weights_only=True`
    checkpoint.json      written last: step and SHA-256 of the two files above
    best.safetensors     the weights that scored best on the task's validation metric,
    best.json            with their step, score and SHA-256
    metrics.csv          one row per log or eval event

Every file is written atomically (temporary file, fsync, rename), so a run killed mid-write keeps
its previous file. The checksums in checkpoint.json catch weights that do not belong to it.
"""

import hashlib
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.config import read_toml
from attnlab.data.tokenizers import Tokenizer, load_tokenizer
from attnlab.errors import CheckpointError, ConfigError
from attnlab.fileio import atomic_write, atomic_write_text
from attnlab.tasks import TASKS
from attnlab.train.config import RunConfig, resolve

CHECKPOINT_FORMAT_VERSION = 1
CONFIG, WEIGHTS, TOKENIZER, TRAIN_STATE, MANIFEST = (
    "config.toml",
    "model.safetensors",
    "tokenizer.json",
    "train_state.pt",
    "checkpoint.json",
)
BEST_WEIGHTS, BEST_MANIFEST = "best.safetensors", "best.json"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_config(run_dir: Path, config: RunConfig) -> None:
    atomic_write_text(run_dir / CONFIG, config.to_toml())


def read_config(run_dir: Path) -> RunConfig:
    path = run_dir / CONFIG
    if not path.exists():
        raise CheckpointError(f"{run_dir} is not a run folder: it has no {CONFIG}")
    try:
        return resolve(read_toml(path))
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


def save_checkpoint(run_dir: Path, model: nn.Module, train_state: dict[str, Any]) -> dict[str, Any]:
    """Write weights, then training state, then the manifest that vouches for both; return the manifest."""
    atomic_write(run_dir / WEIGHTS, lambda tmp: save_model(model, str(tmp), metadata={"format": "attnlab"}))
    atomic_write(run_dir / TRAIN_STATE, lambda tmp: torch.save(train_state, tmp))
    manifest = {
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "step": train_state["step"],
        "weights_sha256": file_sha256(run_dir / WEIGHTS),
        "train_state_sha256": file_sha256(run_dir / TRAIN_STATE),
    }
    atomic_write_text(run_dir / MANIFEST, json.dumps(manifest, indent=2))
    return manifest


def save_best(run_dir: Path, manifest: dict[str, Any], record: dict[str, Any]) -> None:
    """Copy the checkpoint `manifest` describes (just written) to best.safetensors, and describe it
    in best.json with `record` (step, score) and the weights' checksum from the manifest."""
    data = (run_dir / WEIGHTS).read_bytes()
    atomic_write(run_dir / BEST_WEIGHTS, lambda tmp: tmp.write_bytes(data))
    best = {"format_version": CHECKPOINT_FORMAT_VERSION, **record, "weights_sha256": manifest["weights_sha256"]}
    atomic_write_text(run_dir / BEST_MANIFEST, json.dumps(best, indent=2))


def read_manifest(run_dir: Path, name: str = MANIFEST) -> dict[str, Any]:
    path = run_dir / name
    if not path.exists():
        raise CheckpointError(f"{run_dir} has no complete checkpoint ({name} is missing); train it first")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is unreadable ({e}); the checkpoint cannot be trusted") from None
    if manifest.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(f"{path}: unsupported checkpoint format {manifest.get('format_version')!r}")
    return manifest


def _verify(run_dir: Path, name: str, expected: str) -> None:
    path = run_dir / name
    if not path.exists():
        raise CheckpointError(f"{path} is missing; the run folder is incomplete")
    if file_sha256(path) != expected:
        raise CheckpointError(f"{path} is corrupt: its checksum does not match {MANIFEST}; restore it or retrain")


def load_weights(run_dir: Path, model: nn.Module, *, best: bool = False) -> None:
    """Load the checked weights (the last checkpoint, or the best) into `model`; strict: every
    tensor must match by name and shape."""
    weights, manifest = (BEST_WEIGHTS, BEST_MANIFEST) if best else (WEIGHTS, MANIFEST)
    _verify(run_dir, weights, read_manifest(run_dir, manifest)["weights_sha256"])
    try:
        missing, unexpected = load_model(model, str(run_dir / weights), strict=False)
    except (SafetensorError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{run_dir / weights} does not fit this model: {str(e).splitlines()[0]}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{run_dir / weights} does not fit this model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )


def load_train_state(run_dir: Path) -> dict[str, Any]:
    """The optimizer and RNG state; only tensors and plain containers are unpickled."""
    _verify(run_dir, TRAIN_STATE, read_manifest(run_dir)["train_state_sha256"])
    try:
        return torch.load(run_dir / TRAIN_STATE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{run_dir / TRAIN_STATE} holds objects other than tensors; refusing to load it ({e})"
        ) from None


@dataclass
class Run:
    """A trained run: what `attnlab.load` returns."""

    path: Path
    config: RunConfig
    tokenizer: Tokenizer
    model: nn.Module
    step: int


def load_run(path: str | Path, *, device: str | torch.device = "cpu", checkpoint: str = "best") -> Run:
    """A run folder -> its model (in eval mode), tokenizer and config.

    checkpoint: "best" (the weights that scored best on validation, when the run has them, else
    the last) or "last" (the latest checkpoint).
    """
    if checkpoint not in ("best", "last"):
        raise ValueError(f"checkpoint must be 'best' or 'last', got {checkpoint!r}")
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir} does not exist; train one with `attnlab train`")
    config = read_config(run_dir)
    best = checkpoint == "best" and (run_dir / BEST_MANIFEST).exists()
    manifest = read_manifest(run_dir, BEST_MANIFEST if best else MANIFEST)
    tokenizer = load_tokenizer(run_dir / TOKENIZER)
    model = TASKS[config.task].build_model_from_config(config.model)
    load_weights(run_dir, model, best=best)
    return Run(run_dir, config, tokenizer, model.to(device).eval(), manifest["step"])
