"""A command that fails on its arguments answers before importing PyTorch: one line, exit code 2,
in the time Python takes to start rather than the seconds `import torch` takes."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Runs the CLI in a fresh interpreter, then says on stdout whether PyTorch was imported.
PROGRAM = """
import sys
from attnlab.cli import main
code = main(sys.argv[1:])
print("torch imported" if "torch" in sys.modules else "torch not imported")
sys.exit(code)
"""


def attnlab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("train", "shakespear-char"), "unknown preset 'shakespear-char' (did you mean 'shakespeare-char'"),
        (("train", "missing.toml"), "config file missing.toml does not exist"),
        (("train", "demo", "--set", "train.max_iters"), "--set expects key=value, got 'train.max_iters'"),
        (("train", "demo", "--set", "trian.max_iters=5"), "unknown config key 'trian' (did you mean 'train'?)"),
        (("train", "demo", "--set", "max_iters=5"), "--set max_iters=5: unknown config key 'max_iters'"),
        (("demo", "--set", "modle.n_layers=2"), "unknown config key 'modle' (did you mean 'model'?)"),
        (("train", "demo", "--set", "task=imagess"), "--set task=imagess: unknown task 'imagess'"),
        (
            ("train", "demo", "--set", "model.n_layr=2"),
            "unknown config key model.n_layr (did you mean 'n_layers', 'nope_layers'?)",
        ),
        (("demo", "--set", "train.max_iter=2"), "unknown config key train.max_iter (did you mean 'max_iters'"),
        (("train", "typo.toml"), "unknown config key data.vocab_sise (did you mean 'vocab_size'"),
        (("sample", "no-such-run", "--prompt", "ROMEO:"), "no-such-run does not exist: no such folder or file"),
        (("eval", "no-such-run"), "no-such-run does not exist: no such folder or file"),
        (("embed", "typo.toml", "a text"), "typo.toml is a file but not a checkpoint"),
    ],
)
def test_argument_mistakes_are_refused_before_torch_is_imported(args, fragment, tmp_path):
    (tmp_path / "typo.toml").write_text('task = "language-model"\n[data]\nvocab_sise = 300\n')
    done = attnlab(*args, cwd=tmp_path)  # where no-such-run and missing.toml are missing
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "torch not imported"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert fragment in lines[0]


def test_a_mistake_found_after_the_imports_still_says_so(tmp_path):
    """The control: a key that another family has (a ViT's patch size) but a GPT has not is found
    once the config dataclasses are imported (with PyTorch), which name what a GPT accepts; so the
    harness above can tell the two apart."""
    done = attnlab("train", "demo", "--set", "model.patch_size=4", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "torch imported"
    assert "unknown config key model.patch_size" in done.stderr and "[model] accepts" in done.stderr


def test_the_table_of_section_keys_is_current():
    """src/attnlab/config_keys.py is what scripts/config_keys.py writes from today's config
    dataclasses: a field added to a config without rerunning the script fails here."""
    script = Path(__file__).parents[2] / "scripts" / "config_keys.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
