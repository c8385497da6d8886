"""Run `attnlab` as a user types it, from a benchmark script: train a run (resumably) and read its
JSON. Shared by the study scripts (extrapolation.py, long_attention.py)."""

import json
import subprocess
import sys
from pathlib import Path


def attnlab(*args: str) -> subprocess.CompletedProcess:
    """`attnlab ARGS` through this interpreter's environment's command; output captured."""
    command = Path(sys.executable).with_name("attnlab")
    return subprocess.run([str(command), *args], capture_output=True, text=True)


def train_run(preset: str, run: Path, overrides: dict, *extra: str) -> dict:
    """Train `preset` with `--set key=value` overrides into `run`, or, when `run` has weights
    already, resume it (a finished run reports its last figures and trains no more); the JSON
    summary `attnlab train --json` prints. Exits with its error when training fails."""
    words = ["train", preset, "--out", str(run), "--quiet", "--json", *extra]
    for key, value in overrides.items():
        words += ["--set", f"{key}={json.dumps(value)}"]
    if (run / "model.safetensors").exists():
        words.append("--resume")
    done = attnlab(*words)
    if done.returncode != 0:
        raise SystemExit(f"training {run} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)
