"""train.fused_kernels: the trainer runs its Transformer blocks and its optimizer step through
attnlab's C++ kernels, says so, and trains as without them; where they cannot be built it says
that and trains with PyTorch's operators."""

import pytest

from attnlab.nn import kernels
from attnlab.train import train
from helpers import losses, run_config


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
    eager = train(run_config(tiny_toml), tmp_path / "eager", progress=False)
    assert fused.fused_kernels and not eager.fused_kernels
    assert "attnlab's C++ kernels: on" in capsys.readouterr().err
    assert calls == ["PreNormStack"] * 8  # both blocks in one call, every training step (evaluation runs PyTorch's)
    assert len(steps) == 8  # the clipping and AdamW step: ClippingAdamW's kernel
    for got, want in zip(losses(tmp_path / "fused"), losses(tmp_path / "eager"), strict=True):
        for g, w in zip(got, want, strict=True):
            assert (g == w == "") or float(g) == pytest.approx(float(w), abs=1e-3)
    assert not kernels.is_enabled()  # only inside the training steps


def test_without_a_build_the_trainer_says_so_and_uses_pytorch(tiny_toml, tmp_path, monkeypatch, capsys):
    train(run_config(tiny_toml), tmp_path / "eager", progress=False)
    monkeypatch.setattr(kernels, "extension", lambda: None)
    result = train(run_config(tiny_toml, "train.fused_kernels=true"), tmp_path / "unbuilt", progress=False)
    assert capsys.readouterr().err.count("attnlab's C++ kernels: not built here; PyTorch's operators instead") == 1
    assert not result.fused_kernels
    assert losses(tmp_path / "unbuilt") == losses(tmp_path / "eager")
