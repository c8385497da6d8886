"""`attnlab kernels build` says what it is doing before it compiles (minutes, which `make demo`
otherwise spends in silence), on stderr so that `--json` stays JSON; with everything built, or for
`status`, it says nothing more than before.

A real build takes minutes (tests/cli/test_kernels_cli.py runs one), so here each extension's
`is_built` and `extension` are stand-ins that record the order of events: the notice must come
before the first build starts."""

import json
import sys
from importlib import import_module

import pytest

from attnlab.cli.kernels import KERNELS
from helpers import cli

pytestmark = pytest.mark.slow

NOTICE = "building attnlab's C++ kernels for this CPU"


@pytest.fixture
def extensions(monkeypatch):
    """Every extension not built; building one records the stderr written so far and 'fails'."""
    events = []
    for name in KERNELS.values():
        module = import_module(name)
        monkeypatch.setattr(module, "is_built", lambda: False)
        monkeypatch.setattr(module, "extension", lambda: events.append(sys.stderr.getvalue()))
    return events


def test_the_notice_comes_before_the_build(extensions, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Recorder())
    code, out, _ = cli(capsys, "kernels", "build", "--json")
    assert code == 1  # the stand-ins build nothing
    assert set(json.loads(out)) == set(KERNELS)  # stdout is the JSON alone
    assert len(extensions) == len(KERNELS)
    assert all(NOTICE in seen for seen in extensions)  # written before each build began
    assert "training kernels, fused decoding step, WaveNet generation step" in extensions[0]


def test_nothing_to_build_no_notice(capsys, monkeypatch):
    for name in KERNELS.values():
        module = import_module(name)
        monkeypatch.setattr(module, "is_built", lambda: True)
        monkeypatch.setattr(module, "extension", lambda: object())
    code, out, err = cli(capsys, "kernels", "build")
    assert code == 0 and NOTICE not in err
    assert out.count("already built") == len(KERNELS)


def test_status_builds_nothing_and_gives_no_notice(extensions, capsys):
    code, out, err = cli(capsys, "kernels", "status")
    assert code == 0 and NOTICE not in err and extensions == []
    assert out.count("not built (attnlab kernels build)") == len(KERNELS)


class _Recorder:
    """A stderr that keeps what is written, readable while the command runs."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def getvalue(self) -> str:
        return "".join(self.parts)
