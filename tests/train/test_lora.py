"""LoRA's layer against peft's (the independent reference), its merge, its parts by name, and its
config's validation."""

import pytest
import torch
from torch import nn

from attnlab.config import build
from attnlab.errors import ConfigError
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.lora import LoRALinear, add_lora, lora_layers, merge_lora
from attnlab.train.config import LoRAConfig, TrainConfig
from attnlab.train.lora import apply_lora

peft = pytest.importorskip("peft")


def randomise_adapters(model: nn.Module, seed: int = 0) -> None:
    """B starts at zero, which would hide a wrong B path: give every adapter random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if ".lora_" in n or n.startswith("lora_")):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def peft_linear(base: nn.Linear, r: int, alpha: float) -> nn.Module:
    """peft's LoRA layer on `base`, dropout off."""
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0)
    return peft.tuners.lora.Linear(base, "default", config, r=r, lora_alpha=alpha)


def test_lora_linear_equals_peft_lora_linear():
    torch.manual_seed(0)
    base = nn.Linear(24, 40)
    ours = LoRALinear(base, rank=4, alpha=8.0)
    randomise_adapters(ours)
    theirs = peft_linear(nn.Linear(24, 40), r=4, alpha=8.0)
    with torch.no_grad():
        theirs.base_layer.load_state_dict(base.state_dict())
        theirs.lora_A["default"].weight.copy_(ours.lora_A["all"])
        theirs.lora_B["default"].weight.copy_(ours.lora_B["all"])
    x = torch.randn(3, 5, 24)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-6)
    assert ours.scaling == theirs.scaling["default"] == 2.0


def test_initialisation_is_peft_s_kaiming_a_and_zero_b():
    layer = LoRALinear(nn.Linear(64, 32), rank=8, alpha=16.0)
    bound = 1 / 64**0.5  # kaiming_uniform(a=√5) on (r, in): U(-1/√in, 1/√in)
    a, b = layer.lora_A["all"], layer.lora_B["all"]
    assert a.shape == (8, 64) and b.shape == (32, 8)
    assert a.abs().max() <= bound and a.abs().max() > bound / 2
    assert torch.count_nonzero(b) == 0


def test_sliced_in_proj_equals_peft_on_separate_q_k_v():
    """Adapters on the query and value rows of a stacked [q; k; v] projection compute what peft's
    adapters on three separate layers (q and v adapted) compute."""
    torch.manual_seed(1)
    c = 16
    stacked = nn.Linear(c, 3 * c)
    ours = LoRALinear(stacked, rank=2, alpha=4.0, slices={"query": (0, c), "value": (2 * c, 3 * c)})
    randomise_adapters(ours)
    x = torch.randn(2, 3, c)
    outs = []
    for i, part in enumerate(("query", "key", "value")):
        linear = nn.Linear(c, c)
        with torch.no_grad():
            linear.weight.copy_(stacked.weight[i * c : (i + 1) * c])
            linear.bias.copy_(stacked.bias[i * c : (i + 1) * c])
        if part == "key":
            outs.append(linear(x))
            continue
        theirs = peft_linear(linear, r=2, alpha=4.0)
        with torch.no_grad():
            theirs.lora_A["default"].weight.copy_(ours.lora_A[part])
            theirs.lora_B["default"].weight.copy_(ours.lora_B[part])
        outs.append(theirs(x))
    torch.testing.assert_close(ours(x), torch.cat(outs, -1), rtol=0, atol=1e-6)


def test_merge_and_unmerge():
    torch.manual_seed(2)
    layer = LoRALinear(nn.Linear(8, 12), rank=2, alpha=2.0, slices={"key": (4, 8)})
    randomise_adapters(layer)
    x = torch.randn(5, 8)
    before, weight = layer(x), layer.weight.detach().clone()
    plain = layer.merged_linear()
    assert type(plain) is nn.Linear
    torch.testing.assert_close(plain(x), before, rtol=0, atol=1e-6)
    layer.merge()
    torch.testing.assert_close(layer(x), before, rtol=0, atol=1e-6)
    assert not torch.equal(layer.weight, weight)
    assert torch.equal(layer.weight[:4], weight[:4])  # rows no adapter covers are untouched
    layer.unmerge()
    torch.testing.assert_close(layer.weight, weight, rtol=0, atol=1e-6)


def tiny_gpt(activation: str = "gelu") -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, block_size=16, n_layers=2, n_heads=2, d_model=16, activation=activation))


@pytest.mark.parametrize(
    ("activation", "targets", "expected"),
    [
        ("gelu", ("query", "value"), {"attn.in_proj": ["query", "value"]}),
        ("gelu", ("output", "ff-out"), {"attn.out_proj": ["output"], "ffn.fc2": ["ff-out"]}),
        ("swiglu", ("gate", "ff-in"), {"ffn.fc1": ["gate", "ff-in"]}),
    ],
)
def test_targets_wrap_the_layers_that_hold_those_parts(activation, targets, expected):
    model = tiny_gpt(activation)
    wrapped = add_lora(model, targets, rank=2, alpha=4.0)
    want = [f"blocks.{i}.{name}" for i in range(2) for name in expected]
    assert sorted(wrapped) == sorted(want)
    for name, layer in lora_layers(model).items():
        assert list(layer.slices) == expected[name.split(".", 2)[2]]


def test_gated_slices_are_gate_then_up():
    model = tiny_gpt("swiglu")
    add_lora(model, ("ff-in",), rank=2, alpha=4.0)
    fc1 = model.blocks[0].ffn.fc1
    f = fc1.out_features // 2
    assert fc1.slices == {"ff-in": (f, 2 * f)}  # fc1 is [gate; up]: ff-in is the up half


def test_a_merged_model_computes_what_the_adapted_one_does_and_is_plain_again():
    model = tiny_gpt()
    add_lora(model, ("query", "key", "value", "output", "ff-in", "ff-out"), rank=2, alpha=4.0)
    randomise_adapters(model)
    idx = torch.randint(0, 50, (2, 10))
    want = model(idx)
    merge_lora(model)
    assert not lora_layers(model)
    torch.testing.assert_close(model(idx), want, rtol=0, atol=1e-5)
    assert set(model.state_dict()) == set(tiny_gpt().state_dict())


def test_apply_lora_freezes_the_base_and_trains_adapters_and_a_new_head():
    torch.manual_seed(0)
    model = Bert(
        BertConfig(vocab_size=60, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, head="sequence", n_labels=3)
    )
    apply_lora(model, LoRAConfig(rank=2, targets=("query", "value")))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        f"blocks.{i}.attn.in_proj.lora_{m}.{p}" for i in range(2) for m in "AB" for p in ("query", "value")
    } | {
        "head.proj.weight",
        "head.proj.bias",
    }


def test_a_target_the_model_lacks_is_a_config_error():
    with pytest.raises(ConfigError, match="'gate' names no part of this GPT"):
        apply_lora(tiny_gpt(), LoRAConfig(targets=("gate",)))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"rank": 0}, "lora.rank must be >= 1"),
        ({"rank": -2}, "lora.rank must be >= 1"),
        ({"targets": []}, "lora.targets must name at least one part"),
        ({"targets": ["qkv"]}, "'qkv' names no part"),
        ({"alpha": 0}, "lora.alpha must be > 0"),
    ],
)
def test_bad_lora_configs_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        build(TrainConfig, {"lora": values}, "train")


def test_lora_config_round_trips_through_toml():
    import tomllib

    from attnlab.config import as_dict, dump_toml

    config = build(TrainConfig, {"lora": {"rank": 4, "targets": ["query", "ff-in"]}}, "train")
    assert config.lora == LoRAConfig(rank=4, targets=("query", "ff-in"))
    text = dump_toml({"train": as_dict(config)})
    assert "[train.lora]" in text
    assert build(TrainConfig, tomllib.loads(text)["train"], "train") == config


@pytest.mark.parametrize(
    ("family", "targets"),
    [
        ("gpt2", ("query", "value", "output", "ff-in", "ff-out")),  # c_attn: q and v rows of one Conv1D
        ("gpt2", ("key",)),
        ("llama", ("query", "key", "value", "output", "gate", "ff-in", "ff-out")),
    ],
)
def test_peft_adapter_of_a_causal_lm_is_what_peft_puts_on_the_base(tmp_path, family, targets):
    """attnlab's adapters on an imported GPT-2 or Llama, written as a peft adapter folder, and peft's
    PeftModel on the transformers model of the same folder: the same logits."""
    import json

    from safetensors.torch import save_file

    from attnlab.models.hf.auto import load_causal_lm
    from attnlab.models.hf.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, peft_adapter
    from hf_folders import causal_lm_folder

    transformers = pytest.importorskip("transformers")
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    causal_lm_folder(base_dir, family)
    model = load_causal_lm(base_dir).model
    add_lora(model, targets, rank=2, alpha=4.0)
    randomise_adapters(model)
    config, tensors = peft_adapter(model.eval(), base=str(base_dir))
    adapter_dir.mkdir()
    (adapter_dir / ADAPTER_CONFIG).write_text(json.dumps(config), encoding="utf-8")
    save_file(tensors, str(adapter_dir / ADAPTER_WEIGHTS))
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    theirs = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
    idx = torch.randint(2, 250, (2, 12))
    with torch.no_grad():
        want, got = model(idx), theirs(input_ids=idx).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    with torch.no_grad():
        base_only = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()(input_ids=idx).logits
    assert (base_only - want).abs().max() > 1e-3  # the adapters change the logits: the check has teeth
