"""Feed-forward network and residual Transformer blocks, each against its formula written out here.

Also the lectures' "why positional encodings?": self-attention without positions is
permutation-equivariant, so the model cannot tell word order; adding positions breaks that.
"""

import math

import pytest
import torch
from torch import nn

from attnlab.nn import FeedForward, TransformerBlock, build_positions, padding_mask

C, H, D_FF = 8, 2, 16


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * gamma + beta, with the biased variance (Ba et al. 2016)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + norm.eps) * norm.weight
    return y if norm.bias is None else y + norm.bias


HAND_ACTIVATIONS = {
    "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "gelu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
}


def feed_forward(x: torch.Tensor, ffn: FeedForward, activation: str) -> torch.Tensor:
    """FFN(x) = act(x W1ᵀ + b1) W2ᵀ + b2 (Vaswani et al. §3.3)."""
    hidden = HAND_ACTIVATIONS[activation](x @ ffn.fc1.weight.T + ffn.fc1.bias)
    return hidden @ ffn.fc2.weight.T + ffn.fc2.bias


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere, LayerNorm gains and biases included, so that no term is trivially 1 or 0."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)
    return module.eval()


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_equals_formula(activation):
    ffn = randomize(FeedForward(C, D_FF, activation=activation))
    torch.manual_seed(1)
    x = torch.randn(2, 5, C)
    torch.testing.assert_close(ffn(x), feed_forward(x, ffn, activation), rtol=1e-5, atol=1e-5)


def test_feed_forward_activations_differ():
    # The three activations must actually be different functions for the test above to mean anything.
    torch.manual_seed(1)
    x = torch.randn(100)
    relu, gelu, gelu_tanh = (HAND_ACTIVATIONS[name](x) for name in ("relu", "gelu", "gelu_tanh"))
    assert not torch.allclose(relu, gelu, atol=1e-3)
    assert not torch.allclose(gelu, gelu_tanh, atol=1e-6)


def test_feed_forward_acts_on_each_position_alone():
    ffn = randomize(FeedForward(C, D_FF))
    torch.manual_seed(1)
    x = torch.randn(1, 5, C)
    out = ffn(x)
    x[0, 3] += 1.0
    changed = (ffn(x) - out).abs().amax(-1)[0]
    assert changed[3] > 0 and torch.all(changed[[0, 1, 2, 4]] == 0)


def test_feed_forward_unknown_activation_raises():
    with pytest.raises(ValueError, match="mish"):
        FeedForward(C, D_FF, activation="mish")


def attention(x: torch.Tensor, block: TransformerBlock, **kwargs) -> torch.Tensor:
    return block.attn(x, **kwargs)[0]


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("causal", [False, True])
def test_pre_norm_block_equals_formula(causal, activation):
    # GPT-2: h = x + Attn(LN1(x)); out = h + FFN(LN2(h)).
    block = randomize(TransformerBlock(C, H, D_FF, norm="pre", activation=activation))
    torch.manual_seed(1)
    x = torch.randn(2, 5, C)
    mask = padding_mask(torch.tensor([5, 3]), 5)
    h = x + attention(layer_norm(x, block.norm1), block, mask=mask, causal=causal)
    expected = h + feed_forward(layer_norm(h, block.norm2), block.ffn, activation)
    out, weights = block(x, mask=mask, causal=causal)
    assert weights is None
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("causal", [False, True])
def test_post_norm_block_equals_formula(causal, activation):
    # The paper (§3.1): h = LN1(x + Attn(x)); out = LN2(h + FFN(h)).
    block = randomize(TransformerBlock(C, H, D_FF, norm="post", activation=activation))
    torch.manual_seed(1)
    x = torch.randn(2, 5, C)
    mask = padding_mask(torch.tensor([5, 3]), 5)
    h = layer_norm(x + attention(x, block, mask=mask, causal=causal), block.norm1)
    expected = layer_norm(h + feed_forward(h, block.ffn, activation), block.norm2)
    out, _ = block(x, mask=mask, causal=causal)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_pre_and_post_norm_blocks_differ():
    pre = randomize(TransformerBlock(C, H, D_FF, norm="pre"))
    post = randomize(TransformerBlock(C, H, D_FF, norm="post"))
    post.load_state_dict(pre.state_dict())
    torch.manual_seed(1)
    x = torch.randn(2, 5, C)
    assert not torch.allclose(pre(x)[0], post(x)[0], atol=1e-3)


def test_block_returns_attention_weights_when_asked():
    block = randomize(TransformerBlock(C, H, D_FF))
    torch.manual_seed(1)
    x = torch.randn(2, 5, C)
    out, weights = block(x, causal=True, need_weights=True)
    assert weights.shape == (2, H, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 5))
    torch.testing.assert_close(out, block(x, causal=True)[0], rtol=0, atol=1e-5)


def test_block_unknown_norm_raises():
    with pytest.raises(ValueError, match="middle"):
        TransformerBlock(C, H, D_FF, norm="middle")


def test_sandwich_block_is_gemma_s_four_norms():
    """norm="sandwich": x + Norm'(Attn(Norm(x))), then x + Norm'(FFN(Norm(x))), written out."""
    torch.manual_seed(0)
    block = TransformerBlock(C, H, D_FF, norm="sandwich").eval()
    with torch.no_grad():
        for norm in (block.norm1, block.post_norm1, block.norm2, block.post_norm2):
            norm.weight.normal_(1.0, 0.3)
        x = torch.randn(2, 5, C)
        h = x + block.post_norm1(block.attn(block.norm1(x))[0])
        want = h + block.post_norm2(block.ffn(block.norm2(h)))
        torch.testing.assert_close(block(x)[0], want)


def test_block_without_layer_norm_bias():
    torch.manual_seed(0)
    block = TransformerBlock(C, H, D_FF, bias=False)
    assert block.norm1.bias is None and block.attn.in_proj.bias is None and block.ffn.fc1.bias is None
    out, _ = block(torch.randn(1, 3, C))
    assert out.shape == (1, 3, C)


# --- Why positional encodings? --------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_self_attention_block_is_permutation_equivariant(norm):
    # Without positions, permuting the input rows permutes the output rows the same way.
    block = randomize(TransformerBlock(C, H, D_FF, norm=norm))
    torch.manual_seed(1)
    x = torch.randn(2, 7, C)
    perm = torch.randperm(7)
    assert not torch.equal(perm, torch.arange(7))
    out, _ = block(x)
    permuted_out, _ = block(x[:, perm])
    torch.testing.assert_close(permuted_out, out[:, perm], rtol=1e-5, atol=1e-5)


def test_causal_block_is_not_permutation_equivariant():
    # The causal mask itself carries order: position i sees only i earlier tokens.
    block = randomize(TransformerBlock(C, H, D_FF))
    torch.manual_seed(1)
    x = torch.randn(1, 7, C)
    perm = torch.arange(6, -1, -1)
    assert not torch.allclose(block(x[:, perm], causal=True)[0], block(x, causal=True)[0][:, perm], atol=1e-3)


class TinyEncoder(nn.Module):
    """Token embedding + positional encoding + two non-causal blocks."""

    def __init__(self, positions: str, vocab_size: int = 20, n_positions: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, C)
        self.positions = build_positions(positions, n_positions, C)
        self.blocks = nn.ModuleList(TransformerBlock(C, H, D_FF) for _ in range(2))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embedding(idx) + self.positions(torch.arange(idx.size(1)))
        for block in self.blocks:
            x, _ = block(x)
        return x


@pytest.mark.parametrize(("positions", "equivariant"), [("none", True), ("learned", False), ("sinusoidal", False)])
def test_positions_break_permutation_equivariance(positions, equivariant):
    torch.manual_seed(0)
    model = TinyEncoder(positions).eval()
    idx = torch.tensor([[3, 1, 4, 15, 9, 2, 6, 5]])
    perm = torch.tensor([7, 2, 5, 0, 3, 6, 1, 4])
    with torch.no_grad():
        out, permuted_out = model(idx), model(idx[:, perm])
    if equivariant:
        torch.testing.assert_close(permuted_out, out[:, perm], rtol=1e-5, atol=1e-5)
    else:
        assert (permuted_out - out[:, perm]).abs().max() > 1e-2
