"""The position schemes and attention patterns from the command line: `--set model.positions=...`,
`--set model.attention=...`, `attnlab eval --context N`, and the one-line errors for what cannot work."""

import json

import pytest

from attnlab.config import dump_toml
from helpers import _tiny_doc, assert_user_error, cli

pytestmark = pytest.mark.slow


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
        (["model.positions=rope", "model.d_model=30", "model.n_heads=2"], ["rope", "even"]),
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


def test_attention_maps_draw_a_patterned_model(capsys, lm_toml, tmp_path):
    run = tmp_path / "alibi-bigbird"
    sets = ("model.positions=alibi", "model.attention=bigbird", "model.attention_block=4", "model.random_blocks=0")
    assert train(capsys, lm_toml, run, *sets)[0] == 0
    code, out, err = cli(
        capsys, "attention", str(run), "--text", "ROMEO: But soft", "--out", str(tmp_path / "a.png"), "--json"
    )
    assert code == 0, err
    assert (tmp_path / "a.png").exists() and json.loads(out)["layers"] == 2
    # BigBird under the causal mask: block 4, one global block, no random blocks. The query at 14
    # sees its own block (12-14), the one before (8-11) and the global one (0-3), not 4-7.
    from attnlab import load
    from attnlab.viz.maps import attention_maps

    weights = attention_maps(load(run), "ROMEO: But soft").weights[0]  # (H, T, T) of layer 0
    assert (weights[:, 14, 4:8] == 0).all() and (weights[:, 14, 8:15] > 0).all() and (weights[:, 14, :4] > 0).all()


def test_linformer_bert_trains_and_its_attention_map_is_refused(capsys, tmp_path):
    doc = _tiny_doc("mlm", tmp_path)
    doc["model"].update(attention="linformer", linformer_k=8)
    doc["train"].update(max_iters=2, eval_interval=2, eval_iters=1)
    toml = tmp_path / "mlm.toml"
    toml.write_text(dump_toml(doc), encoding="utf-8")
    run = tmp_path / "linformer"
    code, _, err = cli(capsys, "train", str(toml), "--out", str(run), "--quiet")
    assert code == 0, err
    out = tmp_path / "a.png"
    assert_user_error(cli(capsys, "attention", str(run), "--text", "the cat", "--out", str(out)), "Linformer")
    assert not out.exists()
