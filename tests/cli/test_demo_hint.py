"""The demo's last lines name the commands to try next as the user's shell can run them: `attnlab`
where PATH finds this installation's command, else its path (`.venv/bin/attnlab` after `make demo`
in a shell that has not activated .venv), else `PYTHON -m attnlab`.

Each case is a real folder laid out as a virtual environment's bin/ (a python, an `attnlab`
script, `activate`), with this process's interpreter and PATH pointed at it."""

import os
import sys
from pathlib import Path

import pytest

from attnlab.cli.demo import _next_commands, attnlab_command


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def venv(tmp_path, monkeypatch) -> Path:
    """tmp_path/.venv/bin with python, attnlab and activate; the current folder is tmp_path and
    this process's interpreter is that python, as for `make demo` run from a clone."""
    bin_dir = tmp_path / ".venv" / "bin"
    monkeypatch.setattr(sys, "executable", str(executable(bin_dir / "python")))
    executable(bin_dir / "attnlab")
    (bin_dir / "activate").write_text("# sourced, not run\n")
    monkeypatch.chdir(tmp_path)
    return bin_dir


def test_a_shell_that_has_not_activated_the_venv_gets_the_path(venv, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert attnlab_command() == ".venv/bin/attnlab"
    lines = _next_commands(Path("runs/demo")).strip().splitlines()
    assert (
        lines[0] == "More: .venv/bin/attnlab sample runs/demo --prompt 'JULIET:'   |   .venv/bin/attnlab eval runs/demo"
    )
    assert lines[1].startswith("(Or `source .venv/bin/activate` once in a shell, then `attnlab ...`")


def test_the_folder_a_kernel_build_put_on_path_is_not_the_shells(venv, monkeypatch, tmp_path):
    """Building or loading the kernels puts the venv's bin folder in front of this process's PATH
    (for ninja); after training, the demo must still say `.venv/bin/attnlab` to a shell without it."""
    from attnlab.accel import extensions

    monkeypatch.setenv("PATH", f"{venv}{os.pathsep}{tmp_path / 'elsewhere'}")
    monkeypatch.setattr(extensions, "PATH_ADDED", str(venv))
    assert attnlab_command() == ".venv/bin/attnlab"
    monkeypatch.setattr(extensions, "PATH_ADDED", None)  # the user's own PATH had it
    assert attnlab_command() == "attnlab"


def test_an_activated_venv_gets_the_bare_command(venv, monkeypatch):
    monkeypatch.setenv("PATH", f"{venv}:/usr/bin:/bin")
    assert attnlab_command() == "attnlab"
    assert _next_commands(Path("runs/demo")).strip() == (
        "More: attnlab sample runs/demo --prompt 'JULIET:'   |   attnlab eval runs/demo"
    )


def test_another_installation_on_path_is_not_taken_for_this_one(venv, monkeypatch, tmp_path):
    other = executable(tmp_path / "other" / "attnlab").parent
    monkeypatch.setenv("PATH", str(other))
    assert attnlab_command() == ".venv/bin/attnlab"


def test_outside_the_current_folder_the_path_is_absolute(venv, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert attnlab_command() == str(venv / "attnlab")


def test_without_a_script_python_runs_the_module(venv, monkeypatch, tmp_path):
    (venv / "attnlab").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert attnlab_command() == ".venv/bin/python -m attnlab"
