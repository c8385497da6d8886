"""`attnlab serve` refuses a path it cannot serve before PyTorch is imported, as sample and embed do
(tests/cli/test_early_errors.py's harness: a fresh interpreter that says whether torch was imported)."""

import pytest

from cli.test_early_errors import attnlab

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("serve", "no-such-run"), "no-such-run does not exist: no such folder or file"),
        (("serve", "input.txt"), "input.txt is a file but not a checkpoint"),
        (("serve", "tiny=no-such-run"), "no-such-run does not exist"),
        (("serve", "empty"), "empty is not a checkpoint"),
        (("serve", "input.txt", "--weights", "int8", "--no-fused"), "input.txt is a file but not a checkpoint"),
    ],
)
def test_a_path_serve_cannot_take_is_refused_before_torch_is_imported(args, fragment, tmp_path):
    (tmp_path / "input.txt").write_text("hello\n")
    (tmp_path / "empty").mkdir()
    done = attnlab(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "torch not imported"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("attnlab serve: error: ") and fragment in lines[0], lines[0]
