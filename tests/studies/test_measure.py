"""What a study measures of a run folder (`studies.measure.measure_run`, `studies.sweep.validation_loss`),
read through `load_run` like every loader: a run folder in checkpoint format 1 is measured with the
weights `attnlab.load` gives, its validation loss matches one computed by hand, and a corrupt
checkpoint is refused with the same message as `attnlab.load`'s."""

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab import load
from attnlab.checkpoints import WEIGHTS
from attnlab.data.text import bundled_shakespeare, split_text
from attnlab.errors import CheckpointError
from attnlab.studies.measure import measure_run
from attnlab.studies.sweep import validation_loss

FORMAT1 = Path(__file__).parents[1] / "fixtures" / "run-format1"


@pytest.fixture
def format1_lm(tmp_path, monkeypatch) -> Path:
    """The format-1 LM fixture (1 layer, 16 wide, block 8, 4 steps) with its relative corpus.txt."""
    run_dir = shutil.copytree(FORMAT1 / "lm", tmp_path / "lm")
    monkeypatch.chdir(tmp_path)
    Path("corpus.txt").write_text(bundled_shakespeare()[:4000], encoding="utf-8")
    return run_dir


def test_a_format1_run_is_measured_on_the_model_load_gives(format1_lm):
    model = load(format1_lm, checkpoint="last").model
    measured = measure_run(format1_lm)
    assert measured.params == sum(p.numel() for p in model.parameters())
    tables = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    assert measured.non_embedding_params == sum(p.numel() for p in model.parameters() if id(p) not in tables)
    assert measured.flops_per_token > 0


def test_the_validation_loss_is_that_of_the_trained_weights(format1_lm):
    run = load(format1_lm, checkpoint="last")
    _, val_text = split_text(Path("corpus.txt").read_text(encoding="utf-8"), 0.1)
    ids = torch.tensor(run.tokenizer.encode(val_text)[:65])  # 8 blocks of 8, and the last target
    with torch.no_grad():
        logits = run.model(ids[:-1].view(8, 8))
    by_hand = F.cross_entropy(logits.reshape(64, -1), ids[1:].view(64)).item()
    assert validation_loss(format1_lm, max_tokens=64) == pytest.approx(by_hand, rel=1e-5)


def test_a_corrupt_checkpoint_is_refused_as_load_refuses_it(format1_lm):
    (format1_lm / WEIGHTS).write_bytes((format1_lm / WEIGHTS).read_bytes()[:-8])
    with pytest.raises(CheckpointError) as by_load:
        load(format1_lm, checkpoint="last")
    for measure in (measure_run, validation_loss):
        with pytest.raises(CheckpointError) as by_study:
            measure(format1_lm)
        assert str(by_study.value) == str(by_load.value)
