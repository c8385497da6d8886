"""The command line end to end, on a tiny real run, and every bad input the user can give it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.checkpoints import WEIGHTS
from attnlab.cli import main
from attnlab.cli.demo import attnlab_command
from helpers import assert_user_error, cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """One tiny run shared by the read-only tests of this module."""
    from attnlab.data.text import bundled_shakespeare

    folder = tmp_path_factory.mktemp("cli")
    corpus = folder / "corpus.txt"
    corpus.write_text(bundled_shakespeare()[:20_000])
    run_dir = folder / "run"
    code = main(
        ["train", "shakespeare-char-cpu", "--out", str(run_dir), "--quiet", "--set", f"data.path={corpus}"]
        + [f"--set={kv}" for kv in ("train.max_iters=6", "train.eval_interval=3", "train.eval_iters=2")]
        + [f"--set={kv}" for kv in ("model.block_size=16", "model.n_layers=1", "model.d_model=32", "model.n_heads=2")]
    )
    assert code == 0
    return run_dir


def test_every_command_has_help(capsys):
    for command in ("train", "sample", "eval", "demo"):
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and out.startswith("usage: attnlab " + command)


def test_train_json_sample_and_eval(trained_run, capsys, tiny_toml, tmp_path):
    code, out, _ = cli(capsys, "train", tiny_toml, "--out", tmp_path / "run", "--json", "--set", "train.max_iters=4")
    assert code == 0
    summary = json.loads(out)
    assert summary["step"] == 4 and summary["run"] == str(tmp_path / "run") and summary["val_loss"] > 0

    code, out, _ = cli(capsys, "eval", trained_run, "--json")
    assert code == 0
    metrics = json.loads(out)
    assert set(metrics) >= {"val_loss", "val_ppl"}
    assert metrics["val_ppl"] == pytest.approx(2.718281828 ** metrics["val_loss"], rel=1e-6)

    code, out, _ = cli(capsys, "sample", trained_run, "--prompt", "ROMEO:", "--max-new-tokens", "30", "--json")
    assert code == 0
    sample = json.loads(out)["samples"][0]
    assert 0 < len(sample) <= 30  # char tokenizer: one character per token


def test_sample_is_seeded_and_streaming_prints_the_same_text(trained_run, capsys):
    args = ("sample", trained_run, "--prompt", "First", "--max-new-tokens", "40", "--seed", "7")
    _, first, _ = cli(capsys, *args)
    _, second, _ = cli(capsys, *args)
    _, streamed, _ = cli(capsys, *args, "--stream")
    _, other_seed, _ = cli(capsys, *args[:-1], "8")
    assert first == second == streamed
    assert first != other_seed
    assert first.startswith("First")


@pytest.mark.parametrize(
    "flag, fallback",  # the warning each way gives when it falls back to the eager step
    [("--compile", "compiled decoding failed"), ("--fused", "decoding eagerly")],
)
def test_compiled_and_fused_greedy_samples_print_the_eager_text(trained_run, capsys, recwarn, flag, fallback):
    args = ("sample", trained_run, "--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "12")
    code, eager, _ = cli(capsys, *args, "--no-fused")
    assert code == 0
    code, faster, _ = cli(capsys, *args, flag)
    assert code == 0
    assert not [w for w in recwarn if fallback in str(w.message)]  # it did not fall back
    assert faster == eager and len(eager) > len("ROMEO:")


@pytest.mark.parametrize("built", [True, False])
def test_sample_takes_the_fused_step_by_default_where_it_is_built_and_never_builds_it(
    trained_run, capsys, monkeypatch, built
):
    from attnlab.accel import fused

    steps = []
    gpt_step = fused.gpt_step
    monkeypatch.setattr(fused, "gpt_step", lambda *a: steps.append(1) or gpt_step(*a))
    monkeypatch.setattr(fused, "is_built", lambda: built)
    if not built:
        monkeypatch.setattr(fused, "extension", lambda: pytest.fail("the default must not build the fused step"))
    args = ("sample", trained_run, "--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "12")
    code, default, _ = cli(capsys, *args)
    assert code == 0 and len(steps) == (1 if built else 0)
    code, eager, _ = cli(capsys, *args, "--no-fused")
    assert code == 0 and len(steps) == (1 if built else 0) and default == eager
    code, _, _ = cli(capsys, *args, "--compile")  # --compile alone: the compiled step, not the fused one
    assert code == 0 and len(steps) == (1 if built else 0)


def test_sample_refuses_compile_and_fused_together(trained_run, capsys):
    code, _, err = cli(capsys, "sample", trained_run, "--compile", "--fused")
    assert code == 2 and "pick one" in err


def test_greedy_sample_with_stop_string(trained_run, capsys):
    base = ("sample", trained_run, "--prompt", "A", "--temperature", "0", "--max-new-tokens", "60", "--json")
    full = json.loads(cli(capsys, *base)[1])["samples"][0]
    stop = full[5:7]
    cut = json.loads(cli(capsys, *base, "--stop", stop)[1])["samples"][0]
    assert cut == full[: full.index(stop)]


def test_unknown_preset_suggests_close_matches(capsys):
    assert_user_error(cli(capsys, "train", "shakespeare-char-cp"), "unknown preset", "shakespeare-char-cpu")


def test_unknown_config_key_is_named_with_suggestion(capsys, tiny_toml, tmp_path):
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "r", "--set", "train.max_itres=3")
    assert_user_error(result, "train.max_itres", "did you mean 'max_iters'")
    assert not (tmp_path / "r").exists()


def test_wrong_value_type(capsys, tiny_toml, tmp_path):
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "r", "--set", "model.n_layers=two")
    assert_user_error(result, "model.n_layers", "int")


def test_invalid_value(capsys, tiny_toml, tmp_path):
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "r", "--set", "model.n_heads=3")
    assert_user_error(result, "d_model (32) must be divisible by n_heads (3)")


def test_missing_corpus(capsys, tiny_toml, tmp_path):
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "r", "--set", f"data.path={tmp_path / 'no.txt'}")
    assert_user_error(result, "no.txt does not exist")


def test_empty_corpus(capsys, tiny_toml, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "r", "--set", f"data.path={empty}")
    assert_user_error(result, "empty.txt is empty")


def test_corpus_shorter_than_one_block(capsys, tiny_toml, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Now is the winter of our discontent.\n" * 3)
    result = cli(capsys, "train", tiny_toml, "--out", tmp_path / "r", "--set", f"data.path={short}")
    assert_user_error(result, "fewer than one block", "model.block_size")


def test_prompt_with_unseen_characters(trained_run, capsys):
    assert_user_error(cli(capsys, "sample", trained_run, "--prompt", "Grüße ☃"), "never saw", "'ü'", "'☃'")


def test_negative_max_new_tokens(trained_run, capsys):
    assert_user_error(cli(capsys, "sample", trained_run, "--max-new-tokens", "-5"), "--max-new-tokens", ">= 0")


def test_bad_sampling_values(trained_run, capsys):
    assert_user_error(cli(capsys, "sample", trained_run, "--temperature", "-1"), "--temperature")
    assert_user_error(cli(capsys, "sample", trained_run, "--top-p", "1.5"), "--top-p")


def test_missing_run_folder(capsys, tmp_path):
    assert_user_error(cli(capsys, "sample", tmp_path / "nope"), "does not exist")
    assert_user_error(cli(capsys, "eval", tmp_path / "nope"), "does not exist")


def test_folder_that_is_not_a_run(capsys, tmp_path):
    assert_user_error(cli(capsys, "eval", tmp_path), "not a checkpoint")


def test_corrupt_checkpoint(capsys, trained_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained_run, copy)
    (copy / WEIGHTS).write_bytes((copy / WEIGHTS).read_bytes()[:-100])
    assert_user_error(cli(capsys, "sample", copy), "corrupt")
    assert_user_error(cli(capsys, "eval", copy), "corrupt")


def test_resume_with_a_different_model_config_keeps_the_run(capsys, tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    assert cli(capsys, "train", tiny_toml, "--out", run_dir, "--quiet", "--set", "train.max_iters=2")[0] == 0
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    result = cli(capsys, "train", tiny_toml, "--out", run_dir, "--resume", "--set", "model.n_layers=3")
    assert_user_error(result, "model config differs", "n_layers: 2 in the run, 3 asked for")
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_existing_run_without_resume(capsys, tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    assert cli(capsys, "train", tiny_toml, "--out", run_dir, "--quiet", "--set", "train.max_iters=2")[0] == 0
    assert_user_error(cli(capsys, "train", tiny_toml, "--out", run_dir), "already holds a run", "--resume")


def test_resume_via_cli_continues(capsys, tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    assert cli(capsys, "train", tiny_toml, "--out", run_dir, "--quiet", "--set", "train.max_iters=2")[0] == 0
    code, out, _ = cli(capsys, "train", tiny_toml, "--out", run_dir, "--resume", "--json", "--set", "train.max_iters=4")
    assert code == 0 and json.loads(out)["step"] == 4


def test_real_process_error_has_no_traceback(tmp_path):
    """The installed entry point, as a user runs it: exit code 2, one line, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab", "sample", str(tmp_path / "missing")], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["smaple", "runs/x"], "(did you mean 'sample'"),
        (["sample", "runs/x", "--promt", "ROMEO:"], "(did you mean '--prompt'?)"),
        (["eval", "runs/x", "--chekpoint=best"], "(did you mean '--checkpoint'"),
        (["eval", "runs/x", "--checkpoint", "bset"], "(did you mean 'best'?)"),
    ],
)
def test_a_mistyped_subcommand_option_or_choice_gets_a_did_you_mean(capsys, argv, hint):
    assert_user_error(cli(capsys, *argv), hint)


def test_train_help_lists_the_presets(capsys):
    from attnlab.config import presets

    code, out, _ = cli(capsys, "train", "--help")
    assert code == 0
    listed = " ".join(out.partition("presets:")[2].split())
    assert [p for p in presets() if p not in listed.replace(", ", " ").split()] == []


@pytest.mark.parametrize(
    "mistake, config, args",
    [
        ("missing corpus", "TINY", ["--set", "data.path=no-such-corpus.txt"]),
        ("corpus shorter than a block", "TINY", ["--set", "model.block_size=30000"]),  # after tokenizer.json
        ("bad --data-dir", "sst2", ["--data-dir", "no-such-folder"]),
        ("bad --init-from", "sst2", ["--data-dir", "SST2", "--init-from", "no-such-run"]),
    ],
)
def test_a_run_that_fails_at_set_up_leaves_no_run_folder(
    capsys, tiny_toml, tmp_path, monkeypatch, mistake, config, args
):
    from helpers import SST2

    monkeypatch.chdir(tmp_path)
    config = str(tiny_toml) if config == "TINY" else config
    args = [str(SST2) if a == "SST2" else a for a in args]
    for out, existed in ((tmp_path / "new", False), (tmp_path / "empty", True)):
        if existed:
            out.mkdir()
        code, _, err = cli(capsys, "train", config, "--out", out, "--quiet", *args)
        assert code == 2, err
        assert (out.exists() and list(out.iterdir()) == []) if existed else not out.exists(), mistake


def test_demo_trains_samples_and_reuses_its_run(capsys, tmp_path):
    """The quick start for real, on a tiny budget: train, sample, point at the next commands; run
    again, it says the run is trained already and goes straight to the same sample."""
    budget = [
        "train.max_iters=4",
        "train.eval_interval=2",
        "train.eval_iters=1",
        "model.n_layers=1",
        "model.d_model=32",
    ]
    args = ["demo", "--out", tmp_path / "demo", "--quiet", "--max-new-tokens", "25"]
    args += [w for kv in budget for w in ("--set", kv)]
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"Training a 1-layer GPT on Tiny Shakespeare into {tmp_path / 'demo'} (4 steps)")
    assert lines[1].startswith("Done: step 4, val loss ")
    sample = out.partition("\n\n")[2].partition("\n\nMore:")[0]
    assert sample.startswith("ROMEO:") and len(sample) == len("ROMEO:") + 25  # one character per token
    assert f"More: {attnlab_command()} sample {tmp_path / 'demo'}" in out
    code, again, _ = cli(capsys, *args)
    assert code == 0 and again.startswith(f"{tmp_path / 'demo'} is already trained (4 steps, val loss ")
    assert "resuming" not in again and again.partition("\n\n")[2] == out.partition("\n\n")[2]
