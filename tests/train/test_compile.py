"""The optional torch.compile path of the trainer: it runs where it can, says which path ran, and
falls back to eager training, with the same result, where compilation is unavailable or breaks."""

import pytest
import torch

from attnlab.train import train
from helpers import losses, run_config


class BrokenCompile(torch.nn.Module):
    """What torch.compile hands back when its backend cannot build the graph: the failure comes at
    the first call."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        raise RuntimeError("backend compiler failed: no C++ compiler found\nsecond line of the report")


def test_compile_runs_and_learns_like_eager(tiny_toml, tmp_path, capsys):
    result = train(run_config(tiny_toml, "train.compile=true"), tmp_path / "compiled", progress=False)
    eager = train(run_config(tiny_toml), tmp_path / "eager", progress=False)
    assert result.compiled and not eager.compiled
    assert "torch.compile: on" in capsys.readouterr().err
    # Every step ran (a dropped or repeated step would still learn), and each logged loss agrees
    # with eager's to within the compiler's rounding (fused kernels sum in another order): one
    # step of this run moves the loss by ~0.04, twenty times the tolerance.
    assert result.step == eager.step == 8
    compiled_rows, eager_rows = losses(tmp_path / "compiled"), losses(tmp_path / "eager")
    assert [bool(t) for t, _ in compiled_rows] == [bool(t) for t, _ in eager_rows]  # the same rows
    for (ct, cv), (et, ev) in zip(compiled_rows, eager_rows, strict=True):
        assert float(ct or 0) == pytest.approx(float(et or 0), abs=2e-3)
        assert float(cv or 0) == pytest.approx(float(ev or 0), abs=2e-3)
    assert result.val_loss == pytest.approx(eager.val_loss, abs=2e-3)
    assert result.val_loss < float(compiled_rows[0][1]) - 0.3


def test_a_compiler_failure_falls_back_to_eager_with_the_same_losses(tiny_toml, tmp_path, monkeypatch, capsys):
    eager = train(run_config(tiny_toml), tmp_path / "eager", progress=False)
    monkeypatch.setattr(torch, "compile", BrokenCompile)
    result = train(run_config(tiny_toml, "train.compile=true"), tmp_path / "fallback", progress=False)
    err = capsys.readouterr().err
    assert (
        "torch.compile failed (RuntimeError: backend compiler failed: no C++ compiler found); training without it"
        in err
    )
    assert not result.compiled
    assert losses(tmp_path / "fallback") == losses(tmp_path / "eager")
    assert result.val_loss == eager.val_loss


def test_no_compile_at_all_is_said_once(tiny_toml, tmp_path, monkeypatch, capsys):
    def unavailable(model):
        raise RuntimeError("Python 3.14+ is not supported by torch.compile")

    monkeypatch.setattr(torch, "compile", unavailable)
    result = train(run_config(tiny_toml, "train.compile=true"), tmp_path / "run", progress=False)
    assert capsys.readouterr().err.count("torch.compile: not available here; training without it") == 1
    assert not result.compiled and result.step > 0


def test_a_real_error_is_not_hidden_by_the_fallback(tiny_toml, tmp_path, monkeypatch):
    from attnlab.tasks.language_model import LanguageModel

    def bad_loss(model, batch, device, label_smoothing=0.0):
        raise ValueError("shapes (2, 3) and (4, 5) do not match")

    monkeypatch.setattr(LanguageModel, "loss", staticmethod(bad_loss))
    with pytest.raises(ValueError, match="do not match"):
        train(run_config(tiny_toml, "train.compile=true"), tmp_path / "run", progress=False)
