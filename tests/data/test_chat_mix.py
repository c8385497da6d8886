"""The instruction mix (`attnlab data chat-mix`): written from small copies of each data set's
format (the fixtures' slices of Multi30k, SST-2 and EWT; a made-up play), every line OpenAI's
fine-tuning format as `attnlab.data.conversations` reads it, the splits kept apart (no test
sentence or passage in training, also where the data set repeats one), the same files from the same
seed, conversations within max_chars; the tagging replies read back; the arithmetic problems'
answers Python's and the calculator's; a missing data set one line naming it and how to get it."""

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.data import arithmetic
from attnlab.data.chat_mix import (
    PROMPTS,
    UPOS,
    MixOptions,
    build_mix,
    chars,
    format_tags,
    parse_tags,
    read_continuation,
    write_mix,
)
from attnlab.data.conllu import read_conllu
from attnlab.data.conversations import parse_line

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SMALL = MixOptions(translation=40, sentiment=40, tagging=20, continuation=10, arithmetic=15, val=5, arithmetic_test=12)


def play(speeches: int = 200) -> str:
    """A made-up play: numbered speakers and lines, every line different, so that a passage's
    place in the text is unambiguous."""
    return (
        "\n\n".join(
            f"Speaker {i % 7}:\n" + "\n".join(f"Line {i}.{j} of the play." for j in range(2 + i % 9))
            for i in range(speeches)
        )
        + "\n"
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data root as `attnlab data download` lays it out, holding the fixtures' slices."""
    folder = tmp_path / "data"
    shutil.copytree(FIXTURES / "multi30k", folder / "multi30k")
    shutil.copytree(FIXTURES / "sst2", folder / "sst2")
    shutil.copytree(FIXTURES / "ud", folder / "ud-english-ewt")
    (folder / "tinyshakespeare").mkdir()
    (folder / "tinyshakespeare" / "input.txt").write_text(play(), encoding="utf-8")
    return folder


def lines(path: Path) -> list[dict]:
    return [json.loads(t) for t in path.read_text(encoding="utf-8").splitlines()]


def inputs(conversations: list[dict], task: str) -> list[str]:
    """The inputs of a task's conversations: the user's message without the task's prompt."""
    asked = [c["messages"][0]["content"] for c in conversations]
    return [a.removeprefix(PROMPTS[task]) for a in asked if a.startswith(PROMPTS[task])]


def test_the_mix_is_openais_format_with_every_task_and_the_counts_it_prints(root, tmp_path):
    out = tmp_path / "mix"
    mix = write_mix(root, out, SMALL)
    train, val = lines(out / "train.jsonl"), lines(out / "val.jsonl")
    for name in ("train.jsonl", "val.jsonl", *(f"test/{t}.jsonl" for t in mix.test)):
        for n, text in enumerate((out / name).read_text(encoding="utf-8").splitlines(), 1):
            parse_line(text, n, name)  # raises on anything OpenAI's format or the chat task refuses
    for task in PROMPTS:
        assert len(inputs(train, task)) == mix.counts[task].train > 0
        assert len(inputs(val, task)) == mix.counts[task].val == SMALL.val
    assert sum(c.train for c in mix.counts.values()) == len(train)
    assert mix.counts["arithmetic"].train == 2 * SMALL.arithmetic  # each problem with the tool and without
    test2016 = gzip.decompress((root / "multi30k" / "test_2016_flickr.de.gz").read_bytes()).decode().splitlines()
    assert inputs(lines(out / "test" / "translation.jsonl"), "translation") == test2016
    ewt_test = read_conllu(root / "ud-english-ewt" / "en_ewt-ud-test.conllu")
    assert len(lines(out / "test" / "tagging.jsonl")) == len(ewt_test)
    assert len(lines(out / "test" / "sentiment.jsonl")) == len(open(root / "sst2" / "dev.tsv").readlines()) - 1
    assert len(lines(out / "test" / "arithmetic.jsonl")) == len(lines(out / "test" / "arithmetic-direct.jsonl")) == 12
    manifest = json.loads((out / "mix.json").read_text())
    assert manifest["counts"]["translation"]["train"] == mix.counts["translation"].train
    pretrain = (out / "pretrain.txt").read_text(encoding="utf-8")
    assert all(sentence not in pretrain for sentence in test2016)


def test_no_test_or_validation_example_is_trained_on_even_where_the_data_set_repeats_one(root):
    """Copy test and val sentences into the training files: the mix drops them from training."""
    for lang in ("de", "en"):
        train, test, val = (
            _read_lines(root / "multi30k" / f"{s}.{lang}.gz") for s in ("train", "test_2016_flickr", "val")
        )
        train[:6] = test[:3] + val[:3]
        (root / "multi30k" / f"train.{lang}.gz").write_bytes(gzip.compress(("\n".join(train) + "\n").encode()))
    mix = build_mix(root, MixOptions(translation=1000, sentiment=1000, tagging=1000, continuation=1000, val=50))
    assert mix.counts["translation"].overlap >= 6
    for task in PROMPTS:
        train, val, test = (set(inputs(s, task)) for s in (mix.train, mix.val, mix.test[task]))
        assert train and test and not train & test and not val & test and not train & val, task
    train_replies = {c["messages"][-1]["content"] for c in mix.train}
    for task in ("translation", "continuation"):  # a reference may not be a training reply either
        assert not train_replies & {c["messages"][-1]["content"] for c in mix.test[task]}
    test_keys = _computations(mix.test["arithmetic"])
    assert test_keys and not test_keys & _computations(mix.train)


def _read_lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def _computations(conversations: list[dict]) -> set[tuple[str, int, int]]:
    """The computations (`Problem.key`) of the tool-form arithmetic conversations, read back from their calls."""
    keys = set()
    for c in conversations:
        for call in (call for m in c["messages"] for call in m.get("tool_calls") or []):
            a, op, b = json.loads(call["function"]["arguments"])["expression"].split()
            keys.add(arithmetic.Problem(op, int(a), int(b), "").key)
    return keys


def test_continuation_splits_by_position_in_the_text(root):
    """A passage's split is where its speech starts: the first 90% of the text, the next 5%, the last."""
    text = play()
    splits = read_continuation(root, random.Random(0))
    for split, (low, high) in {"train": (0, 0.9), "val": (0.9, 0.95), "test": (0.95, 1)}.items():
        assert splits[split], split
        for prompt, reply in splits[split]:
            at = text.index(prompt.split("\n")[1])  # the passage's first line (the play's lines are all different)
            cut = text.rfind("\n\n", 0, at)
            start = 0 if cut < 0 else cut + 2
            assert low <= start / len(text) < high, (split, prompt)
            assert text[start:].startswith(prompt.split("\n")[0])  # the speaker of that speech
            assert text.index(prompt.split("\n")[-1] + "\n" + reply) > at  # the reply is what follows


def test_the_same_seed_writes_the_same_files_and_another_seed_another_mix(root, tmp_path):
    write_mix(root, tmp_path / "a", SMALL)
    write_mix(root, tmp_path / "b", SMALL)
    write_mix(root, tmp_path / "c", MixOptions(**{**SMALL.__dict__, "seed": 7}))
    for name in ("train.jsonl", "val.jsonl", "test/arithmetic.jsonl", "pretrain.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "train.jsonl").read_bytes() != (tmp_path / "c" / "train.jsonl").read_bytes()


def test_training_and_validation_conversations_fit_max_chars_and_the_rest_are_counted(root):
    mix = build_mix(root, MixOptions(**{**SMALL.__dict__, "max_chars": 120, "tagging": 1000}))
    assert max(chars(c) for c in mix.train + mix.val) <= 120
    assert mix.counts["tagging"].too_long > 0
    assert any(chars(c) > 120 for c in mix.test["tagging"])  # the test keeps every sentence


def test_a_character_count_covers_the_tool_calls():
    line = arithmetic.with_tool(arithmetic.Problem("*", 347, 12, "Q?"))
    call = line["messages"][2]["tool_calls"][0]["function"]
    text = [m.get("content") or "" for m in line["messages"]]
    assert chars(line) == sum(map(len, text)) + len(call["name"]) + len(call["arguments"])


# ------------------------------------------------------------------ the tagging replies


def test_the_tagging_reply_reads_back_for_every_fixture_sentence():
    sentences = [
        s for split in ("train", "dev", "test") for s in read_conllu(FIXTURES / "ud" / f"en_ewt-ud-{split}.conllu")
    ]
    for s in sentences:
        assert parse_tags(format_tags(s.words, s.tags)) == list(zip(s.words, s.tags, strict=True))
    assert {t for s in sentences for t in s.tags} <= UPOS


def test_a_word_with_slashes_keeps_them_and_bad_replies_do_not_parse():
    assert parse_tags("and/or/CCONJ //PUNCT 1/2/NUM") == [("and/or", "CCONJ"), ("/", "PUNCT"), ("1/2", "NUM")]
    for bad in ("", "   ", "word", "word/", "/NOUN", "dog/NOUN cat/noun", "dog/NOUN cat/NN", "dog/NOUN cat"):
        assert parse_tags(bad) is None, bad
    with pytest.raises(ValueError):
        format_tags(["a", "b"], ["DET"])


# ------------------------------------------------------------------ arithmetic


def test_the_answers_are_pythons_arithmetic_and_the_calculators():
    from attnlab.decode.calculator import calculate

    problems = arithmetic.problems(2000, random.Random(3))
    assert {p.op for p in problems} == {"+", "-", "*", "/"}
    for p in problems:
        a, b = p.a, p.b
        assert str(a) in p.question and str(b) in p.question
        if p.op == "/":
            assert 100 <= a <= 999 and 2 <= b <= 19 and p.answer * b == a  # exact: no remainder
        else:
            assert 100 <= a <= 999 and 100 <= b <= 999
            assert p.answer == {"+": a + b, "-": a - b, "*": a * b}[p.op] and p.answer >= 0
        assert calculate(p.expression) == str(p.answer)
    assert len({p.key for p in problems}) == len(problems)
    assert arithmetic.Problem("+", 12, 347, "").key == arithmetic.Problem("+", 347, 12, "").key


def test_the_problems_are_seeded_and_avoid_what_they_are_told_to():
    first = arithmetic.problems(50, random.Random(1))
    assert first == arithmetic.problems(50, random.Random(1)) != arithmetic.problems(50, random.Random(2))
    later = arithmetic.problems(500, random.Random(1), exclude=[p.key for p in first])
    assert not {p.key for p in first} & {p.key for p in later}


def test_the_tool_conversation_has_openais_call_shape_and_states_the_number():
    p = arithmetic.Problem("*", 347, 12, "A crate holds 12 apples. How many apples are in 347 crates?")
    line = arithmetic.with_tool(p)
    _, user, call, tool, final = line["messages"]
    assert user == {"role": "user", "content": p.question}
    assert call["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "347 * 12"}'},
        }
    ]
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "4164"}
    assert "4164" in final["content"] and final["role"] == "assistant"
    parse_line(json.dumps(line), 1)
    direct = arithmetic.direct(p)["messages"]
    assert [m["role"] for m in direct] == ["user", "assistant"] and direct[1] == final


# ------------------------------------------------------------------ the command


def test_the_command_writes_the_mix_and_prints_the_counts(root, tmp_path, capsys):
    out = tmp_path / "mix"
    flags = ["--translation", "10", "--sentiment", "10", "--tagging", "5", "--continuation", "5", "--arithmetic", "5"]
    assert main(["data", "chat-mix", "--data-dir", str(root), "--out", str(out), *flags, "--val", "2"]) == 0
    printed = capsys.readouterr().out
    assert "translation" in printed and "arithmetic" in printed and str(out) in printed
    assert len(lines(out / "train.jsonl")) == 10 + 10 + 5 + 5 + 2 * 5


@pytest.mark.parametrize("missing", ["multi30k", "sst2", "ud-english-ewt"])
def test_a_missing_data_set_is_one_line_naming_it_and_how_to_get_it(root, tmp_path, capsys, missing):
    shutil.rmtree(root / missing)
    assert main(["data", "chat-mix", "--data-dir", str(root), "--out", str(tmp_path / "mix")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no {missing}/ folder" in err and f"attnlab data download {missing}" in err
    assert not (tmp_path / "mix").exists()


def test_no_data_dir_and_a_data_dir_that_is_no_folder_are_one_line(tmp_path, capsys):
    assert main(["data", "chat-mix", "--out", str(tmp_path / "mix")]) == 2
    assert "needs --data-dir" in capsys.readouterr().err
    assert main(["data", "chat-mix", "--data-dir", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a folder" in err


def test_without_a_tinyshakespeare_folder_the_shipped_copy_is_read(root):
    shutil.rmtree(root / "tinyshakespeare")
    splits = read_continuation(root, random.Random(0))
    assert splits["train"][0][0].startswith("First Citizen:")
