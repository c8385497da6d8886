"""`attnlab export RUN --to hf OUT_DIR` on tiny trained runs of each family: transformers loads the
folder offline and computes the run's logits on the run's own token ids, attnlab's importers read
it back, and runs, parts and folders it cannot export are refused in one line with exit code 2."""

import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.data.text import bundled_shakespeare
from attnlab.models.hf import load_bert, load_causal_lm
from attnlab.models.hf.marian import load_marian
from attnlab.train import resolve, train
from helpers import SST2, TINY_MT, UD, WIKITEXT, assert_user_error, cli, encoder_doc, translation_doc, write_fifty_pairs

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
TEXT = "Before we proceed any further, hear me speak."
TWO_STEPS = dict(max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1, log_interval=1)
LLAMA_PARTS = dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False)


def lm_doc(folder: Path, **model) -> dict:
    corpus = folder / "corpus.txt"
    corpus.write_text(bundled_shakespeare()[:5_000], encoding="utf-8")
    return {
        "task": "lm",
        "model": {"block_size": 16, "n_layers": 2, "n_heads": 2, "d_model": 32, **model},
        "data": {"path": str(corpus), "tokenizer": "char"},
        "train": {"batch_size": 4, **TWO_STEPS},
    }


def mt_doc(folder: Path, kind: str) -> dict:
    doc = translation_doc(write_fifty_pairs(folder / "data"), kind, **TWO_STEPS)
    doc["model"].update(TINY_MT[kind])
    doc["data"].update(vocab_size=300, eval_beam=1)
    return doc


DOCS = {
    "gpt2": lambda folder: lm_doc(folder, bias=False),  # as the shakespeare-char preset
    "llama": lambda folder: lm_doc(folder, **LLAMA_PARTS),
    "alibi": lambda folder: lm_doc(folder, positions="alibi"),
    "mlm": lambda folder: encoder_doc("mlm", WIKITEXT, **TWO_STEPS),
    "classification": lambda folder: encoder_doc("classification", SST2, **TWO_STEPS),
    "tagging": lambda folder: encoder_doc("tagging", UD, **TWO_STEPS),
    "translation": lambda folder: mt_doc(folder, "transformer"),
    "rnn": lambda folder: mt_doc(folder, "rnn-attention"),
}
_RUNS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of DOCS[name], trained for two steps the first time a test asks for it."""

    def get(name: str) -> Path:
        """The run folder; what training printed is the caller's to clear (`capsys.readouterr()`)."""
        if name not in _RUNS:
            folder = tmp_path_factory.mktemp(name)
            train(resolve(DOCS[name](folder)), folder / "run", progress=False)
            _RUNS[name] = folder / "run"
        return _RUNS[name]

    return get


def export(capsys, run: Path, out: Path, *extra: str) -> dict:
    code, stdout, err = cli(capsys, "export", run, "--to", "hf", out, "--json", *extra)
    assert code == 0, err
    return json.loads(stdout)


def hf_model(auto: str, folder: Path):
    return getattr(transformers, auto).from_pretrained(folder, local_files_only=True).eval()


def hf_ids(folder: Path, text: str) -> list[int]:
    return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)(text)["input_ids"]


@pytest.mark.parametrize(("name", "architecture"), [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM")])
def test_a_gpt_run_becomes_a_causal_lm_folder(trained, capsys, tmp_path, name, architecture):
    run = attnlab.load(trained(name))
    summary = export(capsys, run.path, tmp_path / "hf")
    assert summary["architecture"] == architecture and summary["step"] == run.step
    ids = hf_ids(tmp_path / "hf", TEXT[:16])
    assert ids == run.tokenizer.encode(TEXT[:16])
    x = torch.tensor([ids])
    with torch.no_grad():
        ours = run.model(x)
        torch.testing.assert_close(hf_model("AutoModelForCausalLM", tmp_path / "hf")(x).logits, ours, atol=ATOL, rtol=0)
        back = load_causal_lm(tmp_path / "hf")
        torch.testing.assert_close(back.model(x), ours, atol=ATOL, rtol=0)
    assert back.tokenizer.encode(TEXT[:16]) == ids


@pytest.mark.parametrize(
    ("name", "auto", "architecture"),
    [
        ("mlm", "AutoModelForMaskedLM", "BertForMaskedLM"),
        ("classification", "AutoModelForSequenceClassification", "BertForSequenceClassification"),
        ("tagging", "AutoModelForTokenClassification", "BertForTokenClassification"),
    ],
)
def test_a_bert_run_becomes_the_bert_class_of_its_task(trained, capsys, tmp_path, name, auto, architecture):
    run = attnlab.load(trained(name))
    assert export(capsys, run.path, tmp_path / "hf")["architecture"] == architecture
    ids = hf_ids(tmp_path / "hf", TEXT)
    tok = run.tokenizer
    assert ids == [tok.cls_id, *tok.encode(TEXT), tok.sep_id]  # the input attnlab's encoder tasks build
    x = torch.tensor([ids])
    theirs = hf_model(auto, tmp_path / "hf")
    with torch.no_grad():
        ours = run.model(x)
        torch.testing.assert_close(theirs(x).logits, ours, atol=ATOL, rtol=0)
        back = load_bert(tmp_path / "hf")
        torch.testing.assert_close(back.model(x), ours, atol=ATOL, rtol=0)
    if name != "mlm":
        labels = json.loads((run.path / "labels.json").read_text())["labels"]
        assert [theirs.config.id2label[i] for i in range(len(labels))] == labels == back.labels


def test_a_translation_run_becomes_a_marian_folder(trained, capsys, tmp_path):
    run = attnlab.load(trained("translation"))
    assert export(capsys, run.path, tmp_path / "hf")["architecture"] == "MarianMTModel"
    source = "Ein Mann schläft."
    ids = hf_ids(tmp_path / "hf", source)
    assert ids == run.tokenizer.encode(source)  # no </s>: attnlab's sources carry none
    src = torch.tensor([ids])
    tgt = torch.tensor([[run.tokenizer.bos_id, *run.tokenizer.encode("A man")]])
    with torch.no_grad():
        ours = run.model(src, tgt)
        theirs = hf_model("AutoModelForSeq2SeqLM", tmp_path / "hf")
        torch.testing.assert_close(theirs(input_ids=src, decoder_input_ids=tgt).logits, ours, atol=ATOL, rtol=0)
        torch.testing.assert_close(load_marian(tmp_path / "hf")(src, tgt), ours, atol=ATOL, rtol=0)
    assert theirs.config.decoder_start_token_id == run.tokenizer.bos_id


def test_a_part_transformers_lacks_is_refused_by_name(trained, capsys, tmp_path):
    run = trained("alibi")
    capsys.readouterr()  # training's own lines
    result = cli(capsys, "export", run, "--to", "hf", tmp_path / "hf")
    assert_user_error(result, str(run), "cannot export to transformers GPT-2", "positions = 'alibi'")
    assert not (tmp_path / "hf").exists()


def test_a_run_of_a_family_transformers_lacks_is_refused(trained, capsys, tmp_path):
    run = trained("rnn")
    capsys.readouterr()  # training's own lines
    result = cli(capsys, "export", run, "--to", "hf", tmp_path / "hf")
    assert_user_error(result, "task 'translation' with model 'gru-attention' has no transformers counterpart")


def test_a_folder_that_is_no_run_is_refused(capsys, tmp_path):
    assert_user_error(cli(capsys, "export", tmp_path, "--to", "hf", tmp_path / "hf"), "is not a run folder")


def test_an_existing_folder_is_replaced_only_with_force(trained, capsys, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    run = trained("gpt2")
    capsys.readouterr()  # training's own lines
    assert_user_error(cli(capsys, "export", run, "--to", "hf", out), str(out), "not empty", "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]

    export(capsys, run, out, "--force")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no staging or old folder left beside it
    # Never over the run itself, even with --force.
    assert_user_error(cli(capsys, "export", run, "--to", "hf", run.parent, "--force"), "holds the run")
    assert (run / "config.toml").exists()


def test_an_empty_folder_is_filled_and_the_format_is_checked(trained, capsys, tmp_path):
    (tmp_path / "hf").mkdir()
    export(capsys, trained("gpt2"), tmp_path / "hf")
    code, _, err = cli(capsys, "export", trained("gpt2"), "--to", "onnx", tmp_path / "other")
    assert code == 2 and "invalid choice: 'onnx'" in err
