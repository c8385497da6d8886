"""scripts/gpu_check.py checks itself on the CPU (not marked `cuda`: it runs in every suite): two
small presets for two steps, one whose data is missing, a failing one, the table and the JSON. CUDA
is hidden from its processes, so the CUDA tests it runs skip, quickly, on any machine."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.config import presets

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
FIXTURES = ROOT / "tests" / "fixtures"


def gpu_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    report = tmp_path / "gpu-check.json"
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--steps", "2", "--json", str(report), *args]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, json.loads(report.read_text()) if report.exists() else None


def test_the_check_trains_each_preset_asked_for_and_reports_it(tmp_path):
    names = "shakespeare-char-cpu,cora-gat,wikitext2-mlm"  # the fixtures have no wikitext-2/ folder
    proc, report = gpu_check(tmp_path, "--presets", names, "--data-dir", str(FIXTURES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["ok"] and report["device"] == "cpu" and report["steps"] == 2
    # Hidden CUDA: the CUDA tests ran and skipped, every one.
    assert report["tests"]["ok"] and report["tests"]["passed"] == 0 and report["tests"]["skipped"] > 10
    runs = {r["preset"]: r for r in report["presets"]}
    assert list(runs) == names.split(",")
    # Two steps from a uniform start: the loss is still near ln(classes) (65 characters, 3 classes).
    for preset, classes, unit in (("shakespeare-char-cpu", 65, "tokens/s"), ("cora-gat", 3, "nodes/s")):
        run = runs[preset]
        assert run["status"] == "ok" and run["steps"] == 2 and run["unit"] == unit, run
        assert math.isfinite(run["final_loss"]) and abs(run["final_loss"] - math.log(classes)) < 0.3, run
        assert run["throughput"] > 0 and run["seconds"] >= run["train_seconds"] > 0
    assert runs["wikitext2-mlm"]["status"] == "skipped"
    assert runs["wikitext2-mlm"]["error"] == f"its data is missing: {FIXTURES / 'wikitext-2'}"
    table = proc.stdout.splitlines()
    assert any(line.startswith("GAT") and "cora-gat" in line and line.endswith("ok float32") for line in table)
    assert any("wikitext2-mlm" in line and "skipped: its data is missing" in line for line in table)


def test_a_failing_preset_is_one_line_and_fails_the_check(tmp_path):
    proc, report = gpu_check(
        tmp_path, "--presets", "cora-gat", "--data-dir", str(FIXTURES), "--skip-tests", "--set", "train.dtype=float16"
    )
    assert proc.returncode == 1 and not report["ok"] and report["tests"] is None
    (run,) = report["presets"]
    assert run["status"] == "failed" and "\n" not in run["error"]
    assert run["error"].startswith("attnlab train: error: train.dtype = 'float16' needs a CUDA GPU")


@pytest.mark.parametrize(
    "args, message",
    [
        (("--device", "cuda"), "gpu_check: --device cuda, but torch"),
        (("--presets", "shakespeare-chars"), "gpu_check: unknown preset(s) shakespeare-chars; the table has"),
    ],
    ids=["no-gpu", "unknown-preset"],
)
def test_a_check_that_cannot_run_says_why_in_one_line(tmp_path, args, message):
    proc, report = gpu_check(tmp_path, *args)
    assert proc.returncode == 2 and report is None
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(message), proc.stderr


def test_the_checks_table_holds_every_shipped_preset():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    listed = [preset for _, preset, _ in script.FAMILIES + script.MORE]
    assert sorted(listed) == presets()  # a new preset goes into MORE, with its data folder
