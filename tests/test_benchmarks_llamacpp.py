"""benchmarks/llamacpp_compare.py's bad input: a llama.cpp peer (its binding, the gguf package, a
GGUF, llama.cpp's converter) missing when the comparison asks for it is one line on stderr naming
what to install or pass, and exit code 2, before any model is built. The comparison itself is a
benchmark, not a test (BENCHMARKS.md)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "llamacpp_compare.py"
EXTRA = "pip install 'attnlab[llamacpp]'"
PEER_INSTALLED = all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "gguf", "sentencepiece"))

# Runs the script as `python SCRIPT ARGS` would, with the named modules unimportable: Python's own
# way of making an import fail (a None in sys.modules raises ImportError), so that the check runs
# the same wherever the extra happens to be installed.
WITHOUT = """
import runpy, sys
script, blocked = sys.argv[1], sys.argv[2]
for name in filter(None, blocked.split(",")):
    sys.modules[name] = None
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


def run(tmp_path: Path, *args: str, without: str = "") -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", WITHOUT, str(SCRIPT), without, "--work", str(tmp_path), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def assert_one_line_error(done: subprocess.CompletedProcess, *names: str) -> str:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback, no log
    assert lines[0].startswith("llamacpp_compare: error: ")
    for name in names:
        assert name in lines[0]
    return lines[0]


@pytest.mark.parametrize("module", ["llama_cpp", "gguf"])
def test_a_missing_module_names_the_extra(tmp_path, module):
    line = assert_one_line_error(run(tmp_path, without=module), module, EXTRA)
    assert "not installed" in line


@pytest.mark.skipif(not PEER_INSTALLED, reason="the llamacpp extra is not installed")
def test_converting_without_sentencepiece_names_the_extra(tmp_path):
    """sentencepiece is asked for only where a GGUF is still to be converted."""
    done = run(tmp_path, "--shapes", "llama", without="sentencepiece")
    assert_one_line_error(done, "sentencepiece", EXTRA)


@pytest.mark.skipif(not PEER_INSTALLED, reason="the llamacpp extra is not installed")
def test_a_missing_gguf_asks_for_the_converter(tmp_path):
    done = run(tmp_path, "--shapes", "llama", "--precisions", "q8_0")
    assert_one_line_error(done, str(tmp_path / "llama-q8_0.gguf"), "--llama-cpp", EXTRA)
    assert not (tmp_path / "llama").exists()  # it stopped before writing a model


@pytest.mark.skipif(not PEER_INSTALLED, reason="the llamacpp extra is not installed")
def test_a_folder_without_the_converter_is_named(tmp_path):
    source = tmp_path / "not-llama.cpp"
    source.mkdir()
    done = run(tmp_path, "--llama-cpp", str(source), "--shapes", "gpt2")
    assert_one_line_error(done, f"no convert_hf_to_gguf.py in {source}", "vendor/llama.cpp")


def test_a_context_too_small_for_the_prefill_is_named(tmp_path):
    done = run(tmp_path, "--prefill", "4096")
    assert_one_line_error(done, "--prefill", "1024")
