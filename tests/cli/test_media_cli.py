"""`attnlab train / eval / sample / attention` on image and audio runs, as a user runs them, on the
fixture slices: the files written are real PNGs and WAVs, and bad input is one line, exit 2, and
no file."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from attnlab.data.audio import read_wav
from attnlab.viz.figure import png_size
from helpers import assert_user_error, cli, train_media_runs

pytestmark = pytest.mark.slow

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return train_media_runs(tmp_path_factory.mktemp("media-runs"))


@pytest.mark.parametrize(
    "name, keys",
    [
        ("pixelcnn", {"test_bits_per_dim", "test_nll", "images"}),
        ("igpt", {"test_bits_per_dim", "test_nll", "images"}),
        ("vit", {"accuracy", "test_loss", "images"}),
        ("hybrid", {"accuracy", "test_loss", "images"}),
        ("cnn", {"accuracy", "test_loss", "images"}),
        ("wavenet", {"test_bits_per_sample", "test_nll", "samples"}),
    ],
)
def test_eval_json_reports_the_tasks_metric(runs, capsys, name, keys):
    code, out, err = cli(capsys, "eval", runs[name], "--split", "test", "--json")
    assert code == 0, err
    metrics = json.loads(out)
    assert keys <= set(metrics)
    if "test_bits_per_dim" in metrics:
        assert 7.0 < metrics["test_bits_per_dim"] < 9.0 and metrics["images"] == 100  # barely trained: about uniform


@pytest.mark.parametrize("name", ["pixelcnn", "gated", "igpt"])
def test_sample_writes_a_grid_of_the_asked_number_of_images(runs, capsys, tmp_path, name):
    path = tmp_path / "grid.png"
    extra = ["--class", "3"] if name != "pixelcnn" else []
    code, out, err = cli(capsys, "sample", runs[name], "--out", path, "--num-samples", "3", *extra, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["images"] == 3 and summary["out"] == str(path)
    width, height = png_size(path)
    assert width > 2 * height  # three images side by side


@pytest.mark.parametrize("name", ["gated", "igpt"])
def test_completion_keeps_the_top_half_of_the_real_image(runs, capsys, tmp_path, name):
    import torch

    from attnlab.decode.pixels import sample_images
    from attnlab.decode.sampling import sampling_picker
    from attnlab.train.load import load_run

    path = tmp_path / "completion.png"
    code, out, err = cli(capsys, "sample", runs[name], "--out", path, "--num-samples", "2", "--complete", "test:5")
    assert code == 0, err
    assert "completions of the top half of test image 5" in out and path.exists()
    # The library call behind it: the given rows come back unchanged.
    run = load_run(runs[name])
    given = torch.randint(0, 256, (2, 28, 28))
    images = sample_images(run.model, torch.tensor([1, 1]), sampling_picker(1.0), given=given, given_rows=14)
    assert torch.equal(images[:, :14].long(), given[:, :14]) and not torch.equal(images[:, 14:].long(), given[:, 14:])


def test_wavenet_says_a_digit_into_a_wav(runs, capsys, tmp_path):
    path = tmp_path / "seven.wav"
    code, out, err = cli(
        capsys,
        "sample",
        runs["wavenet"],
        "--digit",
        "7",
        "--speaker",
        "jackson",
        "--out",
        path,
        "--seconds",
        "0.05",
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)
    samples = read_wav(path)
    assert len(samples) == summary["samples"] == 400 and summary["generation"] == "cached"
    assert np.abs(samples.astype(int)).max() > 0


def test_naive_and_cached_generation_write_the_same_wav(runs, capsys, tmp_path):
    args = ("sample", runs["wavenet"], "--digit", "2", "--speaker", "george", "--seconds", "0.02", "--seed", "5")
    assert cli(capsys, *args, "--out", tmp_path / "a.wav")[0] == 0
    assert cli(capsys, *args, "--out", tmp_path / "b.wav", "--naive")[0] == 0
    assert np.array_equal(read_wav(tmp_path / "a.wav"), read_wav(tmp_path / "b.wav"))


@pytest.mark.parametrize("name", ["vit", "hybrid"])  # 7 x 7 patches, and the stem's 4 x 4 cells
def test_vit_attention_is_drawn_over_the_image(runs, capsys, tmp_path, name):
    path = tmp_path / "cls.png"
    code, out, err = cli(capsys, "attention", runs[name], "--image", "test:5", "--out", path, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert np.array(shown["attention"]).shape == (4, 4) and shown["label"] == 1  # test image 5 is a trouser
    assert png_size(path)[0] > 0


@pytest.mark.parametrize(
    "name, args, fragments",
    [
        ("wavenet", ["--digit", "12", "--speaker", "george"], ["--digit 12 is not a digit of this model", "0-9"]),
        ("wavenet", ["--digit", "-1", "--speaker", "george"], ["--digit -1"]),
        ("wavenet", ["--digit", "1", "--speaker", "nobody"], ["one of george, jackson"]),
        ("wavenet", ["--speaker", "george"], ["pass --digit"]),
        ("gated", ["--class", "10"], ["--class 10 is not a class of this model", "0-9"]),
        ("pixelcnn", ["--class", "3"], ["not conditioned on the class"]),
        ("gated", ["--complete", "test:1000"], ["has 100 images"]),
        ("gated", ["--complete", "dev:3"], ["SPLIT:INDEX"]),
        ("gated", ["--complete", "test5"], ["SPLIT:INDEX"]),
        ("gated", ["--digit", "3"], ["--digit goes with WaveNet runs"]),
        ("vit", [], ["cannot sample"]),
        ("cnn", [], ["cannot sample"]),
    ],
)
def test_bad_sample_requests_are_one_line_and_write_nothing(runs, capsys, tmp_path, name, args, fragments):
    out = tmp_path / ("x.wav" if name == "wavenet" else "x.png")
    assert_user_error(cli(capsys, "sample", runs[name], "--out", out, *args), *fragments)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.skipif(os.name != "posix", reason="needs /proc")
@pytest.mark.parametrize(
    "name, out", [("wavenet", "/proc/seven.wav"), ("gated", "/proc/x.png"), ("wavenet", "/nowhere/x.wav")]
)
def test_unwritable_outputs_are_refused_before_generating(runs, capsys, name, out):
    extra = ["--digit", "7", "--speaker", "george"] if name == "wavenet" else []
    assert_user_error(cli(capsys, "sample", runs[name], "--out", out, *extra), str(Path(out).parent))


def test_wrong_suffixes_and_text_flags_are_refused(runs, capsys, tmp_path):
    assert_user_error(cli(capsys, "sample", runs["wavenet"], "--digit", "1", "--out", tmp_path / "x.mp3"), "FILE.wav")
    assert_user_error(cli(capsys, "sample", runs["gated"], "--out", tmp_path / "x.jpg"), ".png")
    assert_user_error(cli(capsys, "sample", runs["gated"], "--out", tmp_path / "x.png", "--prompt", "hi"), "--prompt")
    assert_user_error(cli(capsys, "attention", runs["gated"], "--image", "test:1"), "ViT")


def test_several_wavs_are_named_as_fsdd_names_its_files(runs, capsys, tmp_path):
    from attnlab.data.audio import fsdd_recordings

    args = ("sample", runs["wavenet"], "--digit", "4", "--speaker", "george", "--seconds", ".01", "--num-samples", "2")
    assert cli(capsys, *args, "--out", tmp_path / "4_wavenet.wav")[0] == 0
    found = fsdd_recordings(tmp_path, "all")
    assert [(r.path.name, r.digit, r.speaker) for r in found] == [
        ("4_wavenet_1.wav", 4, "wavenet"),
        ("4_wavenet_2.wav", 4, "wavenet"),
    ]
