"""The images, image-classification and audio tasks on the real fixture slices: batches, losses
that match their definitions, the pixel GPT's causality, and short training runs that learn."""

import math
from pathlib import Path

import pytest
import torch

from attnlab.errors import ConfigError, UserError
from attnlab.models.pixelcnn import PixelCNNConfig
from attnlab.models.wavenet import WaveNetConfig
from attnlab.tasks import TASKS
from attnlab.tasks.audio_density import SILENCE, AudioDataConfig
from attnlab.tasks.image_density import ImagesDataConfig, PixelGPTConfig, pixel_logits
from attnlab.train import resolve, train

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent.parent / "fixtures"
IMAGES = ImagesDataConfig(data_dir=str(FIXTURES / "fashion-mnist"), val_size=50, eval_images=50)
AUDIO = AudioDataConfig(data_dir=str(FIXTURES / "fsdd"), val_size=4, segment=300, eval_clips=4)


def test_pixel_gpt_is_the_lm_gpt_with_pixels_for_tokens(tmp_path):
    task = TASKS["image-density"](IMAGES, PixelGPTConfig(n_layers=1, n_heads=2, d_model=16, n_classes=10), tmp_path)
    assert task.model_config.vocab_size == 256 + 10 and task.model_config.block_size == 784
    torch.manual_seed(0)
    model = task.build_model().eval()
    x, labels = task.train_batch(0, torch.Generator().manual_seed(0))
    logits = pixel_logits(model, x, labels)
    assert logits.shape == (len(x), 256, 28, 28)
    # Causal: changing pixel j changes no prediction at or before j.
    j = 300
    y = x.clone().view(len(x), -1)
    y[:, j] = 255 - y[:, j]
    changed = (pixel_logits(model, y.view_as(x), labels) - logits).abs().amax(1).view(len(x), -1).amax(0) > 0
    assert not changed[: j + 1].any() and changed[j + 1 :].all()


def test_image_loss_is_the_mean_pixel_cross_entropy_in_nats(tmp_path):
    task = TASKS["image-density"](IMAGES, PixelCNNConfig(hidden=4, n_layers=1, head_channels=8), tmp_path, batch_size=3)
    torch.manual_seed(0)
    model = task.build_model()
    batch = task.train_batch(0, torch.Generator().manual_seed(0))
    logits = model(batch[0]).permute(0, 2, 3, 1).reshape(-1, 256)
    expected = -torch.log_softmax(logits, -1).gather(1, batch[0].long().reshape(-1, 1)).mean()
    assert torch.allclose(task.loss(model, batch, torch.device("cpu")), expected, atol=1e-5)
    metrics = task.__class__(IMAGES, task.model_config, tmp_path, splits=("test",)).evaluate(model, torch.device("cpu"))
    assert metrics["images"] == 100
    assert math.isclose(metrics["test_bits_per_dim"], metrics["test_nll"] / math.log(2))


def test_audio_batches_score_real_samples_with_full_context_only(tmp_path):
    config = WaveNetConfig(residual_channels=4, dilation_channels=4, skip_channels=4, layers_per_block=3, n_blocks=1)
    task = TASKS["audio-density"](AUDIO, config, tmp_path, batch_size=6)
    inputs, targets, digits, speakers = task.train_batch(0, torch.Generator().manual_seed(3))
    assert inputs.shape == targets.shape == (6, 300)
    scored = targets >= 0
    # The inputs are the targets one step late: each sample is predicted from those before it.
    assert torch.equal(inputs[:, 1:][scored[:, :-1] & scored[:, 1:]], targets[:, :-1][scored[:, :-1] & scored[:, 1:]])
    for row in range(6):
        if inputs[row, 0] == SILENCE and scored[row, 0]:
            continue  # a crop from the recording's start: every target counts
        assert not scored[row, : config.receptive_field - 1].any()  # no past: left out
    assert task.model_config.speakers == ()
    with_speakers = TASKS["audio-density"](
        AudioDataConfig(**{**AUDIO.__dict__, "condition_on_speaker": True}), config, tmp_path
    )
    assert with_speakers.model_config.speakers == ("george", "jackson")


def test_unknown_kinds_and_missing_data_are_user_errors(tmp_path):
    with pytest.raises(ConfigError, match="choose one of pixelcnn, gated-pixelcnn, pixel-gpt"):
        resolve({"task": "image-density", "model": {"kind": "vit"}})
    with pytest.raises(UserError, match="pass --data-dir"):
        TASKS["image-density"](ImagesDataConfig(), PixelCNNConfig(), tmp_path)
    with pytest.raises(UserError, match="unknown split 'dev'"):
        TASKS["audio-density"](AUDIO, WaveNetConfig(), tmp_path, splits=("dev",))


def short_run(tmp_path: Path, task: str, model: dict, data: dict, **train_kw) -> list[float]:
    doc = {
        "task": task,
        "model": model,
        "data": data,
        "train": {"max_iters": 30, "eval_interval": 30, "log_interval": 5, "warmup_iters": 2, **train_kw},
    }
    result = train(resolve(doc), tmp_path / "run", progress=False)
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1:]
    return [float(r.split(",")[2]) for r in rows if ",train," in r], result


@pytest.mark.parametrize(
    "task, model, data, train_kw",
    [
        (
            "image-density",
            {"kind": "pixelcnn", "hidden": 8, "n_layers": 2, "head_channels": 16},
            IMAGES,
            {"learning_rate": 3e-3},
        ),
        (
            "image-density",
            {"kind": "gated-pixelcnn", "hidden": 8, "n_layers": 2, "head_channels": 16},
            IMAGES,
            {"learning_rate": 3e-3},
        ),
        (
            "image-density",
            {"kind": "pixel-gpt", "n_layers": 1, "n_heads": 2, "d_model": 16, "n_classes": 10},
            IMAGES,
            {"batch_size": 4, "learning_rate": 3e-3},
        ),
        (
            "image-classification",
            {"kind": "cnn", "conv_channels": [4, 8], "hidden": 16},
            IMAGES,
            {"batch_size": 32, "learning_rate": 3e-3},
        ),
        (
            "image-classification",
            {"kind": "vit", "patch_size": 7, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0},
            IMAGES,
            {"batch_size": 32, "learning_rate": 3e-3},
        ),
        (
            "audio-density",
            {
                "kind": "wavenet",
                "residual_channels": 8,
                "dilation_channels": 8,
                "skip_channels": 8,
                "layers_per_block": 4,
                "n_blocks": 1,
            },
            AUDIO,
            {"batch_size": 4, "learning_rate": 3e-3},
        ),
    ],
    ids=["pixelcnn", "gated", "gpt", "cnn", "vit", "wavenet"],
)
def test_each_model_learns_in_a_short_run(tmp_path, task, model, data, train_kw):
    losses, result = short_run(tmp_path, task, model, data.__dict__, **train_kw)
    assert sum(losses[-2:]) < sum(losses[:2]), losses
    assert result.best is not None and math.isfinite(result.best)


DIGITS = {"data_dir": str(FIXTURES / "fsdd"), "val_size": 4}


def test_digit_classifier_learns_and_scores_any_folder_of_fsdd_named_files(tmp_path):
    from attnlab.data.audio import read_wav, write_wav
    from attnlab.train.evaluate import evaluate_run

    model = {"kind": "spectrogram-cnn", "channels": [8, 8], "dropout": 0.0}
    losses, result = short_run(tmp_path, "audio-classification", model, DIGITS, batch_size=8, learning_rate=3e-3)
    assert sum(losses[-2:]) < sum(losses[:2]), losses
    # Split "all": every DIGIT_SPEAKER_INDEX.wav of a folder, whatever its index (generated samples).
    folder = tmp_path / "generated"
    folder.mkdir()
    for digit in (3, 8):
        for i in range(1, 4):
            write_wav(folder / f"{digit}_wavenet_{i}.wav", read_wav(FIXTURES / "fsdd" / f"{digit}_george_0.wav"))
    _, metrics = evaluate_run(tmp_path / "run", "all", data_dir=str(folder))
    assert metrics["recordings"] == 6 and metrics["accuracy"] in {k / 6 for k in range(7)}
