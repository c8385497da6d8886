"""Transfer: pre-train a tiny masked LM, then fine-tune classification runs from it (`--init-from`),
or from a Hugging Face BERT folder. The fine-tuned run must take the vocabulary, the architecture
and the encoder weights of its source, and get a fresh head."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import load
from attnlab.cli import main
from attnlab.config import load_preset_or_file
from attnlab.data.tokenizers import WordPieceTokenizer
from attnlab.tasks import TextClassification
from attnlab.train import resolve
from attnlab.train.config import apply_overrides
from helpers import SST2, assert_user_error, cli, hf_bert_folder, shared

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

FINE_TUNE = [
    "--set=data.val_size=40",
    "--set=data.max_tokens=600",
    "--set=train.max_iters=4",
    "--set=train.eval_interval=2",
    "--set=train.warmup_iters=1",
    "--set=train.device=cpu",
    "--quiet",
]


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "mlm")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    return hf_bert_folder(tmp_path_factory.mktemp("hf-bert"))


def fine_tune(out: Path, source: Path, *extra: str) -> int:
    return main(
        ["train", "sst2", "--data-dir", str(SST2), "--init-from", str(source), "--out", str(out), *FINE_TUNE, *extra]
    )


@pytest.fixture(scope="module")
def fine_tuned(mlm_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fine-tuned") / "run"
    assert fine_tune(out, mlm_run) == 0
    return out


def sst2_task(run_dir: Path, init_from: Path) -> TextClassification:
    """The classification task of a new run of the sst2 preset that starts from `init_from`."""
    _, doc = load_preset_or_file("sst2")
    doc = apply_overrides(doc, {"data": {"data_dir": str(SST2), "init_from": str(init_from), "val_size": 40}})
    config = resolve(doc)
    return TextClassification(config.data, config.model, run_dir)


def encoder_items(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith("head.")}


def test_fine_tuned_run_takes_the_vocabulary_and_architecture_of_its_source(fine_tuned, mlm_run):
    preset = load_preset_or_file("sst2")[1]["model"]
    source, run = load(mlm_run).config.model, load(fine_tuned).config.model
    assert (preset["d_model"], preset["n_layers"]) != (source.d_model, source.n_layers)  # the preset is bigger
    for field in ("d_model", "n_layers", "n_heads", "d_ff", "max_len", "vocab_size"):
        assert getattr(run, field) == getattr(source, field), field
    assert (run.head, run.n_labels) == ("sequence", 2)
    ours = json.loads((fine_tuned / "tokenizer.json").read_text(encoding="utf-8"))
    assert ours == json.loads((mlm_run / "tokenizer.json").read_text(encoding="utf-8"))


def test_a_new_run_starts_with_the_pretrained_encoder_and_a_fresh_head(mlm_run, tmp_path):
    pretrained = load(mlm_run).model.state_dict()  # the best weights
    task = sst2_task(tmp_path, mlm_run)
    heads = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = task.build_model()
        fresh = {k: v.clone() for k, v in model.state_dict().items()}
        task.initialize(model)
        state = model.state_dict()
        encoder = encoder_items(state)
        assert encoder.keys() == encoder_items(pretrained).keys()
        for name, tensor in encoder.items():
            assert torch.equal(tensor, pretrained[name]), name
            assert not torch.equal(fresh[name], pretrained[name]) or "norm" in name or "bias" in name, name
        head = {k: v for k, v in state.items() if k.startswith("head.")}
        assert head and all(v.shape[0] == 2 for v in head.values())  # 2 labels, not the MLM vocabulary
        assert all(torch.equal(v, fresh[k]) for k, v in head.items())  # left as initialised
        heads.append(head)
    assert not torch.equal(heads[0]["head.proj.weight"], heads[1]["head.proj.weight"])


def test_training_starts_from_the_pretrained_weights(mlm_run, tmp_path):
    # One step at a learning rate of 1e-9 moves no weight measurably: the checkpoint shows where
    # training started.
    tiny_lr = [
        "--set=train.learning_rate=1e-9",
        "--set=train.min_lr=0",
        "--set=train.max_iters=1",
        "--set=train.eval_interval=1",
    ]
    assert fine_tune(tmp_path / "run", mlm_run, *tiny_lr) == 0
    started = encoder_items(load_file(tmp_path / "run" / "model.safetensors"))
    pretrained = encoder_items(load(mlm_run).model.state_dict())
    assert started.keys() == pretrained.keys()
    for name, tensor in started.items():
        torch.testing.assert_close(tensor, pretrained[name], atol=1e-6, rtol=0, msg=name)


def test_resume_of_a_fine_tuning_run_continues_it_bit_for_bit(mlm_run, tmp_path, capsys):
    schedule = ["--set=train.lr_decay_iters=6"]
    assert fine_tune(tmp_path / "straight", mlm_run, *schedule, "--set=train.max_iters=6") == 0
    assert fine_tune(tmp_path / "split", mlm_run, *schedule) == 0
    assert load(tmp_path / "split", checkpoint="last").step == 4
    assert fine_tune(tmp_path / "split", mlm_run, *schedule, "--set=train.max_iters=6", "--resume") == 0
    assert load(tmp_path / "split", checkpoint="last").step == 6
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "split" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fine_tuned_run_is_usable_without_its_source_folder(mlm_run, tmp_path, capsys):
    # A run folder holds all it needs: moving or deleting the pre-training run must not break it.
    source = tmp_path / "pretrained"
    shutil.copytree(mlm_run, source)
    assert fine_tune(tmp_path / "run", source, "--set=train.max_iters=2") == 0
    shutil.rmtree(source)
    capsys.readouterr()
    code, out, err = cli(capsys, "classify", tmp_path / "run", "a great movie")
    assert code == 0, err
    assert len(out.splitlines()) == 1
    code, out, err = cli(capsys, "eval", tmp_path / "run", "--split", "dev", "--json")
    assert code == 0, err


def test_init_from_a_hugging_face_bert_folder(hf_folder, tmp_path, capsys):
    (tmp_path / "task").mkdir()
    task = sst2_task(tmp_path / "task", hf_folder)
    torch.manual_seed(0)
    model = task.build_model().eval()
    task.initialize(model)
    hf = transformers.BertModel.from_pretrained(hf_folder).eval()
    rows = [task.wrap(task.tokenizer.encode(t)) for t in ("a great movie , really", "awful")]
    ids = torch.zeros(2, max(map(len, rows)), dtype=torch.long)  # [PAD] is id 0 in the vocab.txt
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    assert (ids == 0).any()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state
        ours = model.encode(ids)
    real = ids != 0
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)

    assert fine_tune(tmp_path / "run", hf_folder, "--set=train.max_iters=3") == 0
    run = load(tmp_path / "run", checkpoint="last")
    assert run.step == 3 and run.config.model.d_model == 32 and run.config.model.n_layers == 2
    vocab = WordPieceTokenizer.from_vocab_txt(hf_folder / "vocab.txt")
    assert run.config.model.vocab_size == vocab.vocab_size
    assert run.tokenizer.encode("a great movie , really") == vocab.encode("a great movie , really")


def test_init_from_errors(mlm_run, capsys, tmp_path, tmp_path_factory, tiny_toml):
    def sst2(source: Path, *extra: str) -> tuple[int, str, str]:
        out = tmp_path / "runs" / str(len(list(tmp_path.glob("runs/*"))))
        return cli(capsys, "train", "sst2", "--data-dir", SST2, "--init-from", source, "--out", out, *FINE_TUNE, *extra)

    assert_user_error(sst2(tmp_path / "none"), "none")
    (tmp_path / "empty").mkdir()
    assert_user_error(sst2(tmp_path / "empty"), "empty", "config.toml", "config.json")
    assert_user_error(sst2(mlm_run, "--set=model.kind=bilstm"), "model.kind", "bert")
    result = cli(capsys, "train", str(tiny_toml), "--init-from", mlm_run, "--out", tmp_path / "lm", "--quiet")
    assert_user_error(result, "--init-from", "'masked-lm' run, not a language model")
    bilstm = shared(tmp_path_factory, "sst2-bilstm")
    capsys.readouterr()  # the training log, when this test trained the BiLSTM
    assert_user_error(sst2(bilstm), "BiLSTM", "BERT")
