"""A chat model scored on the instruction mix through its chat template (`attnlab.studies.chat_eval`,
`attnlab eval RUN --chat-mix DIR`): a tiny chat run trained in the test to memorize the first test
conversation of each task, the arithmetic one with its calculator call, answers them all right
through the template (BLEU 100, every accuracy 100); the calculator runs in the tool form only;
bad flags are one line and status 2."""

import json
import shutil
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.data.chat_mix import MixOptions, write_mix

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TASKS = ("translation", "sentiment", "tagging", "arithmetic", "arithmetic-direct")
TOML = """task = "chat"
[model]
block_size = 256
n_layers = 2
n_heads = 2
d_model = 64
dropout = 0.0
[data]
path = "{path}"
vocab_size = 600
val_fraction = 0.1
[train]
max_iters = 400
batch_size = 5
learning_rate = 3e-3
min_lr = 1e-3
warmup_iters = 10
eval_interval = 400
eval_iters = 1
log_interval = 100
"""


@pytest.fixture(scope="module")
def memorized(tmp_path_factory) -> tuple[Path, Path]:
    """(the mix folder, a chat run that has memorized the first test conversation of each task)."""
    folder = tmp_path_factory.mktemp("chat-eval")
    root = folder / "data"
    for name, there in (("multi30k", "multi30k"), ("sst2", "sst2"), ("ud", "ud-english-ewt")):
        shutil.copytree(FIXTURES / name, root / there)
    options = MixOptions(translation=1, sentiment=1, tagging=1, continuation=1, arithmetic=1, val=1, arithmetic_test=1)
    write_mix(root, folder / "mix", options)
    firsts = [(folder / "mix" / "test" / f"{t}.jsonl").read_text(encoding="utf-8").splitlines()[0] for t in TASKS]
    data = folder / "memorize.jsonl"
    data.write_text("\n".join(firsts * 10) + "\n", encoding="utf-8")
    (folder / "chat.toml").write_text(TOML.format(path=data.as_posix()), encoding="utf-8")
    assert main(["train", str(folder / "chat.toml"), "--out", str(folder / "run"), "--quiet"]) == 0
    return folder / "mix", folder / "run"


def test_a_model_that_knows_the_answers_scores_them_all(memorized):
    from attnlab.cli.chat import chat_template
    from attnlab.studies.chat_eval import ChatModel, score_mix
    from attnlab.train.load import load_any

    mix, run = memorized
    loaded = load_any(run, command="eval")
    chat = ChatModel(loaded.model, loaded.tokenizer, chat_template(run, loaded))
    scores, replies = score_mix(chat, mix, limit=1)
    assert [s.task for s in scores] == list(TASKS)
    assert {s.task: s.score for s in scores} == {t: pytest.approx(100.0) for t in TASKS}
    tool_test = json.loads((mix / "test" / "arithmetic.jsonl").read_text().splitlines()[0])
    assert replies["arithmetic"] == [tool_test["messages"][-1]["content"]]  # said after the calculator's answer


def test_without_the_calculator_a_tool_call_stays_text_and_scores_wrong(memorized):
    """The tool-form question asked as a direct one: the model calls the tool, nobody answers."""
    from attnlab.cli.chat import chat_template
    from attnlab.studies.chat_eval import ChatModel, reply
    from attnlab.train.load import load_any

    mix, run = memorized
    loaded = load_any(run, command="eval")
    chat = ChatModel(loaded.model, loaded.tokenizer, chat_template(run, loaded))
    line = json.loads((mix / "test" / "arithmetic.jsonl").read_text().splitlines()[0])
    said = reply(chat, line["messages"][:2], 96)
    assert said.startswith("<tool_call>") and "calculator" in said
    assert reply(chat, line["messages"][:2], 96, calculator=True) == line["messages"][-1]["content"]


def test_the_command_prints_the_table_and_json(memorized, capsys):
    mix, run = memorized
    assert main(["eval", str(run), "--chat-mix", str(mix), "--limit", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["task"] for s in out["scores"]] == list(TASKS) and out["limit"] == 1
    assert all(s["score"] == pytest.approx(100.0) for s in out["scores"])
    assert main(["eval", str(run), "--chat-mix", str(mix), "--limit", "1"]) == 0
    text = capsys.readouterr().out
    assert "UPOS accuracy" in text and "accuracy, calculator" in text


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--limit", "3"], "--limit goes with --chat-mix"),
        (["--chat-mix", "MIX", "--split", "val"], "--split: not with --chat-mix"),
        (["--chat-mix", "MIX", "--limit", "0"], "--limit must be >= 1"),
        (["--chat-mix", "NOWHERE"], "has no test/ folder"),
    ],
)
def test_bad_flags_are_one_line(memorized, capsys, flags, fragment, tmp_path):
    mix, run = memorized
    flags = [str(mix) if f == "MIX" else str(tmp_path / "nowhere") if f == "NOWHERE" else f for f in flags]
    assert main(["eval", str(run), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err
