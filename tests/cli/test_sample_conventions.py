"""`attnlab sample`'s short forms (a positional PROMPT, llama.cpp's -p and -n) and its speculative
decoding options (--draft, --prompt-lookup, --draft-k): the same text as without them, the
statistics on stderr, and one-line refusals of what cannot work."""

import json
import re
from pathlib import Path

import pytest

from attnlab.cli.sample import MAX_DRAFT_TOKENS
from attnlab.data.text import bundled_shakespeare
from attnlab.decode import speculative
from helpers import assert_user_error, cli, shared

pytestmark = pytest.mark.slow


def _train(folder: Path, text: str, **model) -> Path:
    from attnlab.train import resolve, train

    corpus = folder / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    doc = {
        "task": "lm",
        "model": {"block_size": 16, "n_heads": 2, **model},
        "data": {"path": str(corpus), "tokenizer": "char"},
        "train": {"max_iters": 8, "batch_size": 4, "warmup_iters": 2, "eval_interval": 8},
    }
    train(resolve(doc), folder / "run", progress=False)
    return folder / "run"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "lm")  # a character GPT on the first 20,000 characters of Tiny Shakespeare


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A smaller GPT on the same text: the same characters, so the same tokenizer."""
    return _train(tmp_path_factory.mktemp("small"), bundled_shakespeare()[:20_000], n_layers=1, d_model=16)


GREEDY = ("--temperature", "0", "--device", "cpu")


def test_the_prompt_as_a_positional_argument_and_llamacpp_short_options(capsys, target):
    code, want, _ = cli(capsys, "sample", target, "--prompt", "ROMEO:", "--max-new-tokens", "20", *GREEDY)
    assert code == 0 and want.startswith("ROMEO:") and len(want.rstrip("\n")) == len("ROMEO:") + 20
    assert cli(capsys, "sample", target, "ROMEO:", "-n", "20", *GREEDY)[1] == want
    assert cli(capsys, "sample", target, "-p", "ROMEO:", "-n", "20", *GREEDY)[1] == want
    assert cli(capsys, "sample", target, "-p", "JULIET:", "-n", "20", *GREEDY)[1] != want


def test_the_prompt_given_twice_is_refused(capsys, target):
    assert_user_error(cli(capsys, "sample", target, "ROMEO:", "-p", "JULIET:"), "give the prompt once")


@pytest.mark.parametrize(
    "drafter", [["--draft", "SMALL"], ["--draft", "SMALL", "--no-fused"], ["--prompt-lookup"], ["--prompt-lookup", "2"]]
)
@pytest.mark.parametrize("k", ["1", "4", "8"])
def test_speculation_prints_the_same_text_and_its_statistics(capsys, target, small, drafter, k):
    drafter = [str(small) if a == "SMALL" else a for a in drafter]
    prompt = ("-p", "ROMEO: O Romeo!", "-n", "40")  # within the block of 16 and past it
    code, want, _ = cli(capsys, "sample", target, *prompt, *GREEDY)
    assert code == 0
    code, out, err = cli(capsys, "sample", target, *prompt, *GREEDY, *drafter, "--draft-k", k)
    assert code == 0, err
    assert out == want
    accepted, drafted = map(int, re.search(r"(\d+) of (\d+) drafted tokens accepted", err).groups())
    assert drafted > 0 and "warning" not in err


def test_json_carries_the_statistics(capsys, target, small):
    code, out, _ = cli(capsys, "sample", target, "ROMEO:", "-n", "30", *GREEDY, "--draft", small, "--json")
    stats = json.loads(out)["speculation"]
    assert code == 0 and stats["emitted"] == stats["steps"] + stats["accepted"]
    assert stats["drafted"] >= stats["accepted"] > 0


@pytest.mark.parametrize("k", ["0", "17", "-3"])
def test_k_out_of_range_is_refused_with_the_accepted_values(capsys, target, k):
    assert_user_error(cli(capsys, "sample", target, "--prompt-lookup", "--draft-k", k), "--draft-k", "1 to 16", k)


def test_the_cli_bound_on_k_is_the_librarys():
    assert MAX_DRAFT_TOKENS == speculative.MAX_DRAFT_TOKENS


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--draft-k", "3"], "add --draft RUN or --prompt-lookup"),
        (["--draft", "SMALL", "--prompt-lookup"], "pick one"),
        (["--prompt-lookup", "--fused"], "prompt lookup has none"),
        (["--draft", "SMALL", "--compile"], "leave out --compile and --weights"),
        (["--prompt-lookup", "--weights", "int8"], "leave out --compile and --weights"),
        (["--draft", "NOWHERE"], "NOWHERE"),
    ],
)
def test_options_that_cannot_go_together_are_refused(capsys, target, small, tmp_path, args, reason):
    args = [str(small) if a == "SMALL" else str(tmp_path / "nowhere") if a == "NOWHERE" else a for a in args]
    assert_user_error(cli(capsys, "sample", target, *args), reason.replace("NOWHERE", "nowhere"))


def test_a_draft_with_another_vocabulary_is_refused(capsys, target, tmp_path):
    other = _train(tmp_path, "the quick brown fox jumps over the lazy dog " * 200, n_layers=1, d_model=16)
    capsys.readouterr()  # the training's log
    assert_user_error(cli(capsys, "sample", target, "--draft", other), "vocabulary", "same tokenizer")


def test_a_draft_larger_than_the_target_is_warned_of(capsys, target, small):
    code, want, _ = cli(capsys, "sample", small, "ROMEO:", "-n", "20", *GREEDY)
    code, out, err = cli(capsys, "sample", small, "ROMEO:", "-n", "20", *GREEDY, "--draft", target)
    assert code == 0 and out == want
    assert "warning: the draft model" in err and "not smaller than the target" in err
