"""attnlab.models.hf.load_llama / load_mixtral: checkpoints saved by transformers give HF's logits.

The reference is transformers itself: a tiny randomly initialised LlamaForCausalLM or
MixtralForCausalLM is saved to a temp folder (nothing is downloaded), loaded back as an attnlab
`GPT`, and both score the same tokens. The configurations cover grouped-query attention (2 key/value
heads for 4 query heads), multi-query attention (1), tied and untied embeddings and rope_theta.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.errors import CheckpointError, UserError
from attnlab.models.hf import llama_config_from_hf, load_llama, load_mixtral, mixtral_config_from_hf

transformers = pytest.importorskip("transformers")

VOCAB = 101
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=40,  # not a multiple of the width: attnlab takes F as given
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
)
MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2)
LOADERS = {"llama": load_llama, "mixtral": load_mixtral}


def hf_model(family: str, *, seed: int = 0, base: bool = False, rope_theta: float | None = None, **overrides):
    """A tiny random HF Llama or Mixtral in eval mode, far from its init where a mix-up would hide.

    RMSNorm gains move off 1, q and k are scaled up so attention is far from uniform (a head or
    key/value-group mix-up then moves the logits well beyond the tolerance), the embedding and head
    are scaled up so the logits are of order 1, and Mixtral's router is scaled up so that each
    token's top-2 experts win by a wide margin (no near-ties that rounding could flip between the
    two libraries).
    """
    torch.manual_seed(seed)
    fields = {**TINY, **(MIXTRAL if family == "mixtral" else {}), **overrides}
    if rope_theta is not None:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
    if family == "llama":
        config = transformers.LlamaConfig(**fields)
        model = (transformers.LlamaModel if base else transformers.LlamaForCausalLM)(config)
    else:
        config = transformers.MixtralConfig(**fields)
        model = (transformers.MixtralModel if base else transformers.MixtralForCausalLM)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
            elif name.endswith(("mlp.gate.weight", "embed_tokens.weight", "lm_head.weight")):
                p.normal_(0.0, 1.0)  # Mixtral's router; logits of order 1, not 0.1
    return model.eval()


@torch.no_grad()
def hf_logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    if hasattr(model, "lm_head"):
        return model(idx).logits
    return model(idx).last_hidden_state @ model.embed_tokens.weight.T  # a base model: the tied head


def assert_same_logits(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    idx = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = ours(idx)
    torch.testing.assert_close(got, hf_logits(theirs, idx), atol=1e-4, rtol=0)


def saved(model: torch.nn.Module, folder, **kwargs):
    model.save_pretrained(folder, **kwargs)
    return folder


def edit_config(folder, *, drop: tuple[str, ...] = (), **changes) -> None:
    path = folder / "config.json"
    doc = {k: v for k, v in json.loads(path.read_text()).items() if k not in drop}
    path.write_text(json.dumps({**doc, **changes}))


def resave_weights(folder, change) -> None:
    path = folder / "model.safetensors"
    state = load_file(path)
    change(state)
    save_file(state, path)


def check_error(excinfo: pytest.ExceptionInfo, *needles: str) -> None:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, UserError)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


# ---- the same logits --------------------------------------------------------------------------

CASES = {
    "gqa-untied": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "mqa-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "mha-theta": dict(num_key_value_heads=4, tie_word_embeddings=False, rope_theta=500_000.0),
    "gqa-tied-theta": dict(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1234.5),
}


@pytest.mark.parametrize("family", ["llama", "mixtral"])
@pytest.mark.parametrize("case", list(CASES))
def test_same_logits(tmp_path, family, case):
    hf = hf_model(family, **CASES[case])
    model = LOADERS[family](saved(hf, tmp_path))
    c = model.config
    assert not model.training
    assert (c.n_heads, c.n_kv_heads, c.tie_weights) == (4, hf.config.num_key_value_heads, hf.config.tie_word_embeddings)
    assert c.rope_theta == hf.config.rope_parameters["rope_theta"]
    assert (c.normalization, c.activation, c.positions, c.bias, c.ffn_hidden) == (
        "rmsnorm",
        "swiglu",
        "rope",
        False,
        40,
    )
    if family == "mixtral":
        assert (c.experts, c.expert_top_k, c.capacity_factor) == (4, 2, 0.0)
    else:
        assert c.experts == 0
    assert (model.lm_head.weight is model.token_embedding.weight) == c.tie_weights
    assert_same_logits(model, hf)


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_base_model_without_prefix_or_head(tmp_path, family):
    hf = hf_model(family, base=True, tie_word_embeddings=True)
    folder = saved(hf, tmp_path)
    assert not any(k.startswith("model.") for k in load_file(folder / "model.safetensors"))
    assert_same_logits(LOADERS[family](folder), hf)


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_legacy_rope_theta_key(tmp_path, family):
    # Files written before transformers 5 keep rope_theta at the top level, beside rope_scaling=null.
    folder = saved(hf_model(family), tmp_path)
    edit_config(folder, drop=("rope_parameters",), rope_theta=31_000.0, rope_scaling=None)
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.MixtralForCausalLM
    hf = cls.from_pretrained(folder).eval()
    assert hf.config.rope_parameters["rope_theta"] == 31_000.0
    model = LOADERS[family](folder)
    assert model.config.rope_theta == 31_000.0
    assert_same_logits(model, hf)


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_sharded_safetensors(tmp_path, family):
    hf = hf_model(family)
    folder = saved(hf, tmp_path, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    assert_same_logits(LOADERS[family](folder), hf)


def test_mixtral_fused_expert_layout(tmp_path):
    # transformers 5 holds each layer's experts fused (mlp.experts.gate_up_proj / down_proj) and
    # writes Mistral's per-expert names; a file saved straight from its state dict keeps the fused ones.
    hf = hf_model("mixtral")
    state = hf.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    hf.config.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    assert_same_logits(load_mixtral(tmp_path), hf)


def test_mixtral_saved_with_per_expert_names(tmp_path):
    names = load_file(saved(hf_model("mixtral"), tmp_path) / "model.safetensors")
    assert "model.layers.1.block_sparse_moe.experts.3.w3.weight" in names  # what the other tests load


def test_dtype(tmp_path):
    model = load_llama(saved(hf_model("llama"), tmp_path), dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_config_from_dict():
    config = llama_config_from_hf({"model_type": "llama"})  # transformers' defaults: Llama 7B
    assert (config.vocab_size, config.d_model, config.n_layers, config.n_heads, config.n_kv_heads) == (
        32000,
        4096,
        32,
        32,
        32,
    )
    assert (config.ffn_hidden, config.block_size, config.rope_theta, config.layer_norm_eps) == (11008, 2048, 1e4, 1e-6)
    config = mixtral_config_from_hf({"model_type": "mixtral"})  # Mixtral 8x7B
    assert (config.experts, config.expert_top_k, config.capacity_factor, config.rope_theta) == (8, 2, 0.0, 1e6)
    assert config.ffn_hidden == 14336 and config.dropout == 0.0


# ---- refusals ---------------------------------------------------------------------------------

REFUSED = {
    "rope_scaling": ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, ["'longrope'"]),
    "rope_type": (
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "truncate": False}},
        ["truncate"],
    ),
    "rope_extra_key": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}},
        ["partial_rotary_factor"],
    ),
    "attention_bias": ({"attention_bias": True}, ["attention_bias"]),
    "mlp_bias": ({"mlp_bias": True}, ["mlp_bias"]),
    "hidden_act": ({"hidden_act": "gelu"}, ["hidden_act", "'gelu'"]),
    "head_dim": ({"head_dim": 0}, ["head_dim", "positive int"]),
    "model_type": ({"model_type": "mistral"}, ["model_type", "'mistral'"]),
    "kv_heads": ({"num_key_value_heads": 3}, ["n_kv_heads"]),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_llama_refuses_what_attnlab_cannot_represent(tmp_path, name):
    changes, needles = REFUSED[name]
    folder = saved(hf_model("llama"), tmp_path)
    edit_config(folder, **changes)
    with pytest.raises(CheckpointError) as e:
        load_llama(folder)
    check_error(e, "config.json", *needles)


@pytest.mark.parametrize(
    ("changes", "needles"),
    [
        ({"sliding_window": 16}, ["sliding_window"]),
        ({"num_experts_per_tok": 5}, ["expert_top_k"]),
        ({"num_experts_per_tok": 1}, ["num_experts_per_tok=1", "weight 1"]),
        ({"model_type": "llama"}, ["'llama'"]),
        ({"hidden_act": "relu"}, ["hidden_act", "'relu'"]),
        ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, ["'longrope'"]),
    ],
)
def test_mixtral_refuses_what_attnlab_cannot_represent(tmp_path, changes, needles):
    folder = saved(hf_model("mixtral"), tmp_path)
    edit_config(folder, **changes)
    with pytest.raises(CheckpointError) as e:
        load_mixtral(folder)
    check_error(e, "config.json", *needles)


# ---- missing and mismatched tensors -----------------------------------------------------------

TENSOR_ERRORS = {
    ("llama", "missing"): ("model.layers.1.mlp.up_proj.weight", None, "missing tensor"),
    ("llama", "shape"): ("model.layers.0.self_attn.k_proj.weight", (32, 32), "(32, 32)"),
    ("mixtral", "missing"): ("model.layers.1.block_sparse_moe.experts.3.w3.weight", None, "missing tensor"),
    ("mixtral", "shape"): ("model.layers.0.block_sparse_moe.gate.weight", (5, 32), "(5, 32)"),
}


@pytest.mark.parametrize(("family", "kind"), list(TENSOR_ERRORS))
def test_missing_or_mismatched_tensor_is_named(tmp_path, family, kind):
    name, shape, needle = TENSOR_ERRORS[family, kind]
    folder = saved(hf_model(family), tmp_path)
    if shape is None:
        resave_weights(folder, lambda state: state.pop(name))
    else:
        resave_weights(folder, lambda state: state.update({name: torch.zeros(shape)}))
    with pytest.raises(CheckpointError) as e:
        LOADERS[family](folder)
    check_error(e, "model.safetensors", name, needle)


def test_unexpected_tensor_is_named(tmp_path):
    folder = saved(hf_model("llama"), tmp_path)
    resave_weights(folder, lambda state: state.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}))
    with pytest.raises(CheckpointError) as e:
        load_llama(folder)
    check_error(e, "unexpected tensor model.layers.0.self_attn.q_proj.bias")


def test_config_with_fewer_layers_than_the_weights(tmp_path):
    folder = saved(hf_model("llama"), tmp_path)
    edit_config(folder, num_hidden_layers=1)
    with pytest.raises(CheckpointError) as e:
        load_llama(folder)
    check_error(e, "unexpected tensor model.layers.1.")


def test_untied_config_without_head(tmp_path):
    folder = saved(hf_model("llama", base=True, tie_word_embeddings=True), tmp_path)
    edit_config(folder, tie_word_embeddings=False)
    with pytest.raises(CheckpointError) as e:
        load_llama(folder)
    check_error(e, "missing tensor lm_head.weight", "tie_word_embeddings=false")


def test_tied_config_with_a_different_head(tmp_path):
    folder = saved(hf_model("llama", tie_word_embeddings=False), tmp_path)
    edit_config(folder, tie_word_embeddings=True)
    with pytest.raises(CheckpointError) as e:
        load_llama(folder)
    check_error(e, "lm_head.weight differs", "tie_word_embeddings=true")


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_mixtral(tmp_path / "nope")
    check_error(e, "nope", "does not exist")
