"""Decoding on the GPU: with a cache and without it, every strategy picks the same greedy tokens.

GPT: the KV cache against recomputing the window (past the point where it slides), eagerly and
through torch.compile. Translation: beam search's cached decoder steps (beam 1, sentences
batched) against the whole decoder rerun for every token. WaveNet: its per-layer cache against
the naive window. PixelCNN (no cache) and the pixel GPT (its KV cache): each greedily sampled
pixel is the argmax of one pass over the finished image. fp32, TF32 off (conftest.exact_fp32).
"""

import warnings

import pytest
import torch

import attnlab
from attnlab.decode import encode_prompt, greedy, greedy_picker
from attnlab.decode.audio import generate_audio
from attnlab.decode.pixels import sample_images
from attnlab.decode.seq2seq import greedy_translate, length_limits
from attnlab.models.pixels import pixel_logits
from attnlab.models.wavenet import WaveNet, WaveNetConfig
from attnlab.tasks import open_task
from gpu.families import FAMILIES

pytestmark = pytest.mark.cuda

PROMPTS = ("ROMEO:", "First Citizen:\nWe are")
NEW_TOKENS = 50  # past block_size (32): the window slides


@pytest.fixture(scope="module")
def lm(trained, device):
    return attnlab.load(trained("gpt"), device=str(device))


def prompts(run, device) -> list[torch.Tensor]:
    """Each prompt alone `(1, T)`, and a batch of three random prompts `(3, 5)`."""
    ids = [encode_prompt(run.tokenizer, p, device) for p in PROMPTS]
    rows = torch.randint(run.model.config.vocab_size, (3, 5), generator=torch.Generator().manual_seed(0))
    return [*ids, rows.to(device)]


def test_gpt_greedy_tokens_are_the_same_with_and_without_the_kv_cache(lm, device):
    for idx in prompts(lm, device):
        cached = greedy(lm.model, idx, NEW_TOKENS)
        assert cached.device.type == device.type and cached.shape == (idx.size(0), idx.size(1) + NEW_TOKENS)
        assert torch.equal(cached, greedy(lm.model, idx, NEW_TOKENS, use_cache=False))


def test_compiled_gpt_decoding_gives_the_eager_tokens(lm, device):
    if device.type != "cuda":
        pytest.skip("compiled decoding on the CPU: tests/decode/test_sampling.py")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="compiled decoding failed")  # no quiet fallback to eager
        for idx in prompts(lm, device):
            assert torch.equal(greedy(lm.model, idx, NEW_TOKENS, compile=True), greedy(lm.model, idx, NEW_TOKENS))


SOURCES = ("Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee auf einer Wiese.", "Eine Frau liest.")


def uncached_greedy(model, src: torch.Tensor, bos_id: int, eos_id: int) -> list[int]:
    """Greedy translation of one sentence src `(1, S)` that reruns the whole decoder over the target
    so far for every token (no cache), under beam search's rules: <pad> and <bos> never chosen, the
    same length limit, after which the sentence must end."""
    cap = getattr(model.config, "max_len", 256) - 1
    limit = int(length_limits(src, model.pad_id, 1.5, 10, cap)[0])
    out: list[int] = []
    with torch.inference_mode():
        while len(out) + 1 < limit:
            logits = model(src, torch.tensor([[bos_id, *out]], device=src.device))[0, -1].float()
            logits[[model.pad_id, bos_id]] = float("-inf")
            token = int(logits.argmax())
            if token == eos_id:
                break
            out.append(token)
    return out


@pytest.mark.parametrize("family", ["translation", "translation-rnn"])
def test_cached_translation_is_the_uncached_greedy_one(family, trained, device):
    run = attnlab.load(trained(family), device=str(device))
    task = open_task(run)
    ids, _ = task.encode_sources(list(SOURCES))
    src = torch.full((len(ids), max(map(len, ids))), run.model.pad_id, dtype=torch.long)
    for row, sentence in enumerate(ids):
        src[row, : len(sentence)] = torch.tensor(sentence)
    cached = greedy_translate(run.model, src.to(device), bos_id=task.bos_id, eos_id=task.eos_id)
    for sentence, got in zip(ids, cached, strict=True):
        alone = torch.tensor([sentence], device=device)
        assert got == uncached_greedy(run.model, alone, task.bos_id, task.eos_id)


def test_wavenet_cached_generation_is_the_naive_one(device):
    config = WaveNetConfig(residual_channels=8, dilation_channels=8, skip_channels=8, layers_per_block=4, n_blocks=2)
    torch.manual_seed(0)
    model = WaveNet(config).to(device)
    digits = torch.tensor([3, 7], device=device)
    cached = generate_audio(model, digits, None, 120, greedy_picker())  # past the receptive field (31)
    assert cached.device.type == device.type and cached.shape == (2, 120)
    assert torch.equal(cached, generate_audio(model, digits, None, 120, greedy_picker(), cached=False))


@pytest.mark.parametrize("family", ["pixelcnn", "pixel-gpt"])
def test_greedy_pixels_are_the_argmax_of_one_pass_over_the_image(family, device, tmp_path):
    config = FAMILIES[family].config()
    torch.manual_seed(0)
    model = FAMILIES[family].task(config, tmp_path).build_model().to(device).eval()
    labels = torch.tensor([2, 9], device=device)
    images = sample_images(model, labels, greedy_picker())  # the GPT through its KV cache
    assert images.device.type == device.type and images.shape == (2, 28, 28)
    # Pixel i sees only the pixels before it, which sampling had already fixed as they are now.
    with torch.no_grad():
        assert torch.equal(pixel_logits(model, images, labels).argmax(1), images.long())
