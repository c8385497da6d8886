"""The README's Python lines run as written, in a fresh interpreter where only what they import is
imported (so `attnlab.viz` must come from `import attnlab` itself)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main

pytestmark = pytest.mark.slow

README = Path(__file__).parents[1] / "README.md"


def readme_python() -> str:
    """Every ```python block of the README, in order, then each inline call of the form
    `attnlab.x.y(...)` that names a RUN and a text (placeholders the test binds)."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    inline = [c for c in re.findall(r"`(attnlab\.[\w.]+\(.*?\))`", text) if "RUN" in c]
    return "\n".join(blocks) + "\nRUN, text = 'runs/shakespeare-char-cpu', 'ROMEO:'\n" + "\n".join(inline) + "\n"


def test_the_readme_python_lines_run(tmp_path):
    code = readme_python()
    assert "attnlab.viz.attention_maps(attnlab.load(RUN), text)" in code
    assert "import attnlab.viz" not in code and "from attnlab.viz" not in code
    assert (
        main(
            ["train", "shakespeare-char-cpu", "--out", str(tmp_path / "runs" / "shakespeare-char-cpu"), "--quiet"]
            + [
                f"--set={kv}"
                for kv in ("train.max_iters=2", "train.eval_iters=1", "model.n_layers=1", "model.d_model=32")
            ]
        )
        == 0
    )
    # The `openai` client example talks to `attnlab serve` on port 8000: serve the tiny run for it,
    # on a free port written into the example.
    from attnlab.serve.app import create_app
    from attnlab.serve.registry import load_runs
    from attnlab.serve.server import BackgroundServer

    assert "http://127.0.0.1:8000/v1" in code
    runs = load_runs([f"shakespeare-char-cpu={tmp_path / 'runs' / 'shakespeare-char-cpu'}"])
    with BackgroundServer(create_app(runs)) as server:
        code = code.replace("http://127.0.0.1:8000", server.url)
        done = subprocess.run(
            [sys.executable, "-c", code + "print('README OK')"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("README OK")
