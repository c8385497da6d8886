"""Today's causal-LM families (Qwen2, Qwen3, Llama 3's scaled RoPE, Mistral's window, SmolLM3's NoPE
layers) imported from folders that transformers writes, against transformers itself.

For each family, several small random shapes (odd head counts, grouped-query ratios, heads sized
apart from the width; the shapes are the test's own, not a fixture shared with the importers):
the logits equal transformers' within 1e-4 on a batch without padding and on a right-padded batch
(transformers given the attention mask), and cached greedy decoding gives transformers' 64 greedy
tokens. The weights are moved far from their initialisation (as tests/models/hf/test_llama.py
explains) so that a mixed-up head, a missing bias or norm, or a wrong rotary frequency moves the
logits far past the tolerance.
"""

import json

import pytest
import torch

from attnlab.accel import coverage
from attnlab.accel.fused import gpt_step
from attnlab.decode.sampling import greedy
from attnlab.errors import CheckpointError
from attnlab.models.hf._common import save_hf_checkpoint
from attnlab.models.hf.auto import causal_lm_export, causal_lm_model

transformers = pytest.importorskip("transformers")

VOCAB = 97
BASE = dict(
    vocab_size=VOCAB,
    num_hidden_layers=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=None,
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Short, so that the head's wavelengths fall on all three sides of the ramp.
    "original_max_position_embeddings": 32,
}

# name -> (config class, fields)
CASES = {
    "qwen2-gqa": (
        "Qwen2Config",
        dict(hidden_size=48, intermediate_size=64, num_attention_heads=6, num_key_value_heads=2),
    ),
    "qwen2-odd-heads": (
        "Qwen2Config",
        dict(
            hidden_size=40, intermediate_size=56, num_attention_heads=5, num_key_value_heads=5, tie_word_embeddings=True
        ),
    ),
    "qwen2-window-layers": (
        "Qwen2Config",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,
        ),
    ),
    "qwen3-head-dim-apart": (
        "Qwen3Config",
        dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    ),
    "qwen3-mqa-odd": (
        "Qwen3Config",
        dict(
            hidden_size=36,
            intermediate_size=40,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=10,
            tie_word_embeddings=True,
        ),
    ),
    "llama3-rope": (
        "LlamaConfig",
        dict(
            hidden_size=64,
            intermediate_size=80,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=LLAMA3_ROPE,
            tie_word_embeddings=True,
        ),
    ),
    "llama-linear-rope": (
        "LlamaConfig",
        dict(
            hidden_size=32,
            intermediate_size=40,
            num_attention_heads=2,
            num_key_value_heads=1,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        ),
    ),
    "mistral-window": (
        "MistralConfig",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=7,
        ),
    ),
    "mistral-head-dim-apart": (
        "MistralConfig",
        dict(
            hidden_size=30,
            intermediate_size=48,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=12,
            sliding_window=None,
        ),
    ),
    "smollm3-nope": (
        "SmolLM3Config",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 2e6},
        ),
    ),
    "gemma3-interleaved": (
        "Gemma3TextConfig",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            query_pre_attn_scalar=20,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    ),
    "gemma3-softcap-mqa": (
        "Gemma3TextConfig",
        dict(
            hidden_size=24,
            intermediate_size=40,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=5,
            layer_types=["full_attention", "sliding_attention"],
            final_logit_softcapping=3.0,
        ),
    ),
    "phi3-longrope-partial": (
        "Phi3Config",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            original_max_position_embeddings=16,  # decoding crosses it: the long factors take over
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.7],
                "long_factor": [2.5, 6.0],
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    "phi4-mini-partial-tied": (
        "Phi3Config",
        dict(
            hidden_size=48,
            intermediate_size=40,
            num_attention_heads=6,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        ),
    ),
}


def hf_model(case: str, seed: int = 0) -> torch.nn.Module:
    """A small random transformers model of `case`, far from its initialisation."""
    class_name, fields = CASES[case]
    torch.manual_seed(seed)
    config = getattr(transformers, class_name)(**{**BASE, **fields})
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # (Gemma's offset gains then sit near 1 as well: x̂ · (1 + w))
                p.copy_((0.0 if "gemma" in case else 1.0) + 0.2 * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                p.mul_(8.0)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)  # transformers starts biases at 0, where a dropped one would hide
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                p.normal_(0.0, 1.0)
    return model.eval()


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(case, transformers model, attnlab model loaded from the folder transformers saved)."""
    theirs = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(folder)
    ours = causal_lm_model(folder)
    return request.param, theirs, ours


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_logits_without_padding(pair):
    _, theirs, ours = pair
    idx = tokens(2, 29)  # past every test window, so the windows matter
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=0)


def test_logits_with_right_padding(pair):
    """Row 1 is 11 tokens then padding: transformers masks the padding, and a causal model's real
    positions never see what follows them, so attnlab's logits there are those of the padded row
    (LongRoPE picks its factors by the batch's length in both libraries)."""
    _, theirs, ours = pair
    idx = tokens(2, 24, seed=2)
    mask = torch.ones_like(idx)
    mask[1, 11:] = 0
    with torch.no_grad():
        want, got = theirs(idx, attention_mask=mask).logits, ours(idx)
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(got[1, :11], want[1, :11], atol=1e-4, rtol=0)


def test_cached_greedy_decoding_equals_transformers(pair):
    _, theirs, ours = pair
    prompt = tokens(1, 9, seed=3)
    with torch.no_grad():
        want = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64, do_sample=False)
    got = greedy(ours, prompt, 64, use_cache=True)
    assert got.tolist() == want.tolist()


def test_fused_step_covers_only_what_it_computes(pair):
    """Qwen2's q/k/v biases, Qwen3's norms and sizes, windows and NoPE layers are outside the fused
    step: decoding takes PyTorch's path for them. Llama 3's scaled rotary table is inside."""
    case, _, ours = pair
    inside = case.startswith(("llama3", "llama-linear", "mistral-head-dim-apart")) and ours.config.head_size is None
    assert coverage.decodes_gpt(ours) == inside
    if not inside:  # the warning names what is outside, in one line
        with pytest.warns(UserWarning, match=r"decoding eagerly") as caught:
            assert gpt_step(ours, ours.new_cache(1, 16), "fp32") is None
        message = str(caught[0].message)
        assert "\n" not in message and ", not " in message and coverage.undecoded_parts(ours)[0] in message


def test_scaled_rope_reaches_the_fused_step(tmp_path):
    """Llama 3's scaled frequencies in the fused C++ step: its greedy tokens equal transformers'."""
    theirs = hf_model("llama3-rope")
    theirs.save_pretrained(tmp_path)
    ours = causal_lm_model(tmp_path)
    assert gpt_step(ours, ours.new_cache(1, 80), "fp32") is not None  # the C++ step, not PyTorch's path
    prompt = tokens(1, 9, seed=4)
    with torch.no_grad():
        want = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64, do_sample=False)
    assert greedy(ours, prompt, 64, use_cache=True, fused=True).tolist() == want.tolist()


REFUSED = {
    "qwen3-attention-bias": ("qwen3-head-dim-apart", {"attention_bias": True}, ["attention_bias"]),
    "longrope": ("qwen2-gqa", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, ["'longrope'"]),
    "layer-types": ("qwen2-window-layers", {"layer_types": ["full_attention", "chunked"]}, ["layer_types"]),
    "no-rope-layers": ("smollm3-nope", {"no_rope_layers": [1, 1, 2, 0]}, ["no_rope_layers"]),
    "model-type": ("qwen2-gqa", {"model_type": "gemma9"}, ["'gemma9'", "Qwen3"]),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refusals_name_the_field(tmp_path, name):
    case, changes, needles = REFUSED[name]
    hf_model(case).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(CheckpointError) as e:
        causal_lm_model(tmp_path)
    message = str(e.value)
    assert "\n" not in message and "config.json" in message
    for needle in needles:
        assert needle in message, message


def test_export_back_to_the_family_loads_in_transformers(pair, tmp_path):
    """`causal_lm_export` writes the family's own folder (a Mistral without a window is a Llama),
    which transformers' from_pretrained reads to the same logits."""
    case, theirs, ours = pair
    save_hf_checkpoint(causal_lm_export(ours), tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert back.config.model_type in (theirs.config.model_type, "llama")
    idx = tokens(2, 29, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(back(idx).logits, theirs(idx).logits, atol=1e-4, rtol=0)


def test_export_refuses_a_part_no_family_has():
    """A Llama with Gemma's score scale alone is no family: the refusal names the part, where the
    Llama exporter once dropped what it did not know (q/k norms) without a word."""
    from attnlab.errors import ExportError
    from attnlab.models.gpt import GPT, GPTConfig

    llama = dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False, n_heads=2, d_model=16)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=16, n_layers=1, attention_scale=0.3, **llama))
    with pytest.raises(ExportError, match=r"attention_scale = 0\.3"):
        causal_lm_export(model)


LORA_TARGETS = ("query", "key", "value", "output", "gate", "ff-in", "ff-out")


def test_lora_adapters_equal_peft_on_the_family(pair, tmp_path):
    """attnlab's LoRA adapters on the imported model, written as a peft adapter folder: peft's
    PeftModel on transformers' model of the same folder computes the same logits (Phi-3's fused
    layers take one stacked adapter, as GPT-2's c_attn does)."""
    from safetensors.torch import save_file

    from attnlab.models.hf.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, peft_adapter
    from attnlab.nn.lora import add_lora

    peft = pytest.importorskip("peft")
    case, theirs, _ = pair
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    theirs.save_pretrained(base_dir)
    ours = causal_lm_model(base_dir)
    add_lora(ours, LORA_TARGETS, rank=2, alpha=4.0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B starts at zero, which would hide a wrong B path
        for name, p in ours.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    config, tensors = peft_adapter(ours.eval(), base=str(base_dir))
    adapter_dir.mkdir()
    (adapter_dir / ADAPTER_CONFIG).write_text(json.dumps(config), encoding="utf-8")
    save_file(tensors, str(adapter_dir / ADAPTER_WEIGHTS))
    adapted = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
    idx = tokens(2, 20, seed=6)
    with torch.no_grad():
        want, got, base = adapted.eval()(input_ids=idx).logits, ours(idx), theirs(idx).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert (base - want).abs().max() > 1e-3  # the adapters change the logits: the check has teeth
