"""The files of a run folder and its checkpoints, written crash-safely and read back checked.

The one module for a run folder's files: it imports nothing above the ground floor, so every
layer may read a checkpoint. What the files mean is said above it: the config by
`attnlab.train.config` (`read_config`, `write_config`), the model by `attnlab.tasks.trained`, the
training state by `attnlab.train.checkpointer`, and a run loaded for use by `attnlab.train.load`
(`load_run`, what `attnlab.load` returns).

    config.toml          resolved configuration (TOML, with a format version)
    tokenizer.json       the tokenizer
    checkpoints/step-000500/    one complete checkpoint per save; the newest train.keep_last are kept
        model.safetensors    weights (safetensors: no pickle)
        train_state.pt       optimizer, step, RNG states: tensors and plain containers only,
                             loaded with `weights_only=True`
        checkpoint.json      written last: step, SHA-256 of the two files above, and the record of
                             the best checkpoint so far
        (a LoRA run's model.safetensors holds what trains alone: the adapters, a new head; its
        checkpoint.json the base's path and weights_sha256, under "base")
    model.safetensors, train_state.pt, checkpoint.json
                         the newest checkpoint again, at the top of the folder for the commands and
                         for tools that read the files directly (hard links: no extra disk space)
    best.safetensors     the weights that scored best on the task's validation metric,
    best.json            with their step, score and SHA-256
    metrics.csv          one row per log or eval event

Crash safety: a checkpoint is written into a staging folder (each file fsynced, its manifest last),
which one atomic rename turns into checkpoints/step-N. Only then are the top-level copies replaced,
one by one and each atomically, with their manifests (best.json, checkpoint.json) last. So a
process killed at any moment leaves at least one complete checkpoint, and the loader knows which is
newest: the newest complete step folder, whose files are read from the top level when
checkpoint.json there names the same step (else the top level was being replaced when the process
died, and the step folder is read instead). Every file is checked against its SHA-256 before it is
loaded, and a mismatch is an error, never a silent fallback. Folders written before checkpoints/
existed (format 1: the top-level files only) are read as before.
"""

import hashlib
import json
import os
import pickle
import re
import shutil
import sys
import time
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_file, save_model
from torch import nn

from attnlab.config import RUN_CONFIG, read_toml
from attnlab.errors import CheckpointError
from attnlab.fileio import atomic_link, atomic_write, atomic_write_text, fsync_dir

CHECKPOINT_FORMAT_VERSION = 2
"""2: step folders under checkpoints/ and the best record in each manifest; 1 (top level only) is still read."""
CONFIG, WEIGHTS, TOKENIZER, TRAIN_STATE, MANIFEST = (
    RUN_CONFIG,  # (named on the ground floor, where the torch-free modules read it)
    "model.safetensors",
    "tokenizer.json",
    "train_state.pt",
    "checkpoint.json",
)
BEST_WEIGHTS, BEST_MANIFEST = "best.safetensors", "best.json"
CHECKPOINTS = "checkpoints"
PAUSE_HOOK = "ATTNLAB_TEST_CHECKPOINT_PAUSE"
"""Test hook, not a feature: "PHASE@STEP" (PHASE one of staging, best, publish) makes the writer of
that step's checkpoint announce itself on stderr and sleep at that point of the write, so that a
test can SIGKILL it there. See `_pause_for_tests`."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def weights_sha256(source: Path) -> str:
    """One SHA-256 for the weights a fine-tuning run starts from (its base), to record and to check
    on resume: of the file itself, or for a folder (a Hugging Face checkpoint or an attnlab run) of
    the sorted names and hashes of the weight files at its top level, so that any changed,
    added or removed weight file changes it. Optimizer state (`train_state.pt`) is not weights."""
    if source.is_file():
        return file_sha256(source)
    files = sorted(p for p in source.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.name != "train_state.pt")
    if not files:
        raise FileNotFoundError(f"{source}: no weight files (*.safetensors, *.bin) in it")
    h = hashlib.sha256()
    for path in files:
        h.update(f"{path.name}:{file_sha256(path)}\n".encode())
    return h.hexdigest()


def step_dir(run_dir: Path, step: int) -> Path:
    """checkpoints/step-000120: the folder of the checkpoint saved after `step` optimizer steps."""
    return run_dir / CHECKPOINTS / f"step-{step:06d}"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: the folder holding its weights and training state, and its manifest."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        return self.manifest["step"]


def save_checkpoint(
    run_dir: Path,
    model: nn.Module,
    train_state: dict[str, Any],
    *,
    best: dict[str, Any] | None = None,
    keep_last: int = 2,
    frozen: Collection[str] = (),
    base: dict[str, str] | None = None,
) -> Checkpoint:
    """Write checkpoints/step-N (N = train_state["step"]) as one atomic unit, then publish it at
    the top of `run_dir` and prune the step folders to the newest `keep_last`.

    best: the record of these weights ({"step": N, metric: value}) when they are the new best on
    validation; otherwise the previous best record is carried over.
    frozen, base: a LoRA run's state-dict names that its base holds, left out of the weights file,
    and the base's record ({"path", "weights_sha256"}), kept in the manifest.
    """
    step = train_state["step"]
    staging = run_dir / CHECKPOINTS / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # left by an earlier crash of this pid
    staging.mkdir(parents=True)
    atomic_write(staging / WEIGHTS, lambda tmp: _save_weights(model, tmp, frozen))
    atomic_write(staging / TRAIN_STATE, lambda tmp: torch.save(train_state, tmp))
    _pause_for_tests("staging", step)
    weights_sha = file_sha256(staging / WEIGHTS)
    manifest = {
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "step": step,
        "weights_sha256": weights_sha,
        "train_state_sha256": file_sha256(staging / TRAIN_STATE),
        "best": {**best, "weights_sha256": weights_sha} if best is not None else _best_record(run_dir),
        **({"base": base} if base is not None else {}),
    }
    atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=2))
    final = step_dir(run_dir, step)
    if final.exists():  # only a folder from a run that went further before; it is being redone
        shutil.rmtree(final)
    os.replace(staging, final)
    fsync_dir(final.parent)
    checkpoint = Checkpoint(final, manifest)
    publish(run_dir, checkpoint)
    prune(run_dir, keep_last)
    return checkpoint


def _save_weights(model: nn.Module, path: Path, frozen: Collection[str]) -> None:
    """The model's weights as safetensors, less the `frozen` state-dict entries (a LoRA base's)."""
    if not frozen:
        save_model(model, str(path), metadata={"format": "attnlab"})
        return
    # Copies: save_file refuses tensors that share memory, and these few are small.
    # A tied weight (a GPT's embedding and head) once, under its first name, as save_model keeps one.
    tensors, seen = {}, set()
    for k, v in model.state_dict().items():
        if k not in frozen and not (v.numel() and v.data_ptr() in seen):
            tensors[k] = v.detach().clone().contiguous()
            seen.add(v.data_ptr())
    save_file(tensors, str(path), metadata={"format": "attnlab", "holds": "trainable"})


def publish(run_dir: Path, checkpoint: Checkpoint) -> None:
    """Make the top-level files (best.*, then model.safetensors, train_state.pt, checkpoint.json)
    those of `checkpoint`, a complete step folder; each manifest is replaced after its files."""
    record = checkpoint.manifest["best"]
    if record is not None and not _best_on_top_is(run_dir, record):
        atomic_link(step_dir(run_dir, record["step"]) / WEIGHTS, run_dir / BEST_WEIGHTS)
        _pause_for_tests("best", checkpoint.step)
        atomic_write_text(
            run_dir / BEST_MANIFEST, json.dumps({"format_version": CHECKPOINT_FORMAT_VERSION, **record}, indent=2)
        )
    atomic_link(checkpoint.folder / WEIGHTS, run_dir / WEIGHTS)
    _pause_for_tests("publish", checkpoint.step)
    atomic_link(checkpoint.folder / TRAIN_STATE, run_dir / TRAIN_STATE)
    atomic_write_text(run_dir / MANIFEST, json.dumps(checkpoint.manifest, indent=2))


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step folders, and staging folders left by crashes."""
    for step in complete_steps(run_dir)[:-keep_last]:
        shutil.rmtree(step_dir(run_dir, step))
    for staging in (run_dir / CHECKPOINTS).glob(".staging-*"):
        shutil.rmtree(staging, ignore_errors=True)


def complete_steps(run_dir: Path) -> list[int]:
    """The steps of the step folders that hold a manifest, oldest first."""
    steps = []
    for folder in (run_dir / CHECKPOINTS).glob("step-*"):
        match = re.fullmatch(r"step-(\d+)", folder.name)
        if match and (folder / MANIFEST).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_checkpoint(run_dir: Path) -> Checkpoint:
    """The newest complete checkpoint: the top level when its checkpoint.json is as new as the
    newest complete step folder (or there is none: a format-1 folder), else that step folder."""
    top = read_manifest(run_dir) if (run_dir / MANIFEST).exists() else None
    steps = complete_steps(run_dir)
    if steps and (top is None or steps[-1] > top["step"]):
        folder = step_dir(run_dir, steps[-1])
        return Checkpoint(folder, read_manifest(folder))
    if top is None:
        raise CheckpointError(f"{run_dir} has no complete checkpoint ({MANIFEST} is missing); train it first")
    return Checkpoint(run_dir, top)


def runs_inside(folder: Path, *, depth: int = 2) -> list[Path]:
    """The run folders (those with a config.toml) up to `depth` levels inside `folder`, sorted: what
    a study folder holds (`attnlab ablate`: OUT/VARIANT/seedK; `attnlab scale`: OUT/LxC)."""
    found = [p.parent for level in range(1, depth + 1) for p in folder.glob("*/" * level + CONFIG)]
    return sorted(found)


def read_config_toml(run_dir: Path) -> dict[str, Any]:
    """A run folder's config.toml as a TOML document, its sections not yet checked: the one reader
    of a run's config (`attnlab.train.config.read_config` builds the whole `RunConfig` from it,
    `attnlab.tasks.trained.saved_model_config` the model alone). A folder without one is a
    `CheckpointError`, which names the runs inside a study folder; unreadable TOML a `ConfigError`."""
    if (run_dir / CONFIG).exists():
        return read_toml(run_dir / CONFIG)
    runs = runs_inside(run_dir) if run_dir.is_dir() else []
    if runs:  # an ablation or scaling study: the runs are one or two levels down
        shown = ", ".join(str(r) for r in runs[:3]) + (", ..." if len(runs) > 3 else "")
        raise CheckpointError(
            f"{run_dir} is not a run folder but holds {len(runs)} runs ({shown}), as `attnlab ablate` and "
            "`attnlab scale` write them; pass one of them"
        )
    raise CheckpointError(f"{run_dir} is not a run folder: it has no {CONFIG}")


def has_checkpoint(run_dir: Path) -> bool:
    """Whether `run_dir` holds a complete checkpoint to resume from."""
    return (run_dir / MANIFEST).exists() or bool(complete_steps(run_dir))


def read_manifest(folder: Path, name: str = MANIFEST) -> dict[str, Any]:
    path = folder / name
    if not path.exists():
        raise CheckpointError(f"{folder} has no complete checkpoint ({name} is missing); train it first")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is unreadable ({e}); the checkpoint cannot be trusted") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") not in (1, CHECKPOINT_FORMAT_VERSION):
        found = manifest.get("format_version") if isinstance(manifest, dict) else manifest
        raise CheckpointError(f"{path}: unsupported checkpoint format {found!r}")
    if not isinstance(manifest.get("step"), int):
        raise CheckpointError(f"{path} has no integer step; the checkpoint cannot be trusted")
    return manifest


def _best_record(run_dir: Path) -> dict[str, Any] | None:
    """The best checkpoint's record as of the newest checkpoint (None when there is no best)."""
    try:
        manifest = latest_checkpoint(run_dir).manifest
    except CheckpointError:
        return None  # a new run: nothing saved yet
    if "best" in manifest:
        return manifest["best"]
    # Format 1 kept the record in best.json alone.
    if not (run_dir / BEST_MANIFEST).exists():
        return None
    return {k: v for k, v in read_manifest(run_dir, BEST_MANIFEST).items() if k != "format_version"}


def _best_on_top_is(run_dir: Path, record: dict[str, Any]) -> bool:
    if not (run_dir / BEST_MANIFEST).exists():
        return False
    on_top = read_manifest(run_dir, BEST_MANIFEST)
    return on_top["step"] == record["step"] and on_top.get("weights_sha256") == record["weights_sha256"]


@dataclass(frozen=True)
class _Weights:
    path: Path
    sha256: str
    step: int


def _weights(run_dir: Path, *, best: bool) -> _Weights | None:
    """Which weights file to load and the checksum it must have; None for best when there is none."""
    latest = latest_checkpoint(run_dir)
    if not best:
        return _Weights(latest.folder / WEIGHTS, latest.manifest["weights_sha256"], latest.step)
    if "best" not in latest.manifest:  # format 1
        if not (run_dir / BEST_MANIFEST).exists():
            return None
        record = read_manifest(run_dir, BEST_MANIFEST)
        return _Weights(run_dir / BEST_WEIGHTS, record["weights_sha256"], record["step"])
    record = latest.manifest["best"]
    if record is None:
        return None
    if _best_on_top_is(run_dir, record):
        return _Weights(run_dir / BEST_WEIGHTS, record["weights_sha256"], record["step"])
    # best.json is behind: the process died while replacing it, just after saving that step.
    return _Weights(step_dir(run_dir, record["step"]) / WEIGHTS, record["weights_sha256"], record["step"])


def step_weights(run_dir: Path) -> dict[int, _Weights]:
    """Every step whose weights a run folder holds, oldest first, with where they are: the step
    folders, else the top level's checkpoint (all a format-1 folder has) or the best weights (kept
    when their step folder has been pruned)."""
    found = {}
    for step in complete_steps(run_dir):
        try:
            manifest = read_manifest(step_dir(run_dir, step))
        except CheckpointError:
            continue
        found[step] = _Weights(step_dir(run_dir, step) / WEIGHTS, manifest["weights_sha256"], step)
    for weights in (_weights_if_any(run_dir, best=True), _weights_if_any(run_dir, best=False)):
        if weights is not None:
            found.setdefault(weights.step, weights)
    return dict(sorted(found.items()))


def _weights_if_any(run_dir: Path, *, best: bool) -> _Weights | None:
    """`_weights`, or None where the folder has no readable checkpoint."""
    try:
        return _weights(run_dir, best=best) if has_checkpoint(run_dir) else None
    except CheckpointError:
        return None


def intact_steps(run_dir: Path) -> list[int]:
    """The steps of the step folders whose weights match their manifest's SHA-256 (reads each)."""
    return [
        step
        for step, w in step_weights(run_dir).items()
        if w.path.parent.name.startswith("step-") and w.path.is_file() and file_sha256(w.path) == w.sha256
    ]


def _weights_at(run_dir: Path, step: int) -> _Weights:
    """The weights of checkpoint `step`; one line naming the steps there are when it is not one."""
    found = step_weights(run_dir)
    if step in found:
        return found[step]
    if not found:
        latest_checkpoint(run_dir)  # raises: the folder has no checkpoint at all
    best = _weights_if_any(run_dir, best=True)
    raise CheckpointError(
        f"{run_dir} has no checkpoint at step {step}; its checkpoints are at step{'s' * (len(found) > 1)} "
        f"{', '.join(map(str, found))}{f' (best: {best.step})' if best else ''}"
    )


def _verify(path: Path, expected: str) -> None:
    if not path.exists():
        raise CheckpointError(f"{path} is missing; the run folder is incomplete")
    if file_sha256(path) != expected:
        raise CheckpointError(
            f"{path} is corrupt: its SHA-256 does not match the one recorded in the checkpoint's manifest"
        )


def _verify_or_point_elsewhere(run_dir: Path, weights: _Weights) -> None:
    """`_verify`, with the intact step checkpoints named in the error and how to load one."""
    try:
        _verify(weights.path, weights.sha256)
    except CheckpointError as e:
        others = intact_steps(run_dir)  # the file that failed is not among them (a hard link fails with it)
        if not others:
            raise CheckpointError(f"{e}; no intact checkpoint is left beside it: restore it or retrain") from None
        steps = ", ".join(map(str, others))
        raise CheckpointError(
            f"{e}; intact checkpoints beside it: step{'s' * (len(others) > 1)} {steps} (load one with "
            f"--checkpoint {others[-1]}, or attnlab.load(RUN, checkpoint={others[-1]})), or restore the file"
        ) from None


def load_weights(
    run_dir: Path, model: nn.Module, *, best: bool = False, step: int | None = None, frozen: Collection[str] = ()
) -> int:
    """Load the checked weights (the newest checkpoint, the best, or those of checkpoint `step`)
    into `model` and return their step; strict: every tensor must match by name and shape, but
    for the `frozen` names (a LoRA base's, in `model` already), which the file may lack. A
    corrupt or missing file is a `CheckpointError` naming the intact step checkpoints."""
    if step is not None:
        weights = _weights_at(run_dir, step)
        _verify(weights.path, weights.sha256)
    else:
        weights = _weights(run_dir, best=best) or _weights(run_dir, best=False)
        _verify_or_point_elsewhere(run_dir, weights)
    try:
        missing, unexpected = load_model(model, str(weights.path), strict=False)
    except (SafetensorError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{weights.path} does not fit this model: {str(e).splitlines()[0]}") from None
    missing = [name for name in missing if name not in frozen]
    if missing or unexpected:
        raise CheckpointError(
            f"{weights.path} does not fit this model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return weights.step


def load_train_state(run_dir: Path) -> dict[str, Any]:
    """The newest checkpoint's optimizer and RNG state; only tensors and plain containers are
    unpickled (a file that holds anything else is refused, and none of its code runs)."""
    latest = latest_checkpoint(run_dir)
    path = latest.folder / TRAIN_STATE
    _verify(path, latest.manifest["train_state_sha256"])
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning would only precede the refusal
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"unsupported GLOBAL (\S+)", str(e))
        raise CheckpointError(
            f"{path} holds pickled objects other than tensors and plain containers"
            + (f" ({found.group(1)})" if found else "")
            + "; refusing to load it (never load it with weights_only=False): restore the run folder "
            "from a trusted copy or retrain"
        ) from None


def _pause_for_tests(phase: str, step: int) -> None:
    """The PAUSE_HOOK test hook: sleep at this point of a checkpoint write when asked to."""
    if os.environ.get(PAUSE_HOOK) == f"{phase}@{step}":
        sys.stderr.write(f"attnlab: test hook: paused in the {phase} phase of the step-{step} checkpoint\n")
        sys.stderr.flush()
        time.sleep(60)
