"""Fine-tuning a language model from a checkpoint (`attnlab train finetune-lm --init-from FOLDER`):
a Hugging Face GPT-2, Llama or Mixtral folder or an attnlab run gives the model and the tokenizer.
The proof that weights, tokenizer and loss line up: the first losses the trainer reports equal
transformers' loss on the same batches with the same weights."""

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from attnlab import load
from attnlab.checkpoints import weights_sha256
from attnlab.errors import CheckpointError
from attnlab.tasks.language_model import SOURCE_FILE, LanguageModel, SourceRecord, source_record
from attnlab.train.config import read_config
from helpers import assert_user_error, cli, hf_bert_folder, losses
from hf_folders import causal_lm_folder

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAST = [
    "--set=train.max_iters=2",
    "--set=train.lr_decay_iters=4",
    "--set=train.eval_interval=2",
    "--set=train.eval_iters=1",
    "--set=train.log_interval=1",
    "--set=train.batch_size=2",
    "--set=train.gradient_accumulation_steps=1",
    "--set=train.warmup_iters=1",
    "--set=train.device=cpu",
    "--quiet",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[Path, object, torch.nn.Module]]:
    """A GPT-2, a Llama and a Mixtral folder: (path, tokenizers.Tokenizer, transformers model). The
    weight matrices are scaled up from their tiny initialisation so that the logits are far from
    uniform: a wrong weight, token or target then moves the loss by far more than the tolerance."""
    out = {}
    for family in ("gpt2", "llama", "mixtral"):
        path = tmp_path_factory.mktemp(family)
        tok, model = causal_lm_folder(path, family)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(8.0)
        model.save_pretrained(path)
        out[family] = (path, tok, model)
    return out


def fine_tune(capsys, source: Path, out: Path, corpus: Path, *extra: str) -> tuple[int, str, str]:
    return cli(
        capsys, "train", "finetune-lm", "--init-from", source, "--out", out, f"--set=data.path={corpus}", *FAST, *extra
    )


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@torch.no_grad()
def hf_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """transformers' own loss: it shifts the labels itself, so it gets the window of T + 1 tokens."""
    window = torch.cat([x, y[:, -1:]], dim=1)  # (B, T+1)
    return model(input_ids=window, labels=window).loss.item()


def reported_batches(run_dir: Path) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The batch of the step-0 evaluation's train loss (train.eval_iters = 1) and the first training
    batch, drawn as the trainer draws them."""
    config = read_config(run_dir)
    seed, batch_size = config.train.seed, config.train.batch_size
    task = LanguageModel(config.data, config.model, run_dir, resume=True, batch_size=batch_size)
    evaluated = task.sample_batch("train", batch_size, torch.Generator().manual_seed(seed + 1_000_003))
    return evaluated, task.train_batch(0, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_first_reported_losses_equal_transformers_loss_on_the_same_batch(family, folders, corpus, tmp_path, capsys):
    path, tok, model = folders[family]
    out = tmp_path / "run"
    code, _, err = fine_tune(capsys, path, out, corpus, "--set=data.block_size=32")
    assert code == 0, err
    metrics = rows(out)
    step0 = next(r for r in metrics if r["kind"] == "eval" and r["step"] == "0")
    first = next(r for r in metrics if r["kind"] == "train")
    assert first["step"] == "1"
    evaluated, trained = reported_batches(out)
    assert evaluated[0].shape == (2, 32)
    want = hf_loss(model, *evaluated)
    assert abs(want - 5.7038) > 0.1  # ln(300): far from a uniform guess, so the weights count
    assert float(step0["train_loss"]) == pytest.approx(want, abs=1e-4)
    # The preset's dropout is 0, so the first training step's loss is the same function's.
    assert float(first["train_loss"]) == pytest.approx(hf_loss(model, *trained), abs=1e-4)
    # The corpus is encoded by the checkpoint's own tokenizer, as one stream (no "<s>" inserted).
    text = corpus.read_text(encoding="utf-8")
    task = LanguageModel(read_config(out).data, read_config(out).model, out, resume=True)
    assert task.splits.train[:40].tolist() == tok.encode(text[:400], add_special_tokens=False).ids[:40]


def test_run_takes_the_checkpoints_model_and_tokenizer_and_records_its_source(folders, corpus, tmp_path, capsys):
    path, _, _ = folders["llama"]
    out = tmp_path / "run"
    code, _, err = fine_tune(capsys, path, out, corpus)
    assert code == 0, err
    # The preset's model.block_size (1024) is capped at the checkpoint's 64 positions, and the log says so.
    assert "capped at its context" in err and "the model section's shape is not used" in err
    model = read_config(out).model
    assert (model.n_layers, model.d_model, model.n_heads, model.n_kv_heads, model.block_size) == (2, 32, 4, 2, 64)
    assert model.activation == "swiglu" and model.positions == "rope" and model.dropout == 0.0
    assert (out / "tokenizer.json").read_bytes() != b""
    ours = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    theirs = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    assert ours["model"]["vocab"] == theirs["model"]["vocab"] and ours["model"]["merges"] == theirs["model"]["merges"]
    assert source_record(out) == SourceRecord(path.resolve(), "llama", weights_sha256(path))
    # Llama's "<s>" and "</s>" are named by the checkpoint's config.json, not by attnlab's token
    # names: the run keeps them, so that sampling from it stops at "</s>".
    hf = json.loads((path / "config.json").read_text(encoding="utf-8"))
    assert (load(out).tokenizer.bos_id, load(out).tokenizer.eos_id) == (hf["bos_token_id"], hf["eos_token_id"])
    code, sample, err = cli(capsys, "sample", out, "--prompt", "ROMEO:", "--max-new-tokens", "5", "--temperature", "0")
    assert code == 0 and sample.startswith("ROMEO:"), err


def test_a_mixtral_folder_fine_tunes(folders, corpus, tmp_path, capsys):
    path, _, _ = folders["mixtral"]
    code, _, err = fine_tune(capsys, path, tmp_path / "run", corpus)
    assert code == 0, err
    assert read_config(tmp_path / "run").model.experts == 3
    assert source_record(tmp_path / "run").kind == "mixtral"


def test_resumed_run_reads_nothing_of_its_source_and_continues_as_the_uninterrupted_one(
    folders, corpus, tmp_path, capsys
):
    source = shutil.copytree(folders["gpt2"][0], tmp_path / "source")
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert fine_tune(capsys, source, whole, corpus, "--set=train.max_iters=4")[0] == 0
    assert fine_tune(capsys, source, part, corpus)[0] == 0
    shutil.rmtree(source)  # the run folder has all it needs
    code, _, err = cli(capsys, "train", part, "--resume", "--set=train.max_iters=4", "--quiet")
    assert code == 0, err
    assert losses(part) == losses(whole)
    assert load(part).model.config == load(whole).model.config


def test_an_attnlab_run_is_a_source_too(tiny_toml, corpus, tmp_path, capsys):
    scratch = tmp_path / "scratch"
    assert cli(capsys, "train", tiny_toml, "--out", scratch, "--quiet", "--set=train.device=cpu")[0] == 0
    out = tmp_path / "run"
    code, _, err = fine_tune(capsys, scratch, out, corpus)
    assert code == 0, err
    assert (out / "tokenizer.json").read_bytes() == (scratch / "tokenizer.json").read_bytes()
    source = load(scratch)
    assert read_config(out).model == source.config.model  # the same shape; block_size 16 < 1024 kept
    assert source_record(out) == SourceRecord(scratch.resolve(), "attnlab", weights_sha256(scratch))
    evaluated, _ = reported_batches(out)
    with torch.no_grad():
        want = source.model(*evaluated)[1].item()
    step0 = next(r for r in rows(out) if r["kind"] == "eval")
    assert float(step0["train_loss"]) == pytest.approx(want, abs=1e-4)


def test_a_run_from_scratch_has_no_source_record_and_a_damaged_one_is_refused(folders, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert fine_tune(capsys, folders["gpt2"][0], out, corpus)[0] == 0
    assert source_record(tmp_path) is None
    (out / SOURCE_FILE).write_text('{"format_version": 1, "path": "x"}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="source.json"):
        source_record(out)


def _break(case: str, folder: Path) -> None:
    """Make `folder` (a copy of the GPT-2 folder) into the bad input `case`."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if case == "t5":
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "t5"}), encoding="utf-8")
    elif case == "no-tokenizer":
        (folder / "tokenizer.json").unlink()
    elif case == "corrupt-tokenizer":
        (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ', encoding="utf-8")
    elif case == "not-a-checkpoint":
        for f in folder.iterdir():
            f.unlink()
        (folder / "notes.txt").write_text("hello", encoding="utf-8")


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("not-a-checkpoint", ("not a checkpoint", "config.json")),
        ("missing", ("no such folder",)),
        ("t5", ("model_type is 't5'", "gpt2, llama, mixtral")),
        ("bert", ("model_type is 'bert'",)),
        ("no-tokenizer", ("tokenizer.json",)),
        ("corrupt-tokenizer", ("tokenizer.json", "not JSON")),
        ("another-task", ("'text-classification' run, not a language model",)),
        ("block-size", ("data.block_size 65 is past the context", "64 tokens")),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_run_folder(case, fragments, folders, corpus, tmp_path, capsys):
    source = tmp_path / "source"
    extra = []
    if case == "bert":
        hf_bert_folder(source)
    elif case == "another-task":
        source = FIXTURES / "run-format2" / "bert-classification"
    elif case == "block-size":
        source, extra = folders["gpt2"][0], ["--set=data.block_size=65"]
    elif case != "missing":
        shutil.copytree(folders["gpt2"][0], source)
        _break(case, source)
    out = tmp_path / "run"
    capsys.readouterr()  # transformers' progress bar from writing the BERT folder
    assert_user_error(fine_tune(capsys, source, out, corpus, *extra), *fragments)
    assert not out.exists()


def test_block_size_without_a_checkpoint_is_refused(tiny_toml, tmp_path, capsys):
    out = tmp_path / "run"
    result = cli(capsys, "train", tiny_toml, "--out", out, "--set=data.block_size=8", "--quiet")
    assert_user_error(result, "data.block_size is for a run that starts from a checkpoint")
    assert not out.exists()


def test_init_from_is_refused_for_a_task_without_it(tmp_path, capsys):
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "config.toml").write_text('task = "language-model"\n')  # a run folder by its look
    result = cli(capsys, "train", "cora-gcn", "--init-from", tmp_path / "source", "--out", tmp_path / "run")
    assert_user_error(result, "--init-from is for language models and the encoder tasks")


def test_a_run_from_scratch_can_take_another_runs_tokenizer(folders, tiny_toml, corpus, tmp_path, capsys):
    """data.tokenizer_file: the baseline trained from scratch reads the same tokens as the fine-tuned
    model (a Hugging Face folder's tokenizer.json here), so that their losses per token compare."""
    given = folders["gpt2"][0] / "tokenizer.json"
    out = tmp_path / "scratch"
    code, _, err = cli(capsys, "train", tiny_toml, "--out", out, f"--set=data.tokenizer_file={given}", *FAST)
    assert code == 0, err
    run = load(out)
    assert run.model.config.vocab_size == folders["gpt2"][1].get_vocab_size()
    text = "ROMEO: What say you?"
    assert run.tokenizer.encode(text) == folders["gpt2"][1].encode(text, add_special_tokens=False).ids
    assert source_record(out) is None  # weights from scratch: nothing to record
    missing = tmp_path / "other"
    assert_user_error(
        cli(capsys, "train", tiny_toml, "--out", missing, f"--set=data.tokenizer_file={tmp_path / 'no.json'}", *FAST),
        "does not exist",
    )
    assert not missing.exists()
