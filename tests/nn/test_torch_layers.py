"""attnlab's post-norm blocks equal PyTorch's own Transformer layers with the same weights."""

import pytest
import torch
from torch import nn

from attnlab.nn import DecoderBlock, TransformerBlock
from attnlab.nn.masks import padding_mask

D, H, FF = 16, 4, 32


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.copy_(theirs.in_proj_weight)
    ours.in_proj.bias.copy_(theirs.in_proj_bias)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    ours.out_proj.bias.copy_(theirs.out_proj.bias)


def _copy_common(ours, theirs) -> None:
    ours.ffn.fc1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.fc2.load_state_dict(theirs.linear2.state_dict())
    ours.norm1.load_state_dict(theirs.norm1.state_dict())
    ours.norm2.load_state_dict(theirs.norm2.state_dict())


def _randomise(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_equals_torch_encoder_layer(norm_first):
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    _randomise(theirs)
    ours = TransformerBlock(D, H, FF, activation="relu", norm="pre" if norm_first else "post").eval()
    with torch.no_grad():
        _copy_attention(ours.attn, theirs.self_attn)
        _copy_common(ours, theirs)
    x = torch.randn(3, 7, D)
    lengths = torch.tensor([7, 4, 2])
    keep = padding_mask(lengths, 7)  # (B, 1, 1, S), True = attend
    expected = theirs(x, src_key_padding_mask=~keep[:, 0, 0, :])
    got, _ = ours(x, mask=keep)
    for b, n in enumerate(lengths.tolist()):  # torch leaves padded query rows unspecified
        torch.testing.assert_close(got[b, :n], expected[b, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_equals_torch_decoder_layer(norm_first):
    torch.manual_seed(1)
    theirs = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    _randomise(theirs)
    ours = DecoderBlock(D, H, FF, activation="relu", norm="pre" if norm_first else "post").eval()
    with torch.no_grad():
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
        _copy_common(ours, theirs)
        ours.norm3.load_state_dict(theirs.norm3.state_dict())
    x, memory = torch.randn(2, 5, D), torch.randn(2, 6, D)
    keep = padding_mask(torch.tensor([6, 3]), 6)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    expected = theirs(x, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=~keep[:, 0, 0, :])
    got, weights = ours(x, ours.cross_attn.project_memory(memory), memory_mask=keep, need_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, H, 5, 6)
    assert torch.all(weights[1, :, :, 3:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 5))
