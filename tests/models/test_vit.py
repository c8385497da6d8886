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


@pytest.mark.parametrize(
    "cls, kw, field",
    [
        (ViTConfig, {"patch_size": 5}, "patch_size"),
        (ViTConfig, {"d_model": 30, "n_heads": 4}, "n_heads"),
        (CNNConfig, {"conv_channels": ()}, "conv_channels"),
        (CNNConfig, {"dropout": 1.0}, "dropout"),
    ],
)
def test_configs_name_the_bad_field(cls, kw, field):
    with pytest.raises(ValueError, match=field):
        cls(**kw)
