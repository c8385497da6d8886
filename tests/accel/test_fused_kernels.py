"""train.fused_kernels: the trainer runs its Transformer blocks and its optimizer step through
attnlab's C++ kernels, says so, and trains as without them; where they cannot be built it says
that and trains with PyTorch's operators. "auto" (the default) takes them where they are built
already, never builds them, and a resumed run keeps what its start chose."""

import pytest

from attnlab import load
from attnlab.accel import kernels
from attnlab.config import ConfigError
from attnlab.models import GPT
from attnlab.train import train
from attnlab.train.config import read_config
from helpers import losses, run_config

pytestmark = pytest.mark.slow

NOT_BUILT_LINE = "attnlab's C++ kernels: not built on this machine, so PyTorch's operators; `attnlab kernels build`"


@pytest.mark.skipif(kernels.extension() is None, reason="the kernels could not be built here")
def test_fused_kernels_train_like_pytorchs_operators(tiny_toml, tmp_path, monkeypatch, capsys):
    calls = []
    apply = kernels._PreNormBlock.apply
    monkeypatch.setattr(
        kernels._PreNormBlock, "apply", lambda *a: calls.append(type(a[1].kernel).__name__) or apply(*a)
    )
    steps = []
    adamw_step = kernels.extension().adamw_step
    monkeypatch.setattr(kernels.extension(), "adamw_step", lambda *a: steps.append(a[-1]) or adamw_step(*a))
    fused = train(run_config(tiny_toml, "train.fused_kernels=true"), tmp_path / "fused", progress=False)
    eager = train(run_config(tiny_toml, "train.fused_kernels=false"), tmp_path / "eager", progress=False)
    assert fused.fused_kernels and not eager.fused_kernels
    assert "attnlab's C++ kernels: on" in capsys.readouterr().err
    assert calls == ["PreNormStack"] * 8  # both blocks in one call, every training step (evaluation runs PyTorch's)
    assert len(steps) == 8  # the clipping and AdamW step: ClippingAdamW's kernel
    for got, want in zip(losses(tmp_path / "fused"), losses(tmp_path / "eager"), strict=True):
        for g, w in zip(got, want, strict=True):
            assert (g == w == "") or float(g) == pytest.approx(float(w), abs=1e-3)
    # The kernels stay with the trainer's model: the run folder loads as nn/'s reference GPT.
    assert type(load(tmp_path / "fused").model) is GPT


def test_without_a_build_the_trainer_says_so_and_uses_pytorch(tiny_toml, tmp_path, monkeypatch, capsys):
    train(run_config(tiny_toml, "train.fused_kernels=false"), tmp_path / "eager", progress=False)
    monkeypatch.setattr(kernels, "extension", lambda: None)
    result = train(run_config(tiny_toml, "train.fused_kernels=true"), tmp_path / "unbuilt", progress=False)
    assert capsys.readouterr().err.count("attnlab's C++ kernels: not built here; PyTorch's operators instead") == 1
    assert not result.fused_kernels
    assert losses(tmp_path / "unbuilt") == losses(tmp_path / "eager")


def test_auto_without_a_build_never_builds_says_how_and_trains_as_pytorch(tiny_toml, tmp_path, monkeypatch, capsys):
    train(run_config(tiny_toml, "train.fused_kernels=false"), tmp_path / "eager", progress=False)
    capsys.readouterr()
    monkeypatch.setattr(kernels, "is_built", lambda: False)
    monkeypatch.setattr(kernels, "extension", lambda: pytest.fail("'auto' must not build the kernels"))
    result = train(run_config(tiny_toml), tmp_path / "auto", progress=False)  # the default: "auto"
    assert not result.fused_kernels
    assert capsys.readouterr().err.count(NOT_BUILT_LINE) == 1
    assert losses(tmp_path / "auto") == losses(tmp_path / "eager")
    assert read_config(tmp_path / "auto").train.fused_kernels is False  # the choice is saved with the run


@pytest.mark.skipif(kernels.extension() is None, reason="the kernels could not be built here")
def test_auto_with_a_build_takes_the_kernels_and_a_resumed_run_keeps_its_choice(
    tiny_toml, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(kernels, "is_built", lambda: True)
    on = train(run_config(tiny_toml, "train.max_iters=4"), tmp_path / "on", progress=False)
    assert on.fused_kernels and "attnlab's C++ kernels: on" in capsys.readouterr().err
    assert read_config(tmp_path / "on").train.fused_kernels is True
    # Started without a build, then the kernels were built: the resumed run stays on PyTorch's path.
    monkeypatch.setattr(kernels, "is_built", lambda: False)
    train(run_config(tiny_toml, "train.max_iters=4"), tmp_path / "off", progress=False)
    monkeypatch.setattr(kernels, "is_built", lambda: True)
    resumed = train(run_config(tiny_toml, "train.max_iters=8"), tmp_path / "off", resume=True, progress=False)
    assert not resumed.fused_kernels
    assert "attnlab's C++ kernels: on" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ['"yes"', '"AUTO"', "1"])
def test_fused_kernels_is_true_false_or_auto(tiny_toml, value):
    with pytest.raises(ConfigError, match="fused_kernels"):
        run_config(tiny_toml, f"train.fused_kernels={value}")
