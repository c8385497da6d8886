"""Block parts (issue 28) against their formulas written out, PyTorch's own modules and
`transformers`' Llama and Mixtral modules with the same weights."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.accel.coverage import covers_attention, covers_block
from attnlab.nn import (
    GATED_UNITS,
    BlockParts,
    FeedForward,
    GatedFeedForward,
    MixtureOfExperts,
    MultiHeadAttention,
    ReZero,
    RMSNorm,
    TransformerBlock,
    build_norm,
    collect_aux_loss,
    gated_width,
)

C, H, T = 16, 4, 6


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)
    return module.eval()


# ---- norms ----------------------------------------------------------------------------------


def test_rmsnorm_equals_formula_and_torch():
    norm = randomize(RMSNorm(C, eps=1e-6))
    x = torch.randn(2, T, C) * 3
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    ref = nn.RMSNorm(C, eps=1e-6)
    ref.weight.data.copy_(norm.weight.data)
    torch.testing.assert_close(norm(x), ref(x))


def test_rmsnorm_equals_llama_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = randomize(RMSNorm(C, eps=1e-5))
    ref = LlamaRMSNorm(C, eps=1e-5)
    ref.weight.data.copy_(norm.weight.data)
    x = torch.randn(3, T, C, dtype=torch.bfloat16)
    assert torch.equal(norm(x), ref(x))  # same order of operations, bf16 included


def test_build_norm_names():
    assert isinstance(build_norm("layernorm", C), nn.LayerNorm)
    assert isinstance(build_norm("rezero+layernorm", C), nn.LayerNorm)
    assert isinstance(build_norm("rmsnorm", C), RMSNorm)
    assert isinstance(build_norm("rezero+rmsnorm", C), RMSNorm)
    assert isinstance(build_norm("rezero", C), nn.Identity)
    with pytest.raises(ValueError, match="did you mean 'rmsnorm'"):
        build_norm("rmsnrom", C)


@pytest.mark.parametrize("normalization", ["rezero", "rezero+layernorm", "rezero+rmsnorm"])
@pytest.mark.parametrize("order", ["pre", "post"])
def test_rezero_block_starts_as_identity_and_learns_alpha(normalization, order):
    block = TransformerBlock(C, H, 4 * C, norm=order, parts=BlockParts(normalization=normalization))
    x = torch.randn(2, T, C)
    y, _ = block(x, causal=True)
    if normalization == "rezero" or order == "pre":  # α = 0: the residual branches add nothing
        torch.testing.assert_close(y, x)
    y.pow(2).sum().backward()
    assert block.gate1.alpha.grad is not None and block.gate1.alpha.grad.abs() > 0


def test_rezero_block_equals_formula():
    """x + α₁ Attn(x), then + α₂ FFN(·), with no norm (Bachlechner et al. 2020, Eq. 4)."""
    block = randomize(TransformerBlock(C, H, 4 * C, norm="pre", parts=BlockParts(normalization="rezero")))
    x = torch.randn(2, T, C)
    h = x + block.gate1.alpha * block.attn(x, causal=True)[0]
    expected = h + block.gate2.alpha * block.ffn(h)
    torch.testing.assert_close(block(x, causal=True)[0], expected)
    assert isinstance(block.gate1, ReZero) and not covers_block(block)  # the C++ kernels step aside


# ---- feed-forward ------------------------------------------------------------------------------

HAND = {
    "swish": lambda x: x / (1 + torch.exp(-x)),
    "elu": lambda x: torch.where(x > 0, x, torch.exp(x) - 1),
    "selu": lambda x: 1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * (torch.exp(x) - 1)),
    "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
    "softplus": lambda x: torch.log1p(torch.exp(x)),
}


@pytest.mark.parametrize("activation", sorted(HAND))
def test_dense_activations_equal_formula(activation):
    ffn = randomize(FeedForward(C, 3 * C, activation=activation))
    x = torch.randn(2, T, C)
    hidden = HAND[activation](x @ ffn.fc1.weight.T + ffn.fc1.bias)
    torch.testing.assert_close(ffn(x), hidden @ ffn.fc2.weight.T + ffn.fc2.bias)


GATES = {
    "glu": lambda x: 1 / (1 + torch.exp(-x)),
    "geglu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    # Gemma's: GELU's tanh approximation (Hendrycks & Gimpel 2016, §2) on the gate.
    "geglu_tanh": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "reglu": lambda x: x.clamp(min=0),
    "swiglu": lambda x: x / (1 + torch.exp(-x)),
    "liglu": lambda x: x,
}


@pytest.mark.parametrize("activation", sorted(GATES))
def test_gated_units_equal_shazeer_formula(activation):
    """FFN(x) = (act(x W) ⊙ x V) W2 (Shazeer 2020, Eq. 5–6), W and V as separate matrices."""
    assert set(GATES) == set(GATED_UNITS)
    ffn = randomize(GatedFeedForward(C, 2 * C, activation=activation, bias=False))
    w, v = ffn.fc1.weight.chunk(2)
    x = torch.randn(2, T, C)
    expected = (GATES[activation](x @ w.T) * (x @ v.T)) @ ffn.fc2.weight.T
    torch.testing.assert_close(ffn(x), expected)


def test_swiglu_equals_llama_mlp():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    ref = LlamaMLP(
        LlamaConfig(
            hidden_size=C, intermediate_size=24, hidden_act="silu", num_attention_heads=H, num_key_value_heads=H
        )
    ).eval()
    ffn = GatedFeedForward(C, 24, activation="swiglu", bias=False).eval()
    with torch.no_grad():
        ffn.fc1.weight.copy_(torch.cat([ref.gate_proj.weight, ref.up_proj.weight]))
        ffn.fc2.weight.copy_(ref.down_proj.weight)
    x = torch.randn(2, T, C)
    torch.testing.assert_close(ffn(x), ref(x))


def test_gated_width_keeps_the_dense_parameter_count():
    dense = FeedForward(96, 384, bias=False)
    gated = GatedFeedForward(96, gated_width(384), activation="swiglu", bias=False)
    count = [sum(p.numel() for p in m.parameters()) for m in (dense, gated)]
    assert count[0] == count[1] == 2 * 96 * 384


# ---- mixture of experts -------------------------------------------------------------------------


def moe(experts: int = 4, top_k: int = 2, activation: str = "gelu", **kw) -> MixtureOfExperts:
    return randomize(MixtureOfExperts(C, 2 * C, experts=experts, top_k=top_k, activation=activation, **kw))


def reference_moe(layer: MixtureOfExperts, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: Σ_k gate_k · FFN_{e_k}(x), gates renormalised for k > 1."""
    out = torch.zeros_like(x)
    dense = (GatedFeedForward if layer.activation in GATED_UNITS else FeedForward)(
        C, layer.experts.fc2.size(-1), activation=layer.activation, bias=layer.experts.fc1_bias is not None
    )
    for n, token in enumerate(x):
        p = torch.softmax(layer.router.weight @ token, dim=-1)
        top = p.topk(layer.top_k)
        gates = top.values / top.values.sum() if layer.top_k > 1 else top.values
        for g, e in zip(gates, top.indices, strict=True):
            load_expert(dense, layer, int(e))
            out[n] += g * dense(token)
    return out


def load_expert(dense: nn.Module, layer: MixtureOfExperts, e: int) -> None:
    ex = layer.experts
    with torch.no_grad():
        dense.fc1.weight.copy_(ex.fc1[e])
        dense.fc2.weight.copy_(ex.fc2[e])
        if ex.fc1_bias is not None:
            dense.fc1.bias.copy_(ex.fc1_bias[e, 0])
            dense.fc2.bias.copy_(ex.fc2_bias[e, 0])


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_moe_equals_token_by_token_reference(top_k, activation):
    layer = moe(top_k=top_k, activation=activation)
    x = torch.randn(2, T, C)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), reference_moe(layer, x.view(-1, C)).view_as(x), rtol=1e-5, atol=1e-5)
    assert layer.dropped == 0.0


@pytest.mark.parametrize("activation", ["relu", "geglu"])
def test_one_expert_equals_the_dense_layer(activation):
    layer = moe(experts=1, top_k=1, activation=activation)
    dense = (GatedFeedForward if activation in GATED_UNITS else FeedForward)(C, 2 * C, activation=activation)
    load_expert(dense, layer, 0)
    x = torch.randn(2, T, C)
    torch.testing.assert_close(layer(x), dense(x))


def test_routing_weights_sum_to_one():
    layer = moe(experts=5, top_k=2)
    probs, gates, chosen = layer.route(torch.randn(20, C))
    torch.testing.assert_close(probs.sum(-1), torch.ones(20))
    torch.testing.assert_close(gates.sum(-1), torch.ones(20))
    assert (chosen[:, 0] != chosen[:, 1]).all()
    switch = moe(experts=5, top_k=1)  # Switch: the gate is the router probability itself
    probs, gates, chosen = switch.route(torch.randn(20, C))
    torch.testing.assert_close(gates[:, 0], probs.max(-1).values)


def test_tokens_over_capacity_pass_through_the_residual():
    layer = moe(experts=2, top_k=1, capacity_factor=0.5)  # capacity ceil(0.5·N/2): a quarter of N
    with torch.no_grad():  # send every token to expert 0
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0
    x = torch.randn(1, 8, C).abs()  # positive features: expert 0's logit wins everywhere
    y = layer(x)
    assert layer.capacity(8) == 2
    kept = y.abs().sum(-1)[0] > 0
    assert kept.tolist() == [True, True] + [False] * 6  # the first two in token order
    assert layer.dropped == pytest.approx(6 / 8)
    block = TransformerBlock(C, H, 2 * C, norm="pre", parts=BlockParts(experts=2, top_k=1, capacity_factor=0.5))
    block = randomize(block)
    x = torch.randn(1, 16, C)
    h = x + block.attn(block.norm1(x), causal=True)[0]
    dropped = block.ffn(block.norm2(h)).abs().sum(-1) == 0  # (1, 16): tokens no expert took
    assert 0 < int(dropped.sum()) and block.ffn.dropped == pytest.approx(float(dropped.float().mean()))
    out, _ = block(x, causal=True)
    torch.testing.assert_close(out[dropped], h[dropped])  # the residual stream alone
    assert not torch.allclose(out[~dropped], h[~dropped])


def test_load_balancing_and_z_losses_equal_their_formulas():
    layer = moe(experts=4, top_k=2, aux_weight=0.5, z_weight=0.1).train()
    x = torch.randn(3, T, C)
    layer(x)
    logits = x.view(-1, C) @ layer.router.weight.T
    probs = logits.softmax(-1)
    chosen = probs.topk(2).indices
    f = torch.stack([(chosen == e).float().sum() for e in range(4)]) / chosen.numel()
    balance = 4 * (f * probs.mean(0)).sum()
    z = torch.logsumexp(logits, -1).pow(2).mean()
    aux = collect_aux_loss(layer)
    torch.testing.assert_close(aux, 0.5 * balance + 0.1 * z)
    assert collect_aux_loss(layer) is None  # collected once
    layer.eval()
    layer(x)
    assert collect_aux_loss(layer) is None  # nothing gathered outside training


def test_moe_equals_mixtral_sparse_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(
        hidden_size=C,
        intermediate_size=24,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_attention_heads=H,
        num_key_value_heads=H,
    )
    ref = MixtralSparseMoeBlock(config).eval()
    torch.manual_seed(0)
    for p in ref.parameters():
        p.data.normal_(0, 0.3)
    layer = MixtureOfExperts(C, 24, experts=4, top_k=2, activation="swiglu", bias=False).eval()
    sd = ref.state_dict()
    with torch.no_grad():
        layer.router.weight.copy_(sd["gate.weight"])
        if "experts.gate_up_proj" in sd:  # transformers 5: the experts' weights fused
            gate_up, down = sd["experts.gate_up_proj"], sd["experts.down_proj"]
            layer.experts.fc1.copy_(gate_up if gate_up.shape[1] == 48 else gate_up.mT)
            layer.experts.fc2.copy_(down if down.shape[1] == C else down.mT)
        else:
            for e in range(4):
                layer.experts.fc1[e].copy_(torch.cat([sd[f"experts.{e}.w1.weight"], sd[f"experts.{e}.w3.weight"]]))
                layer.experts.fc2[e].copy_(sd[f"experts.{e}.w2.weight"])
    x = torch.randn(2, T, C)
    out = ref(x)
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(layer(x), out, rtol=1e-5, atol=1e-5)


def test_experts_must_fit():
    with pytest.raises(ValueError, match="expert_top_k must be between 1 and experts"):
        MixtureOfExperts(C, C, experts=2, top_k=3)


# ---- grouped-query attention ------------------------------------------------------------------


@pytest.mark.parametrize("n_kv", [1, 2])
def test_grouped_query_attention_equals_formula(n_kv):
    """Query head h reads key/value head h // (H / Hkv) (Ainslie et al. 2023)."""
    attn = randomize(MultiHeadAttention(C, H, n_kv_heads=n_kv))
    x = torch.randn(2, T, C)
    d = C // H
    w, b = attn.in_proj.weight, attn.in_proj.bias
    q = (x @ w[:C].T + b[:C]).view(2, T, H, d).transpose(1, 2)
    k = (x @ w[C : C + n_kv * d].T + b[C : C + n_kv * d]).view(2, T, n_kv, d).transpose(1, 2)
    v = (x @ w[C + n_kv * d :].T + b[C + n_kv * d :]).view(2, T, n_kv, d).transpose(1, 2)
    group = H // n_kv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, T, C)
    expected = y @ attn.out_proj.weight.T + attn.out_proj.bias
    torch.testing.assert_close(attn(x, causal=True)[0], expected, rtol=1e-5, atol=1e-5)
    assert attn.in_proj.weight.shape == (C + 2 * n_kv * d, C) and not covers_attention(attn)


def test_grouped_query_equals_multi_head_when_every_head_has_its_own():
    a = randomize(MultiHeadAttention(C, H))
    b = MultiHeadAttention(C, H, n_kv_heads=H)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, T, C)
    assert torch.equal(a(x, causal=True)[0], b(x, causal=True)[0]) and covers_attention(b)


def test_grouped_query_rejects_a_count_that_does_not_divide():
    with pytest.raises(ValueError, match="n_kv_heads"):
        MultiHeadAttention(C, H, n_kv_heads=3)


def test_ffn_in_block_through_parts():
    block = TransformerBlock(C, H, 24, activation="swiglu", parts=BlockParts(normalization="rmsnorm", n_kv_heads=2))
    assert isinstance(block.ffn, GatedFeedForward) and isinstance(block.norm1, RMSNorm)
    assert block.attn.n_kv_heads == 2 and not covers_block(block)  # the C++ kernels step aside
    x = torch.randn(2, T, C)
    assert block(x, causal=True)[0].shape == x.shape
    assert F.mse_loss(block(x)[0], x) > 0
