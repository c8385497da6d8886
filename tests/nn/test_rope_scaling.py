"""RoPE's yarn and dynamic scalings (attnlab.nn.positions) against transformers' own: the
frequencies and attention factor of `ROPE_INIT_FUNCTIONS`, and the logits of small Qwen2 and Llama
folders whose config.json asks for them (imported by attnlab.models.hf.llama's `rope_fields_from_hf`)."""

import json

import pytest
import torch

from attnlab.decode.sampling import greedy
from attnlab.errors import CheckpointError
from attnlab.models.hf.auto import causal_lm_model
from attnlab.nn.positions import RopeScaling, RotaryPositions

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

VOCAB = 61
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=16,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# (theta, head dim, factor, pre-training context, beta_fast, beta_slow): ramps that fall inside,
# across and outside the head's pairs.
YARN = [
    (10000.0, 16, 4.0, 16, 32.0, 1.0),
    (1e6, 64, 8.0, 4096, 32.0, 1.0),
    (10000.0, 128, 2.5, 2048, 16.0, 2.0),
    (500.0, 32, 16.0, 64, 8.0, 0.5),
]


def their_frequencies(rope: dict, head_dim: int, context: int, seq_len: int | None = None) -> tuple:
    config = transformers.LlamaConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, max_position_embeddings=context, rope_parameters=rope
    )
    return ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu", seq_len=seq_len)


def our_frequencies(scaling: RopeScaling, theta: float, head_dim: int, length: int = 0) -> torch.Tensor:
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return scaling.frequencies(inv_freq, length, theta=theta)


@pytest.mark.parametrize("theta, head_dim, factor, context, fast, slow", YARN)
def test_yarn_frequencies_equal_transformers(theta, head_dim, factor, context, fast, slow):
    rope = dict(rope_type="yarn", rope_theta=theta, factor=factor, original_max_position_embeddings=context)
    want, want_attention = their_frequencies(rope | dict(beta_fast=fast, beta_slow=slow), head_dim, context * 4)
    scaling = RopeScaling("yarn", factor, context, beta_fast=fast, beta_slow=slow)
    got = our_frequencies(scaling, theta, head_dim)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert not torch.equal(got, our_frequencies(RopeScaling(), theta, head_dim))  # something is stretched
    from attnlab.models.hf.llama import yarn_attention_factor

    assert yarn_attention_factor(factor, None, None) == pytest.approx(want_attention, rel=1e-12)


def test_yarn_attention_factor_with_mscale_equals_transformers():
    from attnlab.models.hf.llama import yarn_attention_factor

    rope = dict(rope_type="yarn", rope_theta=1e4, factor=40.0, original_max_position_embeddings=64)
    _, want = their_frequencies(rope | dict(mscale=1.0, mscale_all_dim=0.707), 16, 256)
    assert yarn_attention_factor(40.0, 1.0, 0.707) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("length", [5, 16, 17, 40, 300])
def test_dynamic_frequencies_follow_the_length_as_transformers(length):
    """At or within the pre-training context the frequencies are RoPE's own; past it, transformers'
    at seq_len = length (its init function, which its forward calls with the longest position)."""
    rope = dict(rope_type="dynamic", rope_theta=10000.0, factor=3.0)
    want, attention = their_frequencies(rope, 16, 16, seq_len=length)
    got = our_frequencies(RopeScaling("dynamic", 3.0, 16), 10000.0, 16, length)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0)
    assert attention == 1.0
    assert torch.equal(got, our_frequencies(RopeScaling(), 10000.0, 16)) == (length <= 16)


def test_rotary_positions_pick_the_dynamic_base_by_the_longest_position():
    rotary = RotaryPositions(2, 16, theta=10000.0, scaling=RopeScaling("dynamic", 2.0, 8))
    pos = torch.arange(20)
    full = rotary.angles(pos)
    torch.testing.assert_close(
        full, pos.float()[:, None] * our_frequencies(RopeScaling("dynamic", 2.0, 8), 1e4, 16, 20)
    )
    unscaled = pos[:8].float()[:, None] * our_frequencies(RopeScaling(), 1e4, 16)
    torch.testing.assert_close(rotary.angles(pos[:8]), unscaled)  # within the context: RoPE's own base
    assert not torch.allclose(full[:8], unscaled)


# -- whole models: folders transformers writes ------------------------------------------------------

FOLDERS = {
    "qwen2-yarn": ("Qwen2Config", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
    "llama-yarn-mscale": (
        "LlamaConfig",
        {"rope_type": "yarn", "factor": 3.0, "beta_fast": 8.0, "beta_slow": 0.5, "mscale": 1.0, "mscale_all_dim": 0.5},
    ),
    "llama-dynamic": ("LlamaConfig", {"rope_type": "dynamic", "factor": 2.0}),
}


def hf_model(case: str) -> torch.nn.Module:
    """A small random transformers model of `case`, moved away from its init."""
    class_name, rope = FOLDERS[case]
    torch.manual_seed(0)
    config = getattr(transformers, class_name)(**SHAPE, rope_parameters={"rope_theta": 10000.0, **rope})
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                p.normal_(0.0, 1.0)
    return model.eval()


@pytest.fixture(scope="module", params=list(FOLDERS))
def pair(request, tmp_path_factory):
    theirs = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(folder)
    return request.param, folder, causal_lm_model(folder)


def tokens(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("length", [11, 40])
def test_logits_equal_transformers_within_and_past_the_context(pair, length):
    """Sequences shorter and longer than max_position_embeddings (16). transformers' dynamic RoPE
    keeps state between calls, so each length gets a freshly loaded transformers model."""
    case, folder, ours = pair
    assert ours.config.rope_scaling == case.split("-")[1]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    idx = tokens(length)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=0)


def test_cached_greedy_decoding_equals_transformers(pair):
    """Decoding from 6 tokens to the context's end (16; past YaRN's pre-training context of 8).
    attnlab's decoding slides its window at block_size (max_position_embeddings, dynamic NTK's
    pre-training context), recomputing the last block_size tokens in full: a cache never holds keys
    rotated at two different dynamic bases."""
    _, folder, ours = pair
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt = tokens(6, seed=3)
    with torch.no_grad():
        want = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False)
    assert greedy(ours, prompt, 10, use_cache=True).tolist() == want.tolist()


def test_yarn_truncate_false_is_refused_by_name(tmp_path):
    hf_model("qwen2-yarn").save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["rope_parameters"]["truncate"] = False
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: rope_parameters.truncate=False .*yarn"):
        causal_lm_model(tmp_path)
