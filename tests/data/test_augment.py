"""Training-image variation for the classifiers: mirrored and shifted copies, checked pixel by pixel
against the definition written out with numpy, one image at a time."""

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data.images import IMAGES_MAGIC, flip_and_shift, read_idx

TRAIN_IMAGES = Path(__file__).parent.parent / "fixtures" / "fashion-mnist" / "train-images-idx3-ubyte.gz"


def reference(image: np.ndarray, mirrored: bool, dy: int, dx: int) -> np.ndarray:
    """The image (mirrored if asked) moved down by dy and right by dx (negative: up/left), zeros where nothing lands."""
    if mirrored:
        image = image[:, ::-1]
    h, w = image.shape
    out = np.zeros_like(image)
    for r in range(h):
        for c in range(w):
            if 0 <= r + dy < h and 0 <= c + dx < w:
                out[r + dy, c + dx] = image[r, c]
    return out


def test_each_image_is_a_mirrored_and_shifted_copy_of_its_original():
    images = torch.from_numpy(read_idx(TRAIN_IMAGES, IMAGES_MAGIC)[:64].copy())
    out = flip_and_shift(images, True, 2, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.uint8
    seen = set()
    for original, varied in zip(images.numpy(), out.numpy(), strict=True):
        matches = [
            (m, dy, dx)
            for m in (False, True)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if np.array_equal(reference(original, m, dy, dx), varied)
        ]
        assert matches, "an output image is no mirrored/shifted copy of its input"
        seen.update(matches)
    # Over 64 images both orientations and many of the 25 shifts occur.
    assert {m for m, _, _ in seen} == {False, True}
    assert len({(dy, dx) for _, dy, dx in seen}) >= 12


def test_no_flip_and_no_shift_is_the_identity_and_flip_alone_never_moves():
    images = torch.randint(0, 256, (16, 28, 28), dtype=torch.uint8)
    assert torch.equal(flip_and_shift(images, False, 0, torch.Generator().manual_seed(1)), images)
    flipped = flip_and_shift(images, True, 0, torch.Generator().manual_seed(1))
    for original, varied in zip(images, flipped, strict=True):
        assert torch.equal(varied, original) or torch.equal(varied, original.flip(-1))


def test_the_same_generator_state_gives_the_same_batch():
    images = torch.randint(0, 256, (8, 28, 28), dtype=torch.uint8)
    a = flip_and_shift(images, True, 3, torch.Generator().manual_seed(5))
    b = flip_and_shift(images, True, 3, torch.Generator().manual_seed(5))
    c = flip_and_shift(images, True, 3, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_a_shift_past_the_limit_is_refused_by_the_config():
    from attnlab.tasks.image_classification import ClassifiedImagesDataConfig

    with pytest.raises(ValueError, match="max_shift"):
        ClassifiedImagesDataConfig(max_shift=9)
