"""SST-2 classification end to end on the fixture: BERT and the BiLSTM through the same task code,
the held-out val split, the TSV errors a user meets, and `attnlab eval` / `attnlab classify`."""

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from attnlab import load
from attnlab.errors import ConfigError, UserError
from attnlab.tasks import TextClassification
from attnlab.train import resolve
from helpers import SST2, assert_user_error, cli, encoder_doc, shared

pytestmark = pytest.mark.slow

TINY = [
    "--set=model.d_model=32",
    "--set=model.n_heads=2",
    "--set=model.n_layers=1",
    "--set=model.d_ff=64",
    "--set=model.max_len=64",
    "--set=data.vocab_size=300",
    "--set=data.val_size=40",
    "--set=train.max_iters=2",
    "--set=train.eval_interval=2",
    "--set=train.device=cpu",
]


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "sst2-bert")


@pytest.fixture(scope="module")
def bilstm_run(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "sst2-bilstm")


def read_tsv(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [
            (row["sentence"].strip(), row["label"]) for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        ]


def eval_json(capsys, run_dir: Path, *args: str) -> dict:
    code, out, err = cli(capsys, "eval", run_dir, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize(("run", "threshold"), [("bert_run", 0.8), ("bilstm_run", 0.75)])
def test_each_model_kind_learns_the_training_sentences(run, threshold, request, capsys):
    run_dir = request.getfixturevalue(run)
    kind = {"bert_run": "Bert", "bilstm_run": "BiLSTM"}[run]
    assert type(load(run_dir).model).__name__ == kind
    metrics = eval_json(capsys, run_dir, "--split", "train", "--checkpoint", "last")
    labels = [y for _, y in read_tsv(SST2 / "train.tsv")]
    chance = max(Counter(labels).values()) / len(labels)
    assert metrics["examples"] == len(labels) - 40  # val_size sentences are held out
    assert metrics["accuracy"] >= threshold > chance + 0.2, metrics


def test_held_out_val_is_disjoint_seeded_and_the_same_every_time(tmp_path):
    def split(seed: int, run_dir: Path) -> dict:
        run_dir.mkdir()
        config = resolve(encoder_doc("classification", SST2, data={"seed": seed}))
        return TextClassification(config.data, config.model, run_dir).data

    a, b, c = split(0, tmp_path / "a"), split(0, tmp_path / "b"), split(1, tmp_path / "c")
    rows = read_tsv(SST2 / "train.tsv")
    assert a["val"] == b["val"] and a["train"] == b["train"]
    assert len(a["val"][0]) == 40 and len(a["train"][0]) == len(rows) - 40
    pairs = lambda part: list(zip(*part, strict=True))  # noqa: E731
    assert Counter(pairs(a["train"]) + pairs(a["val"])) == Counter(rows)
    assert not set(a["train"][0]) & set(a["val"][0])
    assert a["val"][0] != rows[:40] and a["val"] != c["val"]  # a seeded random choice, not the head of the file


def test_eval_dev_matches_classify_on_the_same_sentences(bert_run, capsys):
    metrics = eval_json(capsys, bert_run, "--split", "dev")
    dev = read_tsv(SST2 / "dev.tsv")
    assert metrics["examples"] == len(dev) and 0.0 <= metrics["accuracy"] <= 1.0
    run = load(bert_run)
    task = TextClassification(run.config.data, run.config.model, bert_run, resume=True, splits=())
    predicted = [r["label"] for r in task.classify(run.model, [s for s, _ in dev], torch.device("cpu"))]
    expected = sum(p == y for p, (_, y) in zip(predicted, dev, strict=True)) / len(dev)
    assert metrics["accuracy"] == pytest.approx(expected)


def test_a_blank_text_gets_an_empty_result_in_the_library_too(bert_run):
    """`TextClassification.classify` (what `attnlab classify` calls): a blank text is `{}`, the others
    what each gives alone, in order."""
    run = load(bert_run)
    task = TextClassification(run.config.data, run.config.model, bert_run, resume=True, splits=())
    cpu = torch.device("cpu")
    got = task.classify(run.model, ["a great movie", "  ", "awful"], cpu)
    assert got[1] == {} and task.classify(run.model, [""], cpu) == [{}]
    for text, result in zip(("a great movie", "awful"), (got[0], got[2]), strict=True):
        assert result["label"] == task.classify(run.model, [text], cpu)[0]["label"]


def test_classify_prints_label_and_probability_one_line_per_input(bert_run, capsys):
    labels = json.loads((bert_run / "labels.json").read_text())["labels"]
    code, out, err = cli(capsys, "classify", bert_run, "a great movie", "", "awful")
    assert code == 0, err
    lines = out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == "", out
    code, out, _ = cli(capsys, "classify", bert_run, "a great movie", "", "awful", "--json")
    results = json.loads(out)["results"]
    assert [r["text"] for r in results] == ["a great movie", "", "awful"]
    for line, r in zip((lines[0], lines[2]), (results[0], results[2]), strict=True):
        label, prob = line.split("\t")
        assert set(r["probabilities"]) == set(labels) and sum(r["probabilities"].values()) == pytest.approx(1.0)
        assert label == r["label"] == max(r["probabilities"], key=r["probabilities"].get)
        assert float(prob) == pytest.approx(r["probabilities"][label], abs=1e-3) and float(prob) >= 1 / len(labels)
    assert "label" not in results[1]


def test_classify_reads_an_input_file(bert_run, capsys, tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a great movie\nawful\n", encoding="utf-8")
    from_file = cli(capsys, "classify", bert_run, "--input", path)[1]
    assert from_file == cli(capsys, "classify", bert_run, "a great movie", "awful")[1]
    assert_user_error(cli(capsys, "classify", bert_run), "no text given")


def test_unknown_dev_label_is_a_file_line_error(bert_run, capsys, tmp_path):
    data = tmp_path / "sst2"
    shutil.copytree(SST2, data)
    lines = (data / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    sentence = lines[4].split("\t")[0]
    lines[4] = f"{sentence}\t2\n"  # line 5 of the file
    (data / "dev.tsv").write_text("".join(lines), encoding="utf-8")
    result = cli(capsys, "eval", bert_run, "--split", "dev", "--data-dir", data)
    assert_user_error(result, "dev.tsv:5", "unknown label '2'")


def test_wrong_column_count_is_a_file_line_error(capsys, tmp_path):
    data = tmp_path / "sst2"
    shutil.copytree(SST2, data)
    lines = (data / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2].rstrip("\n") + "\textra\n"  # line 3
    (data / "train.tsv").write_text("".join(lines), encoding="utf-8")
    result = cli(capsys, "train", "sst2", "--data-dir", data, "--out", tmp_path / "run", "--quiet", *TINY)
    assert_user_error(result, "train.tsv:3", "expected 2 tab-separated columns")


def test_missing_data(bert_run, capsys, tmp_path):
    assert_user_error(cli(capsys, "train", "sst2", "--out", tmp_path / "r", *TINY), "--data-dir")
    result = cli(capsys, "train", "sst2", "--data-dir", tmp_path / "none", "--out", tmp_path / "r", *TINY)
    assert_user_error(result, "none", "does not exist")
    only_train = tmp_path / "only-train"
    only_train.mkdir()
    shutil.copy(SST2 / "train.tsv", only_train)
    result = cli(capsys, "eval", bert_run, "--split", "dev", "--data-dir", only_train)
    assert_user_error(result, "dev.tsv", "does not exist")
    assert_user_error(cli(capsys, "eval", bert_run, "--split", "dev2"), "unknown split 'dev2'")


def test_too_few_sentences_to_hold_out(tmp_path):
    config = resolve(encoder_doc("classification", SST2, data={"val_size": 1000}))
    with pytest.raises(UserError, match="val_size"):
        TextClassification(config.data, config.model, tmp_path)


def test_tagging_run_is_not_a_classification_model(capsys, tmp_path_factory):
    tagger = shared(tmp_path_factory, "pos-bert")
    capsys.readouterr()  # the training log, when this test trained the tagger
    assert_user_error(cli(capsys, "classify", tagger, "a great movie"), "not a classification model")


def test_training_checks_the_dev_labels_before_it_starts(capsys, tmp_path):
    data = tmp_path / "sst2"
    shutil.copytree(SST2, data)
    lines = (data / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[6] = lines[6].split("\t")[0] + "\tpositive\n"  # line 7 of the file
    (data / "dev.tsv").write_text("".join(lines), encoding="utf-8")
    args = ("--set", "train.max_iters=1", "--set", "data.val_size=50")
    result = cli(capsys, "train", "sst2", "--data-dir", data, "--out", tmp_path / "run", *args)
    assert_user_error(result, "dev.tsv:7", "unknown label 'positive'")
    assert not (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.parametrize("value", [1.0, -0.5])
def test_token_dropout_must_be_a_share(value):
    with pytest.raises(ConfigError, match="token_dropout"):
        resolve(encoder_doc("classification", SST2, data={"token_dropout": value}))
