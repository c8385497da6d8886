"""PixelCNN and Gated PixelCNN, tested by gradient: the output at pixel i depends on no pixel >= i
in raster order; the plain PixelCNN has its blind spot exactly where the paper draws it (Gated
PixelCNN paper, Figure 1), the gated one none."""

import pytest
import torch

from attnlab.models.gated_pixelcnn import GatedPixelCNN, GatedPixelCNNConfig
from attnlab.models.pixelcnn import PixelCNN, PixelCNNConfig
from attnlab.nn.conv import raster_mask

SIDE = 8


def dependencies(model, r: int, c: int) -> set[tuple[int, int]]:
    """The input pixels whose gradient reaches the logits of output pixel (r, c)."""
    torch.manual_seed(1)
    x = torch.rand(1, 1, SIDE, SIDE, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([1]) if model.config.n_classes else None
    model.logits(x, labels)[0, :, r, c].sum().backward()
    return {tuple(p) for p in (x.grad[0, 0] != 0).nonzero().tolist()}


def before(r: int, c: int) -> set[tuple[int, int]]:
    return {(i, j) for i in range(SIDE) for j in range(SIDE) if (i, j) < (r, c)}


def pixelcnn(**kw) -> PixelCNN:
    torch.manual_seed(0)
    return PixelCNN(PixelCNNConfig(hidden=4, head_channels=8, **kw)).double()


def gated(**kw) -> GatedPixelCNN:
    torch.manual_seed(0)
    return GatedPixelCNN(GatedPixelCNNConfig(hidden=4, head_channels=8, **kw)).double()


MODELS = {
    "pixelcnn": lambda: pixelcnn(n_layers=3),
    "pixelcnn-conditional": lambda: pixelcnn(n_layers=2, n_classes=3),
    "gated": lambda: gated(n_layers=3, kernel=3, n_classes=0),
    "gated-conditional": lambda: gated(n_layers=4, kernel=5, n_classes=10),
}


@pytest.mark.parametrize("name", MODELS)
def test_no_output_pixel_sees_itself_or_a_later_pixel(name):
    model = MODELS[name]()
    for r in range(SIDE):
        for c in range(SIDE):
            assert dependencies(model, r, c) <= before(r, c), (r, c)


def reachable(masks: list[torch.Tensor]) -> set[tuple[int, int]]:
    """Offsets (dy, dx) the stack of masked convolutions reaches: the Minkowski sum of each mask's taps."""
    offsets = {(0, 0)}
    for mask in masks:
        c = mask.shape[0] // 2
        taps = [(i - c, j - c) for i, j in mask.nonzero().tolist()]
        offsets = {(a + dy, b + dx) for a, b in offsets for dy, dx in taps}
    return offsets


def test_the_plain_pixelcnn_has_the_papers_blind_spot():
    model = pixelcnn(first_kernel=3, kernel=3, n_layers=6)
    masks = [raster_mask(3, "A")] + [raster_mask(3, "B")] * 6
    r, c = 5, 3
    got = dependencies(model, r, c)
    expected = {(r + dy, c + dx) for dy, dx in reachable(masks)} & before(r, c)
    assert got == {p for p in expected if 0 <= p[1] < SIDE}
    # The paper's picture: d rows up, the field reaches only d columns right of the pixel; the
    # pixels above and right of that diagonal are never seen, though they come earlier.
    blind = before(r, c) - got
    assert blind == {(i, j) for i in range(r) for j in range(SIDE) if j - c > r - i}
    assert (r - 1, c + 2) in blind and (r - 1, c + 1) not in blind


def test_the_gated_pixelcnn_sees_every_earlier_pixel():
    model = gated(n_layers=5, kernel=5, n_classes=0)  # reach: 2 rows up and 2 columns each way per layer
    for r, c in [(5, 3), (7, 7), (1, 7), (3, 0), (7, 0)]:
        assert dependencies(model, r, c) == before(r, c), (r, c)


def test_the_plain_pixelcnn_misses_earlier_pixels_however_deep():
    model = pixelcnn(first_kernel=3, n_layers=12)
    assert dependencies(model, 7, 0) != before(7, 0)  # (6, 2), up one and right two, is blind


def test_output_shapes_and_class_conditioning():
    x = torch.randint(0, 256, (2, 28, 28))
    assert pixelcnn(n_layers=1).float()(x).shape == (2, 256, 28, 28)
    model = gated(n_layers=2, n_classes=10).float()
    a, b = model(x, torch.tensor([0, 0])), model(x, torch.tensor([0, 5]))
    assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])
    with pytest.raises(ValueError, match="class-conditional"):
        model(x)


@pytest.mark.parametrize(
    "cls, kw, field",
    [
        (PixelCNNConfig, {"kernel": 4}, "kernel"),
        (PixelCNNConfig, {"hidden": 0}, "hidden"),
        (GatedPixelCNNConfig, {"kernel": 1}, "kernel"),
        (GatedPixelCNNConfig, {"n_classes": -1}, "n_classes"),
    ],
)
def test_configs_name_the_bad_field(cls, kw, field):
    with pytest.raises(ValueError, match=field):
        cls(**kw)
