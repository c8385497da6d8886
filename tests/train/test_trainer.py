import csv
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import load
from attnlab.checkpoints import BEST_WEIGHTS, TRAIN_STATE, WEIGHTS
from attnlab.errors import CheckpointError, UserError
from attnlab.models import GPT, GPTConfig
from attnlab.train import train
from attnlab.train.optim import param_groups
from attnlab.train.schedules import inverse_sqrt, warmup_cosine
from helpers import losses, run_config

pytestmark = pytest.mark.slow


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / WEIGHTS)


def metric_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_warmup_cosine_matches_formula():
    kw = dict(max_lr=1.0, min_lr=0.1, warmup=10, decay_steps=110)
    assert warmup_cosine(0, **kw) == pytest.approx(1 / 11)
    assert warmup_cosine(9, **kw) == pytest.approx(10 / 11)
    assert warmup_cosine(10, **kw) == pytest.approx(1.0)
    assert warmup_cosine(60, **kw) == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 0.9)
    assert warmup_cosine(110, **kw) == pytest.approx(0.1)
    assert warmup_cosine(500, **kw) == pytest.approx(0.1)


def test_inverse_sqrt_is_the_papers_schedule():
    d, w = 512, 4000
    peak = d**-0.5 * w**-0.5
    for step in (0, 100, 3998, 3999, 4000, 20000):
        n = step + 1
        expected = d**-0.5 * min(n**-0.5, n * w**-1.5)  # Vaswani et al. Eq. 3
        assert inverse_sqrt(step, max_lr=peak, warmup=w) == pytest.approx(expected, rel=1e-12)
    assert inverse_sqrt(w - 1, max_lr=1.0, warmup=w) == pytest.approx(1.0)


def test_weight_decay_only_on_linear_matrices():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16))
    decay, no_decay = param_groups(model, 0.1)
    decayed = {id(p) for p in decay["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert id(model.token_embedding.weight) not in decayed  # tied with lm_head: still an embedding
    assert id(model.positions.embedding.weight) not in decayed
    assert all(names[i].endswith("weight") and "norm" not in names[i] for i in decayed)
    assert {names[i] for i in decayed} == {
        n for n, p in model.named_parameters() if p.dim() == 2 and "embedding" not in n
    }
    total = sum(len(g["params"]) for g in (decay, no_decay))
    assert total == len(list(model.parameters()))


def test_training_lowers_the_loss_and_writes_a_complete_run(tiny_toml, tmp_path):
    result = train(
        run_config(tiny_toml, "train.max_iters=30", "train.eval_interval=10"), tmp_path / "run", progress=False
    )
    run_dir = tmp_path / "run"
    for name in (
        "config.toml",
        "model.safetensors",
        "tokenizer.json",
        "train_state.pt",
        "metrics.csv",
        "checkpoint.json",
    ):
        assert (run_dir / name).is_file(), name
    rows = metric_rows(run_dir)
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [int(r["step"]) for r in evals] == [0, 10, 20, 30]
    assert float(evals[-1]["val_loss"]) < float(evals[0]["val_loss"]) - 0.3
    assert result.step == 30 and result.val_loss == pytest.approx(float(evals[-1]["val_loss"]), rel=1e-4)
    # The resolved config records the vocabulary the tokenizer produced.
    run = load(run_dir)
    assert run.config.model.vocab_size == run.tokenizer.vocab_size


def test_same_config_twice_gives_the_same_losses(tiny_toml, tmp_path):
    train(run_config(tiny_toml), tmp_path / "a", progress=False)
    train(run_config(tiny_toml), tmp_path / "b", progress=False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    for name, t in weights(tmp_path / "a").items():
        assert torch.equal(t, weights(tmp_path / "b")[name]), name


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_resume_is_bit_identical_to_training_straight_through(tiny_toml, tmp_path, dropout):
    common = [f"model.dropout={dropout}", "train.lr_decay_iters=16", "train.gradient_accumulation_steps=2"]
    train(run_config(tiny_toml, "train.max_iters=16", *common), tmp_path / "straight", progress=False)
    train(run_config(tiny_toml, "train.max_iters=8", *common), tmp_path / "split", progress=False)
    train(run_config(tiny_toml, "train.max_iters=16", *common), tmp_path / "split", resume=True, progress=False)
    straight, split = weights(tmp_path / "straight"), weights(tmp_path / "split")
    assert straight.keys() == split.keys()
    for name in straight:
        assert torch.equal(straight[name], split[name]), name
    # The resumed run's log continues where the first stopped, with no duplicated steps.
    steps = [int(r["step"]) for r in metric_rows(tmp_path / "split") if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 16


def test_max_iters_does_not_change_the_schedule_when_lr_decay_iters_is_set(tiny_toml, tmp_path):
    train(run_config(tiny_toml, "train.max_iters=4", "train.lr_decay_iters=8"), tmp_path / "short", progress=False)
    train(run_config(tiny_toml, "train.max_iters=8", "train.lr_decay_iters=8"), tmp_path / "long", progress=False)
    lr = {d: {r["step"]: r["lr"] for r in metric_rows(tmp_path / d) if r["kind"] == "train"} for d in ("short", "long")}
    assert lr["short"] == {k: v for k, v in lr["long"].items() if int(k) <= 4}


def test_resume_log_drops_rows_written_after_the_checkpoint(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    train(run_config(tiny_toml, "train.max_iters=4"), run_dir, progress=False)
    with open(run_dir / "metrics.csv", "a", newline="") as f:
        f.write("6,train,9.9,,0.001,1,1\n")  # as if the run died after logging step 6
    train(run_config(tiny_toml, "train.max_iters=8"), run_dir, resume=True, progress=False)
    rows = [r for r in metric_rows(run_dir) if r["kind"] == "train"]
    assert "9.9" not in [r["train_loss"] for r in rows]
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8]


def test_resuming_a_finished_run_reports_its_last_evaluation(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    first = train(run_config(tiny_toml), run_dir, progress=False)
    again = train(run_config(tiny_toml), run_dir, resume=True, progress=False)
    assert again.step == first.step == 8
    assert not math.isnan(first.val_loss)
    assert again.val_loss == pytest.approx(first.val_loss, rel=1e-5)  # as recorded (6 digits)
    assert again.metrics.keys() == first.metrics.keys()


def test_resume_refuses_a_different_model(tiny_toml, tmp_path):
    train(run_config(tiny_toml, "train.max_iters=2"), tmp_path / "run", progress=False)
    with pytest.raises(CheckpointError, match=r"model config differs.*d_model: 32 in the run, 64 asked for"):
        train(run_config(tiny_toml, "model.d_model=64"), tmp_path / "run", resume=True, progress=False)


def test_fresh_run_refuses_an_existing_run_folder(tiny_toml, tmp_path):
    train(run_config(tiny_toml, "train.max_iters=2"), tmp_path / "run", progress=False)
    before = (tmp_path / "run" / WEIGHTS).read_bytes()
    with pytest.raises(UserError, match="already holds a run; pass --resume"):
        train(run_config(tiny_toml), tmp_path / "run", progress=False)
    assert (tmp_path / "run" / WEIGHTS).read_bytes() == before


def test_resume_without_a_run_is_an_error(tiny_toml, tmp_path):
    with pytest.raises(CheckpointError, match="holds no run"):
        train(run_config(tiny_toml), tmp_path / "empty", resume=True, progress=False)


def test_corrupt_weights_are_detected(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    train(run_config(tiny_toml, "train.max_iters=2"), run_dir, progress=False)
    data = bytearray((run_dir / WEIGHTS).read_bytes())
    data[-10] ^= 0xFF
    (run_dir / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load(run_dir)
    with pytest.raises(CheckpointError, match="corrupt"):
        train(run_config(tiny_toml, "train.max_iters=4"), run_dir, resume=True, progress=False)


def test_language_model_runs_keep_no_best_checkpoint(tiny_toml, tmp_path):
    """The LM's in-training loss is an estimate on random batches: too noisy to pick a "best" by."""
    run_dir = tmp_path / "run"
    result = train(run_config(tiny_toml, "train.max_iters=12"), run_dir, progress=False)
    assert not (run_dir / BEST_WEIGHTS).exists() and result.best is None
    assert load(run_dir).step == 12 == load(run_dir, checkpoint="last").step


def test_train_state_holds_only_tensors_and_plain_containers(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    train(run_config(tiny_toml, "train.max_iters=2"), run_dir, progress=False)
    state = torch.load(run_dir / TRAIN_STATE, weights_only=True)
    assert state["step"] == 2 and set(state) >= {"optimizer", "batch_rng", "torch_rng"}


def test_saved_and_loaded_model_give_identical_logits(tiny_toml, tmp_path):
    run_dir = tmp_path / "run"
    train(run_config(tiny_toml, "train.max_iters=2"), run_dir, progress=False)
    run = load(run_dir)
    again = load(run_dir)
    idx = torch.randint(0, run.config.model.vocab_size, (2, 16))
    assert torch.equal(run.model(idx), again.model(idx))
    fresh = GPT(run.config.model)
    assert not torch.equal(fresh(idx), run.model(idx))  # loading really replaced the initial weights


def test_short_corpus_is_a_clear_error(tmp_path, tiny_toml):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be: that is the question.\n" * 2)
    with pytest.raises(UserError, match="fewer than one block"):
        train(run_config(tiny_toml, f'data.path="{short.as_posix()}"'), tmp_path / "run", progress=False)


def test_bpe_corpus_trains(tiny_toml, tmp_path):
    result = train(
        run_config(tiny_toml, 'data.tokenizer="bpe"', "data.vocab_size=300", "train.max_iters=2"),
        tmp_path / "run",
        progress=False,
    )
    run = load(result.run_dir)
    assert run.tokenizer.vocab_size <= 300 and run.config.model.vocab_size == run.tokenizer.vocab_size
    text = "Citizen: we are accounted poor citizens"
    assert run.tokenizer.decode(run.tokenizer.encode(text)) == text


def test_adam_l2_penalises_every_parameter_through_the_gradient():
    """optimizer = "adam": the GAT/GCN recipe, an L2 term λθ added to every gradient (biases too)."""
    from attnlab.train.optim import adam_l2

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    reference = torch.nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    optimizer = adam_l2(model, lr=0.1, betas=(0.9, 0.999), weight_decay=0.5)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.5]
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 2  # weight and bias
    x = torch.randn(4, 3)
    model(x).square().sum().backward()
    optimizer.step()
    # The same step by hand: Adam's first step moves each entry by lr * sign(g + λθ).
    loss = reference(x).square().sum() + 0.5 / 2 * sum(p.square().sum() for p in reference.parameters())
    loss.backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q - 0.1 * q.grad / (q.grad.abs() + 1e-8))


def test_patience_needs_a_validation_metric(tiny_toml, tmp_path):
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match="train.patience, watch_loss and ties_count need a validation metric"):
        train(run_config(tiny_toml, "train.patience=3"), tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="optimizer must be one of"):
        run_config(tiny_toml, "train.optimizer=sgd")


def test_auto_dtype_is_chosen_and_logged_and_an_explicit_dtype_is_obeyed(tiny_toml, tmp_path, capsys):
    from attnlab.device import resolve_dtype

    expected, _ = resolve_dtype("auto", torch.device("cpu"))
    result = train(run_config(tiny_toml, "train.dtype=auto", "train.max_iters=2"), tmp_path / "auto", progress=False)
    assert result.dtype == expected
    assert f"train.dtype auto: {expected} (" in capsys.readouterr().err
    config = run_config(tiny_toml, "train.dtype=bfloat16", "train.max_iters=2")
    result = train(config, tmp_path / "bf16", progress=False)
    assert result.dtype == "bfloat16"
    assert "train.dtype auto" not in capsys.readouterr().err


def test_no_preset_asks_for_bf16_where_it_would_be_slow():
    from attnlab.config import load_preset_or_file, presets

    asked = {name: load_preset_or_file(name)[1].get("train", {}).get("dtype") for name in presets()}
    assert "bfloat16" not in asked.values()
    assert asked["multi30k-de-en"] == asked["shakespeare-char"] == "auto"


def test_without_a_terminal_training_prints_progress_lines(tiny_toml, tmp_path, capsys, monkeypatch):
    from attnlab.train import trainer

    monkeypatch.setattr(trainer, "PROGRESS_EVERY_S", 0.0)  # a line at every step, for the test
    train(run_config(tiny_toml), tmp_path / "run", progress=True)  # capsys's stderr is no terminal
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("training: ")]
    assert [line.split(" (")[0] for line in lines] == [f"training: {s}/8 steps" for s in range(1, 8)]
    train(run_config(tiny_toml), tmp_path / "quiet", progress=False)
    assert "training: " not in capsys.readouterr().err


def test_the_clock_reports_each_windows_rate_and_the_mean_over_the_training(monkeypatch):
    from attnlab.train import trainer

    now = [100.0]
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: now[0])
    clock = trainer.Clock(elapsed=50.0)  # resumed: 50 s trained before
    clock.tokens, now[0] = 100, 101.0
    clock.lap()  # 100 tokens in 1 s
    clock.pause()
    now[0] = 106.0  # a 5 s evaluation, not training
    clock.resume()
    clock.tokens, now[0] = 300, 107.0
    clock.lap()  # 300 tokens in 1 s
    clock.tokens, now[0] = 60, 109.0
    clock.settle(now[0])  # the run ends between laps: 60 tokens in 2 s
    assert clock.tokens_per_sec == 300.0  # the last window's, for metrics.csv
    assert clock.elapsed == 54.0
    assert clock.mean_tokens_per_sec == 460 / 4  # this invocation's training, evaluations excluded
