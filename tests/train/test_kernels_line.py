"""The training log says "attnlab's C++ kernels: on" only for runs whose blocks they compute: not
for a model they do not cover (WaveNet), not for one whose blocks fall back to PyTorch (ALiBi), and
not for a finished run. Nothing here builds the kernels: `kernels.extension` is replaced by a
stand-in where a run asks for them, and no step runs through it."""

import pytest
import torch

from attnlab.accel import kernels
from attnlab.models import GPT, GPTConfig, WaveNet, WaveNetConfig
from attnlab.train import train
from attnlab.train.run_setup import choose_kernels, set_up_run
from helpers import run_config

pytestmark = pytest.mark.slow

ON = "attnlab's C++ kernels: on"


def gpt(**kw) -> GPT:
    return GPT(GPTConfig(**{"vocab_size": 40, "block_size": 16, "n_layers": 2, "n_heads": 2, "d_model": 64, **kw}))


def wavenet() -> WaveNet:
    return WaveNet(WaveNetConfig(layers_per_block=2, n_blocks=1, kernel=2))


@pytest.fixture
def no_build(monkeypatch):
    """The kernels count as built, and asking for them returns a stand-in: nothing compiles."""
    monkeypatch.setattr(kernels, "is_built", lambda: True)
    monkeypatch.setattr(kernels, "extension", lambda: object())


def test_the_parts_the_kernels_compute():
    assert kernels.computed_parts(gpt()) == ["Transformer blocks"]
    assert kernels.computed_parts(wavenet()) == []
    # ALiBi acts on the scores: the blocks and their attention run on PyTorch's path; only the GELU is left.
    assert kernels.computed_parts(gpt(positions="alibi")) == ["GELU"]
    assert kernels.computed_parts(gpt(positions="alibi", activation="relu")) == []
    # Dropout in training keeps a block off the fused kernel too.
    assert kernels.computed_parts(gpt(dropout=0.1)) == ["GELU"]


def test_on_only_for_a_model_whose_blocks_they_compute(tiny_toml, tmp_path, no_build):
    run = set_up_run(run_config(tiny_toml, "train.fused_kernels=true"), tmp_path / "run", resume=False)
    assert run.kernels_line(gpt()) == ON
    assert run.kernels_line(wavenet()) == (
        "attnlab's C++ kernels: the AdamW step only; the rest of the model on PyTorch's operators"
    )
    alibi = run.kernels_line(gpt(positions="alibi"))
    assert alibi.startswith("attnlab's C++ kernels: GELU and the AdamW step only") and ON not in alibi


def test_the_build_advice_is_for_models_it_would_speed_up(tiny_toml, tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "is_built", lambda: False)
    run = set_up_run(run_config(tiny_toml), tmp_path / "run", resume=False)  # "auto", nothing built
    assert "`attnlab kernels build`" in run.kernels_line(gpt())
    assert run.kernels_line(wavenet()) is None


def test_a_finished_run_says_nothing_of_the_kernels(tiny_toml, tmp_path, no_build, capsys):
    train(run_config(tiny_toml, "train.max_iters=4", "train.fused_kernels=false"), tmp_path / "run", progress=False)
    capsys.readouterr()
    finished = run_config(tiny_toml, "train.max_iters=4", "train.fused_kernels=true")
    result = train(finished, tmp_path / "run", resume=True, progress=False)
    assert result.step == 4 and "C++ kernels" not in capsys.readouterr().err
    # The control: with steps left, the same folder and settings would say it.
    more = set_up_run(run_config(tiny_toml, "train.max_iters=8", "train.fused_kernels=true"), tmp_path / "run", True)
    assert not more.finished and more.kernels_line(gpt()) == ON


def test_a_run_on_another_device_never_takes_or_builds_the_cpu_kernels(monkeypatch):
    """The kernels compute fp32 CPU tensors only: on a GPU, `true` says so instead of building them
    and claiming they are on; "auto" and `false` say nothing."""
    monkeypatch.setattr(kernels, "extension", lambda: pytest.fail("built for a CUDA run"))
    monkeypatch.setattr(kernels, "is_built", lambda: True)
    cuda = torch.device("cuda")
    assert choose_kernels(True, cuda, None) == (
        False,
        "attnlab's C++ kernels are for the CPU; on cuda, PyTorch's operators",
    )
    assert choose_kernels("auto", cuda, None) == (False, None)
    assert choose_kernels(False, cuda, None) == (False, None)
