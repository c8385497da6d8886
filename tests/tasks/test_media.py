"""Sampling a trained image or audio run from Python (`attnlab.tasks.media`,
`attnlab.viz.sample_image_grid`), on the tiny runs the media CLI tests train: what comes back is
what was asked for, the same seed gives the same samples, a completion keeps the real image's top
half, and a request the model cannot answer is a `UserError` before anything is written."""

import numpy as np
import pytest
import torch

import attnlab
from attnlab.data.audio import FSDD_RATE, read_wav
from attnlab.errors import UserError
from attnlab.tasks.image_density import read_images
from attnlab.tasks.media import sample_run_audio, sample_run_images
from helpers import train_media_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folders = train_media_runs(tmp_path_factory.mktemp("media-runs"), ("pixelcnn", "gated", "vit", "wavenet"))
    return {name: attnlab.load(folder) for name, folder in folders.items()}


def test_images_of_a_class_come_back_as_asked_and_follow_the_seed(runs):
    first = sample_run_images(runs["gated"], 3, label=7, seed=4)
    assert first.images.shape == (3, 28, 28) and first.images.dtype == torch.uint8
    assert first.label == 7 and first.given is None and first.description == "samples"
    assert torch.equal(sample_run_images(runs["gated"], 3, label=7, seed=4).images, first.images)
    assert not torch.equal(sample_run_images(runs["gated"], 3, label=7, seed=5).images, first.images)


def test_a_completion_keeps_the_top_half_of_the_real_image_and_its_class(runs):
    run = runs["gated"]
    real = read_images(run.config.data, ("test",), "test")["test"]
    found = sample_run_images(run, 2, complete=("test", 5))
    assert found.label == int(real.labels[5]) and found.given_rows == 14
    assert torch.equal(found.given, torch.from_numpy(real.images[5]))
    assert torch.equal(found.images[:, :14], found.given[None, :14].expand(2, -1, -1))
    assert found.description == "completions of the top half of test image 5"


@pytest.mark.parametrize(
    "name, kwargs, fragment",
    [
        ("gated", {"label": 10}, "not a class of this model"),
        ("pixelcnn", {"label": 3}, "not conditioned on the class"),
        ("gated", {"complete": ("test", 1000)}, "has 100 images"),
        ("gated", {"complete": ("dev", 3)}, "SPLIT:INDEX"),
        ("gated", {"temperature": -1.0}, "temperature"),
        ("vit", {}, "cannot sample"),
        ("wavenet", {}, "image density run"),
    ],
)
def test_image_requests_the_model_cannot_answer_are_user_errors(runs, name, kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        sample_run_images(runs[name], 2, **kwargs)


def test_the_grid_is_drawn_with_the_original_and_the_kept_half_before_the_completions(runs, tmp_path):
    from attnlab.viz import sample_image_grid
    from attnlab.viz.figure import png_size

    samples = sample_image_grid(runs["gated"], tmp_path / "grid.png", 3, label=2)
    completed = sample_image_grid(runs["gated"], tmp_path / "completed.png", 3, complete=("test", 5))
    assert samples.images.shape[0] == completed.images.shape[0] == 3
    # Five pictures in the row instead of three (the completions' titles make the row taller).
    assert png_size(tmp_path / "completed.png")[0] > png_size(tmp_path / "grid.png")[0]
    with pytest.raises(UserError, match="PNG"):
        sample_image_grid(runs["gated"], tmp_path / "grid.jpg", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["completed.png", "grid.png"]


def test_several_sounds_are_written_as_numbered_wavs_of_the_asked_length(runs, tmp_path):
    found = sample_run_audio(runs["wavenet"], tmp_path / "3_wavenet.wav", 2, digit=3, speaker="george", seconds=0.01)
    assert [p.name for p in found.paths] == ["3_wavenet_1.wav", "3_wavenet_2.wav"]
    assert found.length == round(0.01 * FSDD_RATE) == 80
    assert all(len(read_wav(p)) == 80 for p in found.paths)
    naive = sample_run_audio(
        runs["wavenet"], tmp_path / "naive.wav", 2, digit=3, speaker="george", seconds=0.01, cached=False
    )
    for cached, slow in zip(found.paths, naive.paths, strict=True):
        assert np.array_equal(read_wav(cached), read_wav(slow))


@pytest.mark.parametrize(
    "out, kwargs, fragment",
    [
        ("x.wav", {"digit": 12, "speaker": "george"}, "not a digit of this model"),
        ("x.wav", {"speaker": "george"}, "pass --digit"),
        ("x.wav", {"digit": 1, "speaker": "nobody"}, "one of george, jackson"),
        ("x.wav", {"digit": 1, "speaker": "george", "seconds": 0}, "seconds"),
        ("x.mp3", {"digit": 1, "speaker": "george"}, "FILE.wav"),
    ],
)
def test_sound_requests_the_model_cannot_answer_write_nothing(runs, tmp_path, out, kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        sample_run_audio(runs["wavenet"], tmp_path / out, **kwargs)
    assert not list(tmp_path.iterdir())
    with pytest.raises(UserError, match="WaveNet run"):
        sample_run_audio(runs["gated"], tmp_path / "x.wav", digit=1)


def test_the_cls_attention_of_a_vit_is_drawn_over_the_asked_image(runs, tmp_path):
    from attnlab.viz.images import draw_cls_attention

    drawn = draw_cls_attention(runs["vit"], ("test", 5), tmp_path / "cls.png", head=0)
    assert drawn.attention.shape == (4, 4) and drawn.label == 1 and drawn.layer == 0  # test image 5: a trouser
    assert (drawn.attention >= 0).all() and drawn.attention.sum() <= 1 + 1e-5  # [CLS] also attends to itself
    assert drawn.path.exists()
    for kwargs, fragment in [({"layer": 1}, "--layer 1: the model has 1"), ({"head": 9}, "--head 9")]:
        with pytest.raises(UserError, match=fragment):
            draw_cls_attention(runs["vit"], ("test", 5), tmp_path / "x.png", **kwargs)
    with pytest.raises(UserError, match="ViT"):
        draw_cls_attention(runs["gated"], ("test", 5), tmp_path / "x.png")
