"""`attnlab train multi30k-de-en`, `translate` and `eval` as a user runs them, on the fixture."""

import json
from pathlib import Path

import pytest

from attnlab.cli import main
from helpers import FIXTURE, assert_user_error, cli

pytestmark = pytest.mark.slow

TINY = [
    "--set=data.vocab_size=400",
    "--set=data.max_len=40",
    "--set=model.d_model=32",
    "--set=model.n_heads=2",
    "--set=model.d_ff=64",
    "--set=model.n_encoder_layers=1",
    "--set=model.n_decoder_layers=1",
    "--set=train.max_iters=8",
    "--set=train.eval_interval=4",
    "--set=train.warmup_iters=2",
]


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("mt") / "run"
    code = main(["train", "multi30k-de-en", "--data-dir", str(FIXTURE), "--out", str(run_dir), "--quiet", *TINY])
    assert code == 0
    return run_dir


def test_train_writes_a_translation_run_with_a_best_checkpoint(mt_run):
    for name in ("config.toml", "model.safetensors", "best.safetensors", "best.json", "tokenizer.json"):
        assert (mt_run / name).is_file(), name
    assert "val_bleu" in json.loads((mt_run / "best.json").read_text())


def test_translate_text_and_file_one_line_per_line(mt_run, capsys, tmp_path):
    code, out, _ = cli(capsys, "translate", mt_run, "Ein Mann fährt Fahrrad.", "--beam", "2")
    assert code == 0 and len(out.splitlines()) == 1
    src = tmp_path / "in.de"
    src.write_text("Ein Hund läuft.\n\nZwei Kinder spielen im Park.\n", encoding="utf-8")
    code, out, _ = cli(capsys, "translate", mt_run, "--input", src, "--json")
    assert code == 0
    translations = json.loads(out)["translations"]
    assert len(translations) == 3 and translations[1] == ""


def test_beam_one_equals_greedy_through_the_cli(mt_run, capsys):
    text = "Eine Frau mit einem roten Hut sitzt auf einer Bank."
    greedy = cli(capsys, "translate", mt_run, text, "--beam", "1")[1]
    again = cli(capsys, "translate", mt_run, text, "--beam", "1")[1]
    assert greedy == again


def test_fused_translate_writes_what_the_eager_one_does(mt_run, capsys, tmp_path):
    from attnlab.accel.fused import extension

    if extension() is None:
        pytest.skip("the fused step could not be built here")
    src = tmp_path / "in.de"
    src.write_text("Ein Hund läuft.\nZwei Kinder spielen im Park.\nEine Frau liest ein Buch.\n", encoding="utf-8")
    code, eager, _ = cli(capsys, "translate", mt_run, "--input", src, "--beam", "3", "--no-fused")
    assert code == 0
    code, fused, _ = cli(capsys, "translate", mt_run, "--input", src, "--beam", "3", "--fused")
    assert code == 0 and fused == eager and len(fused.splitlines()) == 3


def test_attention_png(mt_run, capsys, tmp_path):
    out = tmp_path / "align.png"
    code, _, err = cli(capsys, "translate", mt_run, "Ein Mann schläft.", "--attention", out)
    assert code == 0 and "alignment saved" in err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_reports_both_bleus_and_the_signature(mt_run, capsys):
    code, out, _ = cli(capsys, "eval", mt_run, "--split", "test2016", "--beam", "2", "--json")
    assert code == 0
    metrics = json.loads(out)
    assert {"bleu", "bleu_lc_tok", "sacrebleu_signature"} <= set(metrics)
    assert metrics["sentences"] == 50 and "nrefs:1" in metrics["sacrebleu_signature"]


@pytest.mark.parametrize("built", [True, False])
def test_eval_decodes_with_the_fused_step_where_it_is_built_and_scores_the_same(mt_run, capsys, monkeypatch, built):
    from attnlab.accel import fused

    if built and fused.extension() is None:
        pytest.skip("the fused step could not be built here")
    states = []
    decoder_state = fused.decoder_state
    monkeypatch.setattr(fused, "decoder_state", lambda *a: states.append(1) or decoder_state(*a))
    monkeypatch.setattr(fused, "is_built", lambda: built)
    code, out, _ = cli(capsys, "eval", mt_run, "--split", "test2016", "--beam", "2", "--json")
    assert code == 0 and bool(states) == built
    monkeypatch.setattr(fused, "is_built", lambda: not built)
    code, other, _ = cli(capsys, "eval", mt_run, "--split", "test2016", "--beam", "2", "--json")
    assert code == 0 and json.loads(other)["bleu"] == json.loads(out)["bleu"]


def test_long_input_is_cut_with_a_warning(mt_run, capsys):
    code, out, err = cli(capsys, "translate", mt_run, " ".join(["Hund"] * 200), "--beam", "1")
    assert code == 0 and "longer than 40 tokens were cut" in err and len(out.splitlines()) == 1


def test_translate_errors(mt_run, capsys, tmp_path):
    assert_user_error(cli(capsys, "translate", mt_run), "nothing to translate")
    assert_user_error(cli(capsys, "eval", mt_run, "--split", "test2099"), "unknown Multi30k split", "test2016")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Ein Hund.\nZwei \xff Hunde.\n")
    assert_user_error(cli(capsys, "translate", mt_run, "--input", bad), "bad.txt:2 is not UTF-8")


def test_language_model_run_is_not_a_translation_model(capsys, tmp_path, tiny_toml):
    run_dir = tmp_path / "lm"
    assert main(["train", str(tiny_toml), "--out", str(run_dir), "--quiet", "--set", "train.max_iters=2"]) == 0
    capsys.readouterr()  # the training output is not under test here
    assert_user_error(cli(capsys, "translate", run_dir, "Hallo"), "not a translation model")


def test_train_without_data_dir(capsys, tmp_path):
    assert_user_error(cli(capsys, "train", "multi30k-de-en", "--out", tmp_path / "r"), "--data-dir")
    assert_user_error(
        cli(capsys, "train", "multi30k-de-en", "--out", tmp_path / "r", "--data-dir", tmp_path / "none"),
        "does not exist",
    )
