"""ViT and the CNN baseline: shapes, the patch embedding against patches cut by hand, [CLS]
attention, and that ViT's blocks are attnlab.nn's own."""

import pytest
import torch

from attnlab.models.vit import CNN, CNNConfig, ViT, ViTConfig, normalize_image
from attnlab.nn import TransformerBlock


def test_vit_and_cnn_shapes():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (3, 28, 28))
    vit = ViT(ViTConfig(patch_size=7, d_model=32, n_heads=4, n_layers=2, d_ff=64))
    assert vit(x).shape == (3, 10)
    features, _ = vit.forward_features(x)
    assert features.shape == (3, 17, 32)  # [CLS] + 4 x 4 patches
    assert all(isinstance(b, TransformerBlock) for b in vit.blocks)
    assert CNN(CNNConfig())(x).shape == (3, 10)


def test_patch_embedding_is_a_linear_map_of_each_flattened_patch():
    torch.manual_seed(0)
    vit = ViT(ViTConfig(patch_size=4, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    pixels = normalize_image(torch.randint(0, 256, (2, 28, 28)))
    got = vit.patch_embed(pixels)  # (B, 49, C)
    # Reference: cut the 4 x 4 patches in raster order by hand, flatten, multiply by E (Eq. 1).
    patches = torch.stack(
        [pixels[:, 0, r : r + 4, c : c + 4].reshape(2, 16) for r in range(0, 28, 4) for c in range(0, 28, 4)], dim=1
    )
    weight = vit.patch_embed.proj.weight.reshape(16, 16)
    assert torch.allclose(got, patches @ weight.T + vit.patch_embed.proj.bias, atol=1e-5)


def test_cls_attention_is_the_first_row_of_each_blocks_weights():
    torch.manual_seed(0)
    vit = ViT(ViTConfig(patch_size=7, d_model=32, n_heads=4, n_layers=2, d_ff=64)).eval()
    x = torch.randint(0, 256, (2, 28, 28))
    att = vit.cls_attention(x)
    assert att.shape == (2, 2, 4, 4, 4)  # (B, layers, heads, grid, grid)
    _, weights = vit.forward_features(x, need_weights=True)
    self_weight = weights[1][:, :, 0, 0]  # [CLS] to itself
    assert torch.allclose(att[:, 1].sum((-1, -2)) + self_weight, torch.ones(2, 4), atol=1e-5)


@pytest.mark.parametrize("side, grid", [(28, 4), (7, 1), (9, 2)])
def test_hybrid_tokens_are_the_cells_of_the_stems_feature_map(side, grid):
    torch.manual_seed(0)
    config = ViTConfig(image_size=side, embed="conv", stem_channels=(4, 8, 8), d_model=16, n_heads=2, n_layers=1)
    vit = ViT(config).eval()
    assert config.grid == grid
    features, _ = vit.forward_features(torch.randint(0, 256, (2, side, side)))
    assert features.shape == (2, grid * grid + 1, 16)
    assert vit.cls_attention(torch.randint(0, 256, (1, side, side))).shape == (1, 1, 2, grid, grid)


def test_each_hybrid_token_sees_only_its_stems_receptive_field():
    # Three stride-2 3 x 3 convolutions (padding 1): cell i covers input rows 8i-7 .. 8i+7 (cell i of
    # a layer covers 2i-1 .. 2i+1 of its input, composed three times), and nothing else.
    torch.manual_seed(0)
    vit = ViT(ViTConfig(embed="conv", stem_channels=(4, 8, 8), d_model=16, n_heads=2, n_layers=1)).eval()
    for norm in vit.patch_embed.modules():
        if isinstance(norm, torch.nn.BatchNorm2d):  # every ReLU on: no gradient lost inside the field
            torch.nn.init.constant_(norm.bias, 100.0)
    pixels = torch.randn(1, 1, 28, 28, requires_grad=True)
    tokens = vit.patch_embed(pixels)  # (1, 16, C)
    for cell in (0, 5, 15):
        (grad,) = torch.autograd.grad(tokens[0, cell].square().sum(), pixels, retain_graph=True)
        r, c = divmod(cell, 4)
        expected = torch.zeros(28, 28, dtype=torch.bool)
        expected[max(8 * r - 7, 0) : 8 * r + 8, max(8 * c - 7, 0) : 8 * c + 8] = True
        assert torch.equal(grad[0, 0] != 0, expected)


@pytest.mark.parametrize(
    "cls, kw, field",
    [
        (ViTConfig, {"patch_size": 5}, "patch_size"),
        (ViTConfig, {"embed": "pixels"}, "embed"),
        (ViTConfig, {"embed": "conv", "stem_channels": ()}, "stem_channels"),
        (ViTConfig, {"d_model": 30, "n_heads": 4}, "n_heads"),
        (CNNConfig, {"conv_channels": ()}, "conv_channels"),
        (CNNConfig, {"dropout": 1.0}, "dropout"),
    ],
)
def test_configs_name_the_bad_field(cls, kw, field):
    with pytest.raises(ValueError, match=field):
        cls(**kw)
