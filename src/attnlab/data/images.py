"""Images in the IDX format (MNIST, Fashion-MNIST): a reader, and the train/val/test splits.

IDX (LeCun et al., http://yann.lecun.com/exdb/mnist/): a big-endian header, then the raw values.
The header is two zero bytes, a type byte (0x08: unsigned bytes, the only type these data sets
use), the number of dimensions, then each dimension as a 4-byte integer. So an image file's magic
number is 2051 (0x00000803: three dimensions, N × rows × cols) and a label file's 2049
(0x00000801: one dimension, N). Files may be gzipped (as Fashion-MNIST ships them) or plain.

Shape legend: N images, H rows, W columns.
"""

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.errors import UserError

IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
"""Fashion-MNIST's label names, in label order (Xiao et al. 2017, Table 1)."""


def _read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it starts with gzip's magic bytes."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as e:
        raise UserError(f"{path} is a truncated or corrupt gzip file ({e}); download it again") from None


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """An IDX file (gzip or plain) as a uint8 array of the shape its header gives.

    magic: the number the file must start with (IMAGES_MAGIC -> `(N, H, W)`, LABELS_MAGIC -> `(N,)`).
    A wrong magic number or a file shorter than its header promises is a `UserError` that names
    the file and what was expected. Example: a label file -> array([9, 0, 0, 3, ...], dtype=uint8).
    """
    path = Path(path)
    data = _read_bytes(path)
    what = {IMAGES_MAGIC: "an image file", LABELS_MAGIC: "a label file"}.get(magic, "an IDX file")
    if len(data) < 4:
        raise UserError(f"{path} is truncated: {len(data)} bytes, not even the 4-byte magic number of {what}")
    (found,) = struct.unpack(">i", data[:4])
    if found != magic:
        raise UserError(
            f"{path} has magic number {found}, expected {magic} ({what} of unsigned bytes); is it the right file?"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UserError(f"{path} is truncated: {len(data)} bytes, shorter than its {header}-byte header")
    shape = struct.unpack(f">{ndim}i", data[4:header])
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "longer than its header says"
        raise UserError(
            f"{path} is {problem}: {len(data)} bytes, expected {expected} for shape {' x '.join(map(str, shape))}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape).copy()  # writable


def _find(folder: Path, stem: str) -> Path:
    """folder/stem.gz or folder/stem, whichever exists."""
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise UserError(f"{folder} has no {stem}.gz (or {stem}); pass the Fashion-MNIST folder as --data-dir")


@dataclass(frozen=True)
class LabelledImages:
    """images `(N, H, W)` uint8 (0 = black ... 255 = white) and labels `(N,)` int64."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, index: np.ndarray) -> "LabelledImages":
        return LabelledImages(self.images[index], self.labels[index])


def read_split(folder: str | Path, split: str) -> LabelledImages:
    """The "train" or "test" images of an IDX data set folder, with their labels; a `UserError`
    when the image and label files disagree on the count."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UserError(f"--data-dir {folder} does not exist; give the folder with the IDX files")
    image_path, label_path = (_find(folder, stem) for stem in SPLIT_FILES[split])
    images = read_idx(image_path, IMAGES_MAGIC)
    labels = read_idx(label_path, LABELS_MAGIC)
    if len(images) != len(labels):
        raise UserError(
            f"{image_path} holds {len(images)} images but {label_path} holds {len(labels)} labels; "
            "expected one label per image (are they from the same split?)"
        )
    return LabelledImages(images, labels.astype(np.int64))


def image_splits(
    folder: str | Path, splits: tuple[str, ...] | list[str], val_size: int, seed: int, train_size: int = 0
) -> dict[str, LabelledImages]:
    """The asked-for splits of "train", "val", "test": val is `val_size` training images held out
    by a seeded random choice (so test stays unseen until it is reported); train the rest, or its
    first `train_size` when that is > 0 (short runs and tests)."""
    out: dict[str, LabelledImages] = {}
    if {"train", "val"} & set(splits):
        full = read_split(folder, "train")
        if val_size >= len(full):
            raise UserError(f"{folder} has {len(full)} training images, too few to hold out data.val_size = {val_size}")
        order = np.random.default_rng(seed).permutation(len(full))
        held, kept = np.sort(order[:val_size]), np.sort(order[val_size:])
        if train_size > 0:
            kept = kept[:train_size]
        out["train"], out["val"] = full.take(kept), full.take(held)
    if "test" in splits:
        out["test"] = read_split(folder, "test")
    return {s: out[s] for s in splits}


def flip_and_shift(images: torch.Tensor, flip: bool, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Each image mirrored left-right with probability 1/2 (if `flip`) and moved by up to `max_shift` pixels
    in each direction (the uncovered border filled with 0, the background). images `(B, H, W)`
    -> `(B, H, W)`, the same dtype.

    A classifier that sees each training image only a few times at this budget learns less from
    pixel positions it should ignore: the garment is the same garment a pixel to the left.
    """
    b, h, w = images.shape
    if flip:
        mirrored = torch.rand(b, generator=generator) < 0.5
        images = torch.where(mirrored[:, None, None], images.flip(-1), images)
    if max_shift == 0:
        return images
    s = max_shift
    padded = F.pad(images, (s, s, s, s))  # (B, H + 2s, W + 2s)
    dy = torch.randint(0, 2 * s + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * s + 1, (b,), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + torch.arange(w))[:, None, :]  # (B, 1, W)
    return padded[torch.arange(b)[:, None, None], rows, cols]
