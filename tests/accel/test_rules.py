"""attnlab.accel.rules: the hardware rules set on a model where it is prepared for training, and
none left in the reference code (nn/, models/)."""

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab.accel.rules import FORMULA_MAX_KEYS, formula_trains_faster, prepare_for_training
from attnlab.models import GPT, GPTConfig
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import MultiHeadAttention

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"

DEVICE_CHECKS = re.compile(r"device\.type\s*[=!]=|[=!]=\s*[\"'](cpu|cuda|mps)[\"']|is_available\(\)|\.is_(cuda|cpu)\b")
"""A decision on the device: its type compared, a backend asked. (Moving tensors to the CPU to
write a file is no decision.)"""

ALLOWED: dict[str, int] = {}
"""Device checks the reference code may hold, by file, and why. Keep this empty: each is a debt."""


def test_the_formula_is_only_for_bf16_training_of_short_sequences_on_the_cpu():
    q = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    assert formula_trains_faster(q, FORMULA_MAX_KEYS)
    assert not formula_trains_faster(q, FORMULA_MAX_KEYS + 1)  # longer: the fused kernel's memory
    assert not formula_trains_faster(q.float(), 16)  # fp32: the fused kernel is faster
    with torch.no_grad():
        assert not formula_trains_faster(q, 16)  # forward alone: the fused kernel is faster


@pytest.mark.parametrize(
    "model",
    [
        GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16)),
        Seq2SeqTransformer(Seq2SeqConfig(vocab_size=11, d_model=16, n_heads=2)),
        Bert(BertConfig(vocab_size=11, max_len=8, d_model=16, n_heads=2, n_layers=2)),
    ],
)
def test_preparing_sets_the_rule_on_every_attention_layer(model):
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert layers and all(m.prefer_formula is None for m in layers)  # the reference asks no hardware
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert prepare_for_training(model) is model
    assert all(m.prefer_formula is formula_trains_faster for m in layers)
    assert all(m.drop_full_mask for m in model.modules() if isinstance(m, Bert))  # on the CPU
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


@pytest.mark.parametrize("keys, formula", [(FORMULA_MAX_KEYS, True), (FORMULA_MAX_KEYS + 1, False)])
def test_a_prepared_layer_trains_bf16_on_the_cpu_by_the_rule(monkeypatch, keys, formula):
    mha = prepare_for_training(MultiHeadAttention(16, 2).to(torch.bfloat16).train())
    ran = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: ran.append(1) or fused(*a, **k))
    x = torch.randn(1, keys, 16, dtype=torch.bfloat16, requires_grad=True)
    mha(x, causal=True)[0].float().sum().backward()
    assert bool(ran) != formula


def test_the_trainer_prepares_every_model_it_trains(tiny_toml, tmp_path, monkeypatch):
    """Kernels off: the attention layers still ask accel's rule at every training step."""
    from attnlab.accel import rules
    from attnlab.train import train
    from helpers import run_config

    asked = []
    monkeypatch.setattr(
        rules, "formula_trains_faster", lambda q, t_k: asked.append(t_k) or formula_trains_faster(q, t_k)
    )
    config = run_config(tiny_toml, "train.dtype=bfloat16", "train.max_iters=2", "train.fused_kernels=false")
    train(config, tmp_path / "bf16", progress=False)
    assert asked


def bert(**fields) -> Bert:
    torch.manual_seed(0)
    return Bert(BertConfig(vocab_size=30, max_len=16, d_model=16, n_heads=2, n_layers=2, head="mlm", **fields))


@pytest.mark.parametrize("fields, kernel", [({}, True), ({"positions": "relative"}, False)])
def test_a_prepared_bert_drops_a_mask_that_hides_nothing_and_computes_the_same(monkeypatch, fields, kernel):
    """Unpadded ids: the prepared model attends with no mask, the reference with an all-true one,
    and their outputs and gradients agree bit for bit (the rule is a matter of speed alone), on
    PyTorch's fused kernel and on the formula."""
    ids = torch.randint(5, 30, (3, 12), generator=torch.Generator().manual_seed(1))
    masks = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **k: masks.append(k["attn_mask"]) or real(*a, **k)
    )
    results = []
    for model in (bert(**fields), prepare_for_training(bert(**fields))):
        model.train()
        torch.manual_seed(2)  # the same dropout
        out = model(ids)
        out.square().sum().backward()
        results.append([out.detach(), *(p.grad for p in model.parameters() if p.grad is not None)])
    assert len(results[1]) > 1 and all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    half = len(masks) // 2  # relative positions take the formula: no fused kernel to watch
    assert bool(half) == kernel
    assert all(m is not None for m in masks[:half]) and all(m is None for m in masks[half:])


def test_the_reference_code_asks_nothing_of_the_hardware():
    found = {}
    for folder in ("nn", "models"):
        for path in (SRC / folder).rglob("*.py"):
            hits = [line for line in path.read_text().splitlines() if DEVICE_CHECKS.search(line.split("#")[0])]
            if hits:
                found[path.relative_to(SRC).as_posix()] = len(hits)
    assert found == ALLOWED
