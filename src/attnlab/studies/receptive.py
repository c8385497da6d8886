"""Beyond text, counted: how far back each autoregressive model sees, and how many sequential steps
training and generation take, for the models of the image and audio presets.

The lecture's trade-off: an image is a sequence of 784 pixels, a second of speech 8,000 samples.
An RNN sees all of the past but runs t sequential steps even to train; a Transformer trains in d
parallel steps and sees all of the past, at t² cost; causal convolutions train in d steps and see
a window that dilation widens exponentially. Generation is sequential for all of them: t model
calls one after another, each d layers deep. What differs is the work per call: a PixelCNN has no
cache and reruns the whole image, naive WaveNet its receptive field, cached WaveNet (Paine et al.
2016) and a Transformer with its KV cache one position per layer.

Counted, not assumed: the receptive fields of the PixelCNNs come from the gradient of one output
pixel of the preset's architecture (narrowed to 8 channels: the width does not change which pixels
connect), WaveNet's from its config (equal to the gradient's, tests/models/test_wavenet.py), and
the RNN's and the Transformer's sequential steps from `attnlab.studies.cost.count_steps`.

Legend: t sequence length, d layers.
"""

import dataclasses
from dataclasses import dataclass

import torch

from attnlab.config import load_preset_or_file
from attnlab.studies.cost import count_steps
from attnlab.train.config import resolve

IMAGE_SIDE = 28
AUDIO_LENGTH = 4000  # half a second at 8 kHz


@dataclass(frozen=True)
class Row:
    model: str
    preset: str
    length: int
    """t: elements in the sequence (pixels, or samples)."""
    seen: int
    """How many earlier elements the output at `position` depends on."""
    earlier: int
    """How many earlier elements there are: seen = earlier means no blind spot, no window limit."""
    position: str
    train_steps: int
    """Sequential steps of one training forward (every position at once)."""
    generate_steps: int
    """Sequential steps to generate the whole sequence: t model calls, each this deep."""
    work_per_element: str
    """What each generation step recomputes, per layer."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _model_config(preset: str):
    return resolve(load_preset_or_file(preset)[1]).model


def pixels_seen(model: torch.nn.Module, r: int, c: int) -> int:
    """Input pixels whose gradient reaches the logits of output pixel (r, c) of a 28 × 28 image, for
    any of 4 random images (a ReLU that is off for one image blocks some paths, not for all four)."""
    x = torch.rand(4, 1, IMAGE_SIDE, IMAGE_SIDE, dtype=torch.float64, requires_grad=True)
    labels = torch.zeros(4, dtype=torch.long) if model.config.n_classes else None
    model.logits(x, labels)[:, :, r, c].sum().backward()
    return int((x.grad != 0).any(0).sum())


def _pixelcnn_row(preset: str, label: str) -> Row:
    from attnlab.tasks.image_density import ImageDensity

    config = dataclasses.replace(_model_config(preset), hidden=8, head_channels=8)
    torch.manual_seed(0)
    model = ImageDensity.build_model_from_config(config).double()
    r = c = IMAGE_SIDE // 2
    depth = config.n_layers + (1 if config.kind == "pixelcnn" else 0)  # masked convolutions in a row
    t = IMAGE_SIDE**2
    return Row(
        label,
        preset,
        t,
        pixels_seen(model, r, c),
        r * IMAGE_SIDE + c,
        f"pixel ({r}, {c})",
        depth,
        t * depth,
        f"{t} positions (no cache: the whole image)",
    )


def autoregressive_rows(audio_length: int = AUDIO_LENGTH, rnn_layers: int = 2) -> list[Row]:
    """The table's rows: PixelCNN, Gated PixelCNN, pixel Transformer and an RNN over the 784 pixels,
    WaveNet (naive and cached generation) over `audio_length` samples."""
    t = IMAGE_SIDE**2
    gpt = _model_config("fashion-igpt")
    wave = _model_config("fsdd-wavenet")
    rf, depth = wave.receptive_field, len(wave.dilations)
    rnn_steps, _ = count_steps("rnn", t, rnn_layers)
    transformer_steps, _ = count_steps("transformer", t, gpt.n_layers)
    last = f"the last (t = {audio_length})"
    return [
        _pixelcnn_row("fashion-pixelcnn", "PixelCNN"),
        _pixelcnn_row("fashion-gated-pixelcnn", "Gated PixelCNN"),
        Row(
            "pixel Transformer",
            "fashion-igpt",
            t,
            t - 1,
            t - 1,
            "the last pixel",
            transformer_steps,
            t * gpt.n_layers,
            f"1 position, attending to <= {t} cached keys",
        ),
        Row(
            f"RNN ({rnn_layers} layers)",
            "-",
            t,
            t - 1,
            t - 1,
            "the last pixel",
            rnn_steps,
            t * rnn_layers,
            "1 position (the carried state)",
        ),
        *(
            Row(
                f"WaveNet, {how}",
                "fsdd-wavenet",
                audio_length,
                min(rf - 1, audio_length - 1),
                audio_length - 1,
                last,
                depth,
                audio_length * depth,
                reads,
            )
            for how, reads in (
                ("naive", f"{rf} positions (the receptive field)"),
                ("cached", "1 position (each layer's queue of past inputs)"),
            )
        ),
    ]


def format_rows(rows: list[Row]) -> str:
    """The rows as a plain-text table."""
    header = ("model", "preset", "t", "earlier elements seen", "train steps", "generation steps", "work per step")
    body = [
        (
            r.model,
            r.preset,
            str(r.length),
            f"{r.seen} of {r.earlier} ({r.position})",
            str(r.train_steps),
            f"{r.generate_steps:,}",
            r.work_per_element,
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in (header, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
