"""UD part-of-speech tagging end to end on the fixture: first-subword targets, per-word accuracy,
BERT and the BiLSTM through the same task code, `attnlab tag` and `attnlab eval`."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab import load
from attnlab.data.mlm import IGNORE_INDEX
from attnlab.errors import ConfigError
from attnlab.tasks import TokenClassification
from attnlab.tasks.token_classification import word_mean
from attnlab.train import resolve
from helpers import UD, assert_user_error, cli, conllu_words, encoder_doc, shared

pytestmark = pytest.mark.slow

TINY = [
    "--set=model.d_model=32",
    "--set=model.n_heads=2",
    "--set=model.n_layers=1",
    "--set=model.d_ff=64",
    "--set=model.max_len=64",
    "--set=data.vocab_size=300",
    "--set=train.max_iters=2",
    "--set=train.eval_interval=2",
    "--set=train.device=cpu",
]


@pytest.fixture(scope="module")
def ud() -> Path:
    return UD


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "pos-bert")


@pytest.fixture(scope="module")
def bilstm_run(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "pos-bilstm")


def new_task(ud: Path, run_dir: Path, **data) -> TokenClassification:
    config = resolve(encoder_doc("tagging", ud, data=data))
    return TokenClassification(config.data, config.model, run_dir, splits=("train", "val", "test"))


class Constant(nn.Module):
    """A 'tagger' that gives one tag at every position: `(B, T)` -> `(B, T, L)`."""

    def __init__(self, label: int, n_labels: int) -> None:
        super().__init__()
        self.label, self.n_labels = label, n_labels

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*ids.shape, self.n_labels)
        out[..., self.label] = 1.0
        return out


def word_pieces(tokenizer, word: str) -> int:
    return max(len(tokenizer.encode(word)), 1)


def test_targets_put_each_tag_at_the_words_first_subword_only(ud, tmp_path):
    task = new_task(ud, tmp_path)
    tok = task.tokenizer
    sentences = conllu_words(ud / "en_ewt-ud-train.conllu")
    index = next(i for i, s in enumerate(sentences) if any(word_pieces(tok, w[1]) >= 3 for w in s))
    words = sentences[index]
    targets = task.targets("train", [index])[0]
    ids = task.ids["train"][index]
    starts, position = [], 1  # after [CLS]
    for w in words:
        starts.append(position)
        position += word_pieces(tok, w[1])
    assert len(ids) == position + 1 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    assert (targets != IGNORE_INDEX).nonzero().flatten().tolist() == starts
    assert [task.labels[int(targets[p])] for p in starts] == [w[3] for w in words]


class Scores(nn.Module):
    """A 'tagger' whose scores are a fixed random function of (position, token id)."""

    def __init__(self, n_labels: int) -> None:
        super().__init__()
        self.table = torch.randn(64, 1000, n_labels, generator=torch.Generator().manual_seed(3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[torch.arange(ids.size(1)), ids % 1000]


def test_word_mean_is_the_average_over_each_words_positions():
    scores = torch.randn(2, 7, 3)
    word_of = torch.tensor([[0, 1, 1, 1, 4, 5, 6], [0, 1, 2, 2, 4, 5, 6]])
    pooled = word_mean(scores, word_of)
    for b in range(2):
        for t in range(7):
            members = [u for u in range(7) if word_of[b, u] == t]
            want = scores[b, members].mean(0) if members else torch.zeros(3)
            torch.testing.assert_close(pooled[b, t], want)


def test_mean_pooling_scores_each_word_by_the_average_of_all_its_subwords(ud, tmp_path):
    (tmp_path / "first").mkdir(), (tmp_path / "mean").mkdir()
    first = new_task(ud, tmp_path / "first")
    task = new_task(ud, tmp_path / "mean", word_pooling="mean", tokenizer=str(tmp_path / "first"))
    tok = task.tokenizer
    sentences = conllu_words(ud / "en_ewt-ud-dev.conllu")
    pieces = [[word_pieces(tok, w[1]) for w in s] for s in sentences]
    indices = [i for i, n in enumerate(pieces) if max(n) >= 3 and sum(n) + 2 <= task.max_len][:4]
    model = Scores(len(task.labels))
    ids, targets, word_of = task.collate("dev", indices)
    pooled = task.logits(model, ids, word_of)
    raw = model(ids)
    for row, i in enumerate(indices):
        position = 1  # after [CLS]
        for w in sentences[i]:
            n = word_pieces(tok, w[1])
            torch.testing.assert_close(pooled[row, position], raw[row, position : position + n].mean(0))
            position += n
    assert first.collate("dev", indices)[0].tolist() == ids.tolist() and len(first.collate("dev", indices)) == 2
    assert torch.equal(targets, first.collate("dev", indices)[1])  # still one target per word, at its start
    # Accuracy by hand from the pooled scores, over the whole split.
    correct = total = changed = 0
    for batch in task.batches("dev"):
        ids, targets, word_of = task.collate("dev", batch)
        scored = targets != IGNORE_INDEX
        tags = task.logits(model, ids, word_of).argmax(-1)[scored]
        correct += int((tags == targets[scored]).sum())
        total += int(scored.sum())
        changed += int((tags != first.logits(model, ids).argmax(-1)[scored]).sum())  # first piece
    total += task.unscored("dev")  # words cut off by max_len count as errors
    assert task.evaluate(model, torch.device("cpu"), split="dev")["accuracy"] == pytest.approx(correct / total)
    # Pooling changes the tags of words of several pieces. (Not compared through the two accuracies:
    # near chance, as this table's are, they came out equal on one CI run, 26 of 574 words each.)
    assert changed > 0


def test_word_pooling_is_first_or_mean(ud):
    with pytest.raises(ConfigError, match="word_pooling"):
        resolve(encoder_doc("tagging", ud, data={"word_pooling": "max"}))


def test_a_mean_pooling_tagger_trains_evaluates_and_tags_from_the_command_line(ud, capsys, tmp_path):
    run = tmp_path / "run"
    code, _, err = cli(
        capsys, "train", "ud-pos", "--data-dir", ud, "--out", run, "--quiet", *TINY, '--set=data.word_pooling="mean"'
    )
    assert code == 0, err
    code, out, err = cli(capsys, "eval", run, "--split", "test", "--json")
    assert code == 0, err
    assert json.loads(out)["examples"] == sum(len(s) for s in conllu_words(ud / "en_ewt-ud-test.conllu"))
    code, out, err = cli(capsys, "tag", run, "Unsuspectingly, the dogs ran .", "--json")
    assert code == 0, err
    assert [w for w, _ in json.loads(out)["sentences"][0]] == ["Unsuspectingly", ",", "the", "dogs", "ran", "."]


def test_token_dropout_masks_ordinary_subwords_only_and_the_same_way_on_resume(ud, tmp_path):
    (tmp_path / "plain").mkdir(), (tmp_path / "noisy").mkdir()
    plain = new_task(ud, tmp_path / "plain")
    # One vocabulary for both, so that the two batches differ only by the noise.
    noisy = new_task(ud, tmp_path / "noisy", token_dropout=0.3, tokenizer=str(tmp_path / "plain"))
    tok = noisy.tokenizer
    generator = torch.Generator().manual_seed(7)
    dropped = ordinary = 0
    for index in range(6):
        (ids, targets), (clean, clean_targets) = (
            noisy.train_batch(index, generator),
            plain.train_batch(index, generator),
        )
        assert torch.equal(targets, clean_targets)  # the tags stay: the model must still tag the word
        changed = ids != clean
        assert torch.all(ids[changed] == tok.mask_id)
        special = (clean == tok.pad_id) | (clean == tok.cls_id) | (clean == tok.sep_id)
        assert not changed[special].any()
        dropped += int(changed.sum())
        ordinary += int((~special).sum())
        assert torch.equal(noisy.train_batch(index, generator)[0], ids)  # a resumed run draws the same
    assert dropped / ordinary == pytest.approx(0.3, abs=0.03)
    assert not torch.equal(
        noisy.train_batch(0, generator)[0], noisy.train_batch(0, torch.Generator().manual_seed(8))[0]
    )
    # Evaluation never sees the noise.
    assert noisy.collate("val", [0])[0].tolist() == plain.collate("val", [0])[0].tolist()


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_token_dropout_must_be_a_share(ud, value):
    with pytest.raises(ConfigError, match="token_dropout"):
        resolve(encoder_doc("tagging", ud, data={"token_dropout": value}))


def test_a_cased_vocabulary_keeps_capitals(ud, tmp_path):
    (tmp_path / "cased").mkdir(), (tmp_path / "uncased").mkdir()
    cased = new_task(ud, tmp_path / "cased", lowercase=False).tokenizer
    uncased = new_task(ud, tmp_path / "uncased").tokenizer
    assert cased.encode("The") != cased.encode("the")
    assert uncased.encode("The") == uncased.encode("the")


@pytest.mark.parametrize("max_len", [64, 8])
def test_accuracy_counts_each_word_once_and_cut_words_as_errors(ud, tmp_path, max_len):
    task = new_task(ud, tmp_path, max_len=max_len)
    sentences = conllu_words(ud / "en_ewt-ud-test.conllu")
    total = sum(len(s) for s in sentences)
    kept_nouns = 0
    for s in sentences:
        position = 0
        for w in s:
            if position < max_len - 2 and w[3] == "NOUN":
                kept_nouns += 1
            position += word_pieces(task.tokenizer, w[1])
    model = Constant(task.label_ids["NOUN"], len(task.labels))
    metrics = task.evaluate(model, torch.device("cpu"), split="test")
    assert metrics["examples"] == total
    assert metrics["accuracy"] == pytest.approx(kept_nouns / total)


@pytest.mark.parametrize("run", ["bert_run", "bilstm_run"])
def test_each_model_kind_beats_the_majority_tag(run, request, ud, capsys):
    run_dir = request.getfixturevalue(run)
    assert type(load(run_dir).model).__name__ == {"bert_run": "Bert", "bilstm_run": "BiLSTM"}[run]
    tags = [w[3] for s in conllu_words(ud / "en_ewt-ud-train.conllu") for w in s]
    majority = max(Counter(tags).values()) / len(tags)
    code, out, err = cli(capsys, "eval", run_dir, "--split", "train", "--checkpoint", "last", "--json")
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["examples"] == len(tags)
    assert metrics["accuracy"] > majority + 0.25, (metrics, majority)


def test_eval_on_the_test_split(bert_run, ud, capsys):
    code, out, err = cli(capsys, "eval", bert_run, "--split", "test", "--json")
    assert code == 0, err
    metrics = json.loads(out)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert metrics["examples"] == sum(len(s) for s in conllu_words(ud / "en_ewt-ud-test.conllu"))


def test_tag_prints_word_tag_pairs_one_line_per_input(bert_run, capsys):
    labels = set(json.loads((bert_run / "labels.json").read_text())["labels"])
    code, out, err = cli(capsys, "tag", bert_run, "The dog runs .", "", "Two cats sleep, and I wait.")
    assert code == 0, err
    lines = out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == "", out
    pairs = [[item.rsplit("/", 1) for item in line.split(" ")] for line in (lines[0], lines[2])]
    assert [w for w, _ in pairs[0]] == ["The", "dog", "runs", "."]
    assert [w for w, _ in pairs[1]] == ["Two", "cats", "sleep", ",", "and", "I", "wait", "."]
    assert all(t in labels for p in pairs for _, t in p)
    code, out, _ = cli(capsys, "tag", bert_run, "The dog runs .", "", "Two cats sleep, and I wait.", "--json")
    assert json.loads(out)["sentences"] == [pairs[0], [], pairs[1]]


def test_tag_splits_words_as_ud_english_does(bert_run, capsys):
    # UD English EWT, the training data, writes "don't" as "do" "n't" and "it's" as "it" "'s".
    code, out, err = cli(capsys, "tag", bert_run, "I don't know if it's late.", "--json")
    assert code == 0, err
    words = [w for w, _ in json.loads(out)["sentences"][0]]
    assert words == ["I", "do", "n't", "know", "if", "it", "'s", "late", "."]


def test_classification_run_is_not_a_tagging_model(capsys, tmp_path_factory):
    classifier = shared(tmp_path_factory, "sst2-bert")
    capsys.readouterr()  # the training log, when this test trained the classifier
    assert_user_error(cli(capsys, "tag", classifier, "The dog runs ."), "not a tagging model")


def test_malformed_conllu_is_a_file_line_error(ud, capsys, tmp_path):
    data = tmp_path / "ud"
    shutil.copytree(ud, data)
    path = data / "en_ewt-ud-train.conllu"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines[9][0].isdigit()
    lines[9] = lines[9].replace("\t", " ")  # line 10: fields separated by spaces
    path.write_text("".join(lines), encoding="utf-8")
    result = cli(capsys, "train", "ud-pos", "--data-dir", data, "--out", tmp_path / "run", "--quiet", *TINY)
    assert_user_error(result, "en_ewt-ud-train.conllu:10", "tab-separated")


def test_a_tag_outside_upos_is_an_error_naming_the_file(capsys, tmp_path):
    data = tmp_path / "ud"
    shutil.copytree(UD, data)
    path = data / "en_ewt-ud-dev.conllu"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if line.split("\t")[0] == "3")
    fields = lines[n].split("\t")
    lines[n] = "\t".join([*fields[:3], "NOUNS", *fields[4:]])
    path.write_text("".join(lines), encoding="utf-8")
    result = cli(capsys, "train", "ud-pos", "--data-dir", data, "--out", tmp_path / "run", "--quiet", *TINY)
    assert_user_error(result, "en_ewt-ud-dev.conllu", "'NOUNS'")


def test_missing_data(capsys, tmp_path):
    assert_user_error(cli(capsys, "train", "ud-pos", "--out", tmp_path / "r", *TINY), "--data-dir")
    result = cli(capsys, "train", "ud-pos", "--data-dir", tmp_path / "none", "--out", tmp_path / "r", *TINY)
    assert_user_error(result, "does not exist")
    (tmp_path / "empty").mkdir()
    result = cli(capsys, "train", "ud-pos", "--data-dir", tmp_path / "empty", "--out", tmp_path / "r", *TINY)
    assert_user_error(result, "-ud-train.conllu")


def test_tag_probabilities_are_the_softmax_at_each_words_first_subword(bert_run):
    """What `attnlab serve`'s /v1/tags shows: every tag's probability for each word, the softmax of
    the model's scores at the word's first subword; `tag` picks the most likely."""
    from attnlab.tasks import open_task
    from attnlab.tasks.token_classification import WORD

    run = load(bert_run)
    task = open_task(run)
    text = "The quick fox can't jump."
    (scored,) = task.tag_probabilities(run.model, [text], torch.device("cpu"))
    ids, starts, _ = task.encode_sentences([WORD.findall(text)])
    with torch.no_grad():
        scores = run.model(torch.tensor(ids))[0]  # (T, tags)
    assert [w for w, _ in scored] == ["The", "quick", "fox", "ca", "n't", "jump", "."]
    for (_, probs), position in zip(scored, starts[0], strict=True):
        assert list(probs) == list(task.labels)
        expected = torch.softmax(scores[position].float(), dim=-1)
        torch.testing.assert_close(torch.tensor(list(probs.values())), expected)
    (tagged,) = task.tag(run.model, [text], torch.device("cpu"))
    assert tagged == [(w, task.labels[int(torch.tensor(list(p.values())).argmax())]) for w, p in scored]
