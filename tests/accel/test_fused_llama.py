"""attnlab.accel.fused on today's architectures: RMSNorm, gated feed-forward layers, rotary
positions, grouped- and multi-query attention, untied heads, no biases, mixtures of experts.

Each architecture, built from `GPTConfig` or imported from a Hugging Face folder, is held to the
model's own (PyTorch's) decoding step: logits within float32 rounding (`tests/tolerance.py`) at
every step of a 200-token greedy continuation, the same 200 tokens through `greedy`, and the same
tokens through continuous batching. Parts still outside the step keep decoding eagerly.
"""

import json

import pytest
import torch

from attnlab.accel.fused import FusedStep, by_default, extension, supports
from attnlab.decode import greedy
from attnlab.decode.batching import Batcher, Sequence
from attnlab.models.hf import load_causal_lm
from decode.conftest import tiny_gpt
from decode.test_batching import REQUESTS, alone, prompts, recording, run_staggered
from helpers import cli
from hf_folders import PROMPT, causal_lm_folder
from tolerance import assert_float32_close, gpt_sums

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(extension() is None, reason="the fused step could not be built here"),
]

STEPS = 200
LLAMA = dict(normalization="rmsnorm", activation="swiglu", positions="rope", bias=False, n_heads=4, n_kv_heads=2)
ARCHITECTURES = {
    "rmsnorm-no-bias": dict(normalization="rmsnorm", bias=False),
    "swiglu": dict(activation="swiglu"),
    "geglu": dict(activation="geglu", normalization="rmsnorm"),
    "rope": dict(positions="rope"),
    "rope-theta-1e6": dict(positions="rope", rope_theta=1e6),
    "gqa": dict(n_heads=4, n_kv_heads=2),
    "mqa": dict(n_heads=4, n_kv_heads=1, positions="rope"),
    "llama": LLAMA,
    "llama-tied": LLAMA | dict(tie_weights=True),
    "mixtral": LLAMA | dict(experts=3, expert_top_k=2),
    "switch": dict(experts=4, expert_top_k=1, expert_every=2),  # dense GELU experts with biases
}


def model_of(name: str, **overrides):
    """A tiny GPT of the architecture `name` whose cache holds 4 + 200 positions."""
    return tiny_gpt(block_size=256, **(ARCHITECTURES[name] | overrides))


def assert_steps_equal_the_model(model, prompt: torch.Tensor, steps: int) -> None:
    """Greedy decoding after `prompt`, the fused step beside the model's own step for `steps` steps:
    logits within the float32 bound at every step and the same token picked from both."""
    rows, length = prompt.shape
    with torch.inference_mode():
        ours, theirs = model.new_cache(rows), model.new_cache(rows)
        model(prompt, cache=ours, last_only=True)
        expected = model(prompt, cache=theirs, last_only=True)
        step = FusedStep(model, extension(), ours)
        for position in range(length, length + steps):
            token = expected[:, -1].argmax(-1, keepdim=True)
            expected = model(token, cache=theirs, last_only=True)
            got = step(token, ours, position)
            assert_float32_close(got, expected, **gpt_sums(model.config))
            assert torch.equal(got[:, -1].argmax(-1), expected[:, -1].argmax(-1)), position
        for a, b in zip(ours, theirs, strict=True):  # the rotated keys, the shared heads
            assert_float32_close(a.k, b.k, **gpt_sums(model.config))
            assert_float32_close(a.v, b.v, **gpt_sums(model.config))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_each_architecture_steps_as_the_model_does_for_200_tokens(name):
    model = model_of(name)
    assert supports(model, model.new_cache(1)) and by_default(model)
    prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(0))
    assert_steps_equal_the_model(model, prompt, STEPS)


@pytest.mark.parametrize("name", ["llama", "mixtral", "switch"])
def test_greedy_gives_the_eager_tokens_for_200_steps(name):
    model = model_of(name)
    prompt = torch.randint(0, 23, (3, 4), generator=torch.Generator().manual_seed(1))
    eager = greedy(model, prompt, STEPS)
    assert len(set(eager[0, 4:].tolist())) > 5  # a continuation that wanders, not one token repeated
    assert torch.equal(greedy(model, prompt, STEPS, fused=True), eager)


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_imported_hugging_face_models_decode_through_the_step(tmp_path, family):
    """Llama and Mixtral as `attnlab.models.hf` imports them: RMSNorm, SwiGLU (experts), RoPE,
    4 query heads on 2 key/value heads, no biases, an untied head."""
    causal_lm_folder(tmp_path, family)
    config = json.loads((tmp_path / "config.json").read_text())
    # Room for 200 new tokens in the cache; rotary positions have no table, so the weights still fit.
    (tmp_path / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 256}))
    model = load_causal_lm(tmp_path).model
    assert model.config.kv_heads == 2 and not model.config.tie_weights
    assert supports(model, model.new_cache(1)) and by_default(model)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # from init's 0.02 a random model repeats one token; give it a path to follow
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5, generator=generator)
    prompt = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    assert_steps_equal_the_model(model, prompt, STEPS)
    assert torch.equal(greedy(model, prompt, STEPS, fused=True), greedy(model, prompt, STEPS))


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_attnlab_sample_on_a_hugging_face_folder_takes_the_step_by_default(tmp_path, capsys, monkeypatch, family):
    from attnlab.accel import fused

    causal_lm_folder(tmp_path, family)
    steps = []
    gpt_step = fused.gpt_step
    monkeypatch.setattr(fused, "gpt_step", lambda *a: steps.append(gpt_step(*a)) or steps[-1])
    args = ("sample", str(tmp_path), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "30")
    code, default, _ = cli(capsys, *args)
    assert code == 0 and len(steps) == 1 and isinstance(steps[0], FusedStep)
    code, eager, _ = cli(capsys, *args, "--no-fused")
    assert code == 0 and len(steps) == 1 and default == eager


@pytest.mark.parametrize("name", ["llama", "mixtral"])
def test_continuous_batching_takes_the_step_and_gives_the_tokens_of_decoding_alone(name):
    """Rows at their own positions (each rotated by its own), prompts prefilled together in one
    call, windows slid past the block: the tokens each sequence gets decoded alone."""
    model = tiny_gpt(**ARCHITECTURES[name])  # block 16: the longer requests slide their windows
    requests = [(p, m) for p, (_, m) in zip(prompts(seed=11), REQUESTS, strict=True)]
    batcher = Batcher(model, max_batch=8, fused=True)
    assert batcher.runner.fused is not None
    finished = run_staggered(batcher, requests)
    by_prompt = {tuple(s.prompt): s for s in finished}
    for prompt, max_new in requests:
        assert by_prompt[tuple(prompt)].tokens == alone(model, prompt, max_new), (len(prompt), max_new)


@pytest.mark.parametrize("name", ["llama", "mixtral"])
def test_the_fused_prefill_gives_each_prompt_the_logits_of_its_own_prefill(name):
    model = tiny_gpt(**ARCHITECTURES[name])
    ps = prompts(seed=17)  # 3, 1, 7, 12, 20 (its last 16), 5, 2 and 9 tokens: more than the 8 rows
    picked: list[torch.Tensor] = []
    batcher = Batcher(model, max_batch=8, fused=True)
    seqs = batcher.join_all([Sequence(p, 2, pick=recording(picked)) for p in ps])
    for seq, logits in zip(seqs, picked, strict=True):
        with torch.inference_mode():
            window = torch.tensor([seq.prompt[-16:]])
            expected = model(window, last_only=True)[:, -1]
        assert_float32_close(logits, expected, **gpt_sums(model.config))
        n = seq.filled
        cache = model.new_cache(1)
        with torch.inference_mode():
            model(window, cache=cache, last_only=True)
        for mine, its in zip(batcher.runner.cache, cache, strict=True):
            assert_float32_close(mine.k[seq.row, :, :n], its.k[0, :, :n], **gpt_sums(model.config))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(positions="alibi"),
        dict(normalization="rezero+rmsnorm"),
        dict(experts=3, capacity_factor=1.0),  # a token's experts depend on the rest of its batch
        dict(activation="elu"),
        LLAMA | dict(norm="post"),
    ],
    ids=["alibi", "rezero", "capacity", "elu", "post-norm"],
)
def test_parts_the_step_does_not_cover_decode_eagerly_with_a_warning(overrides):
    model = tiny_gpt(**overrides)
    assert not supports(model, model.new_cache(1)) and not by_default(model)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.warns(UserWarning, match="decoding eagerly"):
        got = greedy(model, prompt, 8, fused=True)
    assert torch.equal(got, greedy(model, prompt, 8))
