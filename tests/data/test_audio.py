"""WAV reading and writing, μ-law companding against its formula, FSDD's split; on the real FSDD slice."""

import math
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data.audio import fsdd_recordings, mu_law_decode, mu_law_encode, read_wav, write_wav
from attnlab.errors import UserError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "fsdd"


def mu_law_reference(x: float, mu: int = 255) -> int:
    """G.711 / WaveNet §2.2 written out for one sample: f(x) = sign(x) ln(1 + μ|x|) / ln(1 + μ),
    then (f + 1) / 2 spread over μ + 1 levels, rounded to the nearest."""
    f = math.copysign(math.log(1 + mu * abs(x)) / math.log(1 + mu), x)
    return int(math.floor((f + 1) / 2 * mu + 0.5))


def test_mu_law_encode_matches_the_formula():
    xs = np.concatenate([np.linspace(-1, 1, 2001), [1e-4, -1e-4, 0.5, -0.5]])
    got = mu_law_encode(torch.tensor(xs, dtype=torch.float64)).tolist()
    assert got == [mu_law_reference(x) for x in xs]
    assert mu_law_encode(torch.tensor([-1.0, 0.0, 1.0])).tolist() == [0, 128, 255]


def test_mu_law_round_trip():
    levels = torch.arange(256)
    assert torch.equal(mu_law_encode(mu_law_decode(levels)), levels)  # every class decodes to itself
    x = torch.linspace(-1, 1, 10001)
    q = mu_law_encode(x)
    error = (mu_law_decode(q) - x).abs()
    # x lies between the values of the levels beside its own: the error is at most one level's width there.
    below, above = mu_law_decode((q - 1).clamp(min=0)), mu_law_decode((q + 1).clamp(max=255))
    assert (error <= torch.maximum(mu_law_decode(q) - below, above - mu_law_decode(q)) + 1e-6).all()
    # μ-law's levels are dense near 0 and sparse near ±1: the error is 50x smaller in the quiet part.
    assert error.max() < 0.03 and error[x.abs() < 0.001].max() * 50 < error.max()


def test_reads_a_real_recording_and_writes_it_back_identically(tmp_path):
    path = FIXTURE / "7_george_0.wav"
    samples = read_wav(path)
    with wave.open(str(path)) as w:
        assert len(samples) == w.getnframes()
        assert samples.tobytes() == w.readframes(w.getnframes())
    assert samples.dtype == np.int16
    out = tmp_path / "copy.wav"
    write_wav(out, samples)
    assert np.array_equal(read_wav(out), samples)
    assert not list(tmp_path.glob(".copy.wav*"))  # no temporary left beside it


def write_raw(path: Path, channels: int, width: int, rate: int) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(b"\0" * channels * width * 100)
    return path


@pytest.mark.parametrize(
    "channels, width, rate, said",
    [(2, 2, 8000, "2-channel 16-bit"), (1, 1, 8000, "1-channel 8-bit"), (1, 2, 16000, "at 16000 Hz")],
)
def test_other_formats_are_refused_in_one_line_naming_the_file(tmp_path, channels, width, rate, said):
    path = write_raw(tmp_path / "odd.wav", channels, width, rate)
    with pytest.raises(UserError) as e:
        read_wav(path)
    message = str(e.value)
    assert "odd.wav" in message and said in message and "expected mono 16-bit at 8000 Hz" in message
    assert "\n" not in message


def test_a_file_that_is_not_a_wav_is_a_user_error(tmp_path):
    path = tmp_path / "noise.wav"
    path.write_bytes(b"not a riff file at all")
    with pytest.raises(UserError, match="noise.wav is not a readable PCM WAV file"):
        read_wav(path)


def test_fsdd_official_split_by_index():
    test, train = fsdd_recordings(FIXTURE, "test"), fsdd_recordings(FIXTURE, "train")
    assert len(test) == 20 and all(r.index == 0 for r in test)
    assert len(train) == 20 and all(r.index >= 5 for r in train)
    assert {r.digit for r in test} == set(range(10)) and {r.speaker for r in train} == {"george", "jackson"}
