"""The position schemes and attention patterns from the command line: `--set model.positions=...`,
`--set model.attention=...`, `attnlab eval --context N`, and the one-line errors for what cannot work."""

import json

import pytest

from attnlab.config import dump_toml
from helpers import _tiny_doc, assert_user_error, cli


@pytest.fixture(scope="module")
def lm_toml(tmp_path_factory):
    folder = tmp_path_factory.mktemp("positions-cli")
    doc = _tiny_doc("lm", folder)
    doc["train"].update(max_iters=2, eval_interval=2)
    path = folder / "lm.toml"
    path.write_text(dump_toml(doc), encoding="utf-8")
    return path


def train(capsys, toml, out, *sets: str):
    args = ["train", str(toml), "--out", str(out), "--quiet", "--json"]
    for s in sets:
        args += ["--set", s]
    return cli(capsys, *args)


def test_rope_run_trains_samples_and_evaluates_past_its_block(capsys, lm_toml, tmp_path):
    run = tmp_path / "rope"
    code, out, err = train(
        capsys, lm_toml, run, "model.positions=rope", "model.attention=window", "model.attention_window=8"
    )
    assert code == 0, err
    assert json.loads(out)["step"] == 2
    code, out, err = cli(capsys, "sample", str(run), "--prompt", "ROMEO", "--max-new-tokens", "40", "--seed", "1")
    assert code == 0, err
    for context in (16, 64):  # block_size 16: 1x and 4x
        code, out, err = cli(capsys, "eval", str(run), "--context", str(context), "--max-tokens", "512", "--json")
        assert code == 0, err
        metrics = json.loads(out)
        assert metrics["context"] == context and metrics["val_loss"] > 0


def test_learned_positions_refuse_a_longer_context_in_one_line(capsys, lm_toml, tmp_path):
    run = tmp_path / "learned"
    assert train(capsys, lm_toml, run)[0] == 0
    assert_user_error(cli(capsys, "eval", str(run), "--context", "17"), "learned positions", "block_size 16")
    assert_user_error(cli(capsys, "eval", str(run), "--context", "0"), "--context must be >= 1")
    assert cli(capsys, "eval", str(run), "--context", "16", "--json")[0] == 0


@pytest.mark.parametrize(
    ("sets", "fragments"),
    [
        (["model.positions=rotary"], ["positions must be one of", "'rope'"]),
        (["model.positions=alibbi"], ["did you mean 'alibi'"]),
        (["model.attention=linformer"], ["linformer", "causal"]),
        (["model.attention=bigbrd"], ["did you mean 'bigbird'"]),
        (["model.attention=window", "model.attention_window=0"], ["attention_window must be >= 1"]),
        (["model.attention=bigbird", "model.attention_block=-2"], ["attention_block must be >= 1"]),
        (["model.positions=rope", "model.n_embd=30", "model.n_head=2"], ["rope", "even"]),
        (["model.rope_theta=0"], ["rope_theta must be > 0"]),
    ],
)
def test_what_cannot_work_is_one_line_and_writes_nothing(capsys, lm_toml, tmp_path, sets, fragments):
    run = tmp_path / "never"
    assert_user_error(train(capsys, lm_toml, run, *sets), *fragments)
    assert not run.exists()


def test_eval_context_is_for_language_models(capsys, tmp_path_factory):
    from helpers import shared

    run = shared(tmp_path_factory, "mt-transformer")
    capsys.readouterr()  # what training that run printed, when this test was the first to ask for it
    assert_user_error(cli(capsys, "eval", str(run), "--context", "64"), "--context is for language models")
