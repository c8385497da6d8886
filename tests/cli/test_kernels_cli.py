"""`attnlab kernels build|status`: what make runs at installation, so that the defaults find the
C++ kernels built; a build that cannot be done is one line and PyTorch's path, not a failure."""

import json
import warnings

import pytest

from attnlab.accel import fused, kernels, wavenet
from attnlab.accel.extensions import build_folder
from helpers import cli

pytestmark = pytest.mark.slow


def test_status_says_what_is_built_without_building(capsys, monkeypatch):
    monkeypatch.setattr(kernels, "is_built", lambda: True)
    monkeypatch.setattr(fused, "is_built", lambda: False)
    monkeypatch.setattr(wavenet, "is_built", lambda: True)
    for module in (kernels, fused, wavenet):
        monkeypatch.setattr(module, "extension", lambda: pytest.fail("status must not build"))
    where = {m: str(build_folder(m.NAME, m.SOURCE)) for m in (kernels, fused, wavenet)}
    code, out, _ = cli(capsys, "kernels", "status", "--json")
    assert code == 0
    assert json.loads(out) == {
        "training kernels": {"built": True, "folder": where[kernels]},
        "fused decoding step": {"built": False, "folder": where[fused]},
        "WaveNet generation step": {"built": True, "folder": where[wavenet]},
    }
    code, out, _ = cli(capsys, "kernels", "status")
    assert out.splitlines() == [
        f"training kernels: built, in {where[kernels]}",
        f"fused decoding step: not built (attnlab kernels build), in {where[fused]}",
        f"WaveNet generation step: built, in {where[wavenet]}",
    ]


def test_a_build_that_fails_is_one_line_with_the_reason_and_exit_1(capsys, monkeypatch):
    def failed_build():
        warnings.warn(
            "the fused decoding step could not be built (CalledProcessError: no c++); decoding eagerly", stacklevel=2
        )
        return None

    monkeypatch.setattr(kernels, "is_built", lambda: True)
    monkeypatch.setattr(kernels, "extension", lambda: object())
    monkeypatch.setattr(fused, "is_built", lambda: False)
    monkeypatch.setattr(fused, "extension", failed_build)
    monkeypatch.setattr(wavenet, "is_built", lambda: True)
    monkeypatch.setattr(wavenet, "extension", lambda: object())
    code, out, err = cli(capsys, "kernels", "build")
    assert code == 1 and "Traceback" not in err
    lines = out.splitlines()
    assert lines[0].startswith("training kernels: already built, in ")
    assert lines[1].startswith("fused decoding step: the fused decoding step could not be built (CalledProcessError")
    assert "PyTorch's operators" in lines[1] and lines[2].startswith("WaveNet generation step: already built")
    assert len(lines) == 3


@pytest.mark.skipif(any(m.extension() is None for m in (kernels, fused, wavenet)), reason="no C++ build here")
def test_build_leaves_both_marked_built(capsys):
    code, out, _ = cli(capsys, "kernels", "build", "--json")
    assert code == 0
    result = json.loads(out)
    assert all(r["built"] for r in result.values())
    assert kernels.is_built() and fused.is_built() and wavenet.is_built()
