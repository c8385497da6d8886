"""benchmarks/structured_overhead.py runs: its `batcher` level on a tiny case (a 300-token BPE, 4
tokens a row, one round) prints and writes a row per batch size, every row constrained by the
benchmark's nested schema decoding all its tokens. The figures themselves are BENCHMARKS.md's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "structured_overhead.py"
pytest.importorskip("llguidance")


def test_the_batcher_level_runs_on_a_tiny_case(tmp_path):
    out = tmp_path / "rows.json"
    args = ["--level", "batcher", "--vocab", "300", "--tokens", "4", "--rounds", "1", "--json", str(out)]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    written = json.loads(out.read_text())
    assert written["level"] == "batcher" and written["rows"] == printed
    assert [r["batch"] for r in printed] == [1, 16]
    for r in printed:
        assert r["plain_tok_s"] > 0 and r["schema_tok_s"] > 0
        assert r["completion_tokens"] == {"plain": [4], "schema": [4]}  # the schema's JSON is longer
        assert r["ratio"] == pytest.approx(r["schema_tok_s"] / r["plain_tok_s"], abs=0.01)
