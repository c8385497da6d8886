"""attnlab.models.hf: GPT-2 checkpoints saved by transformers load with HF's exact logits.

The reference is transformers itself: a tiny randomly initialised GPT-2 is saved to a temp folder
(nothing is downloaded), loaded back with `load_gpt2`, and both models score the same tokens.
"""

import datetime
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.errors import CheckpointError, UserError
from attnlab.models import GPT, GPTConfig
from attnlab.models.hf import gpt2_config_from_hf, load_gpt2

transformers = pytest.importorskip("transformers")

VOCAB = 101
TINY = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)


def hf_gpt2(head: bool = True, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random HF GPT-2 in eval mode, with every LayerNorm and bias moved off its 1/0 init.

    The q, k, v projections are scaled up so that attention is far from uniform: a q/k/v or head
    mix-up then moves the logits well beyond the tolerance.
    """
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**{**TINY, **overrides})
    model = (transformers.GPT2LMHeadModel if head else transformers.GPT2Model)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            if name.endswith("attn.c_attn.weight"):
                p.mul_(5.0)
    return model


@torch.no_grad()
def hf_logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    if isinstance(model, transformers.GPT2LMHeadModel):
        return model(idx).logits
    return model(idx).last_hidden_state @ model.wte.weight.T  # GPT2Model: score with the tied head


def assert_same_logits(ours: GPT, theirs: torch.nn.Module) -> None:
    idx = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = ours(idx)
    torch.testing.assert_close(got, hf_logits(theirs, idx), atol=1e-4, rtol=1e-4)


def saved(model: torch.nn.Module, folder):
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder


def edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_lm_head_model_safetensors(tmp_path):
    hf = hf_gpt2()
    folder = saved(hf, tmp_path)
    assert any(k.startswith("transformer.") for k in load_file(folder / "model.safetensors"))
    model = load_gpt2(folder)
    assert not model.training
    assert model.lm_head.weight is model.token_embedding.weight
    assert model.config.activation == "gelu_tanh" and model.config.block_size == 64
    assert_same_logits(model, hf)


def test_base_model_without_prefix(tmp_path):
    hf = hf_gpt2(head=False)
    folder = saved(hf, tmp_path)
    assert not any(k.startswith("transformer.") for k in load_file(folder / "model.safetensors"))
    assert_same_logits(load_gpt2(str(folder)), hf)


def test_pytorch_bin_with_legacy_buffers(tmp_path):
    # The layout of older checkpoints (and the Hub's gpt2 .bin): lm_head.weight stored beside wte, and
    # the causal-mask buffers attn.bias / attn.masked_bias. transformers 5 always writes safetensors.
    hf = hf_gpt2()
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()
    for i in range(hf.config.n_layer):
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(64, 64, dtype=torch.bool)).view(1, 1, 64, 64)
        state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    hf.config.save_pretrained(tmp_path)
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = load_gpt2(tmp_path)
    assert model.lm_head.weight is model.token_embedding.weight
    assert_same_logits(model, hf)


def test_untied_head(tmp_path):
    hf = hf_gpt2(tie_word_embeddings=False)
    model = load_gpt2(saved(hf, tmp_path))
    assert not model.config.tie_weights
    assert model.lm_head.weight is not model.token_embedding.weight
    assert_same_logits(model, hf)


def test_sharded_safetensors(tmp_path):
    hf = hf_gpt2()
    hf.config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, shard_keys in shards.items():
        save_file({k: state[k] for k in shard_keys}, tmp_path / name)
    weight_map = {k: name for name, shard_keys in shards.items() for k in shard_keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert_same_logits(load_gpt2(tmp_path), hf)


@pytest.mark.parametrize(
    ("hf_activation", "ours"),
    [("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu"), ("relu", "relu")],
)
def test_activations(tmp_path, hf_activation, ours):
    hf = hf_gpt2(activation_function=hf_activation)
    model = load_gpt2(saved(hf, tmp_path))
    assert model.config.activation == ours
    assert_same_logits(model, hf)


def test_n_inner_multiple_of_n_embd(tmp_path):
    hf = hf_gpt2(n_inner=64, layer_norm_epsilon=1e-3)
    model = load_gpt2(saved(hf, tmp_path))
    assert model.config.ffn_mult == 2 and model.config.layer_norm_eps == 1e-3
    assert_same_logits(model, hf)


def test_dtype(tmp_path):
    model = load_gpt2(saved(hf_gpt2(), tmp_path), dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_config_from_dict():
    config = gpt2_config_from_hf({"n_embd": 64, "n_head": 4, "n_layer": 3, "n_positions": 128, "vocab_size": 7})
    assert config == GPTConfig(
        vocab_size=7, block_size=128, n_layers=3, n_heads=4, d_model=64, dropout=0.1, activation="gelu_tanh"
    )
    defaults = gpt2_config_from_hf({})  # transformers' GPT2Config defaults: the 124M GPT-2
    assert (defaults.vocab_size, defaults.block_size, defaults.n_layers, defaults.d_model) == (50257, 1024, 12, 768)
    assert gpt2_config_from_hf({"resid_pdrop": 0.0, "attn_pdrop": 0.2}, dropout=0.05).dropout == 0.05
    with pytest.raises(CheckpointError, match="dropout"):
        gpt2_config_from_hf({"resid_pdrop": 0.0, "attn_pdrop": 0.2})


def check_error(excinfo: pytest.ExceptionInfo, *needles: str) -> None:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, UserError)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_gpt2(tmp_path / "nope")
    check_error(e, "nope", "does not exist")


def test_missing_config(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "config.json", "not found")


def test_malformed_config(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "config.json", "JSON")


def test_unsupported_activation(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    edit_config(folder, activation_function="swish")
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "config.json", "'swish'", "activation_function")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("scale_attn_by_inverse_layer_idx", True),
        ("reorder_and_upcast_attn", True),
        ("scale_attn_weights", False),
        ("add_cross_attention", True),
    ],
)
def test_unrepresentable_config(tmp_path, key, value):
    folder = saved(hf_gpt2(), tmp_path)
    edit_config(folder, **{key: value})
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "config.json", key)


def test_n_inner_not_multiple(tmp_path):
    # Any width is read exactly (attnlab's ffn_hidden)...
    theirs = hf_gpt2(n_inner=48)
    ours = load_gpt2(saved(theirs, tmp_path / "48"))
    assert ours.config.d_ff == 48
    assert_same_logits(ours, theirs)
    # ...and checked against the weights.
    folder = saved(hf_gpt2(), tmp_path / "128")
    edit_config(folder, n_inner=48)
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "h.0.mlp.c_fc.weight", "(32, 48)")


def test_not_gpt2(tmp_path):
    with pytest.raises(CheckpointError) as e:
        gpt2_config_from_hf({"model_type": "bert"})
    check_error(e, "'bert'")


def test_missing_weights(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "model.safetensors", "no weights")


def test_corrupt_weights(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "model.safetensors", "cannot be read")


def resave_weights(folder, change) -> None:
    path = folder / "model.safetensors"
    state = load_file(path)
    change(state)
    save_file(state, path)


def test_removed_tensor(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    resave_weights(folder, lambda state: state.pop("transformer.h.1.mlp.c_fc.bias"))
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "model.safetensors", "missing tensor h.1.mlp.c_fc.bias")


def test_unexpected_tensor(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    resave_weights(folder, lambda state: state.update({"score.weight": torch.zeros(3, 32)}))
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "model.safetensors", "unexpected tensor score.weight")


def test_wrong_shape(tmp_path):
    folder = saved(hf_gpt2(), tmp_path)
    edit_config(folder, n_positions=32)
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "model.safetensors", "wpe.weight", "(64, 32)", "(32, 32)")


def test_untied_config_without_head(tmp_path):
    folder = saved(hf_gpt2(head=False), tmp_path)
    edit_config(folder, tie_word_embeddings=False)
    with pytest.raises(CheckpointError) as e:
        load_gpt2(folder)
    check_error(e, "lm_head.weight", "tie_word_embeddings")


@pytest.mark.parametrize(
    ("content", "needle"),
    [({"wte.weight": 1}, "not a state dict of tensors"), ({"when": datetime.date(2019, 2, 14)}, "weights_only=True")],
)
def test_unsafe_or_odd_pytorch_bin(tmp_path, content, needle):
    # weights_only=True: a pickle that would construct arbitrary objects is refused, never run.
    hf_gpt2().config.save_pretrained(tmp_path)
    torch.save(content, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as e:
        load_gpt2(tmp_path)
    check_error(e, "pytorch_model.bin", needle)
