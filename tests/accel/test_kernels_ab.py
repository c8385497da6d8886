"""benchmarks/kernels_ab.py, the A/B of two builds of the training kernels: each build must run in a
process of its own (a second load of an extension module under the same name, in one process,
is the first module again)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.accel import kernels

pytestmark = [pytest.mark.slow, pytest.mark.build]

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.mark.skipif(kernels.extension() is None, reason="the kernels could not be built here")
@pytest.mark.parametrize("part", ["attention", "optimizer"])
def test_each_build_is_loaded_from_its_own_file(tmp_path, part):
    built = Path(kernels.extension().__file__)
    old, new = tmp_path / "old.so", tmp_path / "new.so"
    shutil.copy(built, old)
    shutil.copy(built, new)
    out = tmp_path / "ab.json"
    command = [sys.executable, "kernels_ab.py", str(old), str(new), "--part", part, "--pairs", "2"]
    command += ["--rounds", "1", "--calls", "1", "--out", str(out)]
    subprocess.run(command, cwd=BENCHMARKS, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["loaded"] == {"old": str(old), "new": str(new)}
    assert result["builds"]["old"]["sha256"] == result["builds"]["new"]["sha256"]
    assert result["max_abs_difference"] == 0.0  # the same build on the same inputs
    assert len(result["speedup_per_pair"]) == 2 and result["speedup"] > 0


def test_a_missing_build_is_a_one_line_error(tmp_path):
    missing = tmp_path / "none.so"
    done = subprocess.run(
        [sys.executable, "kernels_ab.py", str(missing), str(missing)],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "no file" in done.stderr and "Traceback" not in done.stderr
