"""The IDX reader on the real Fashion-MNIST slice, and its errors on broken copies of it."""

import gzip
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from attnlab.data.images import IMAGES_MAGIC, LABELS_MAGIC, image_splits, read_idx, read_split
from attnlab.errors import UserError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "fashion-mnist"
TRAIN_IMAGES, TRAIN_LABELS = FIXTURE / "train-images-idx3-ubyte.gz", FIXTURE / "train-labels-idx1-ubyte.gz"


def raw(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


def test_reads_the_header_and_pixels_as_the_format_says():
    images = read_idx(TRAIN_IMAGES, IMAGES_MAGIC)
    data = raw(TRAIN_IMAGES)
    # The reference: the header's four big-endian integers and the bytes after them, by hand.
    magic, n, rows, cols = (int.from_bytes(data[i : i + 4], "big") for i in range(0, 16, 4))
    assert (magic, n, rows, cols) == (2051, 300, 28, 28)
    assert images.shape == (300, 28, 28) and images.dtype == np.uint8
    assert images[7, 13, 10] == data[16 + 7 * 784 + 13 * 28 + 10]
    labels = read_idx(TRAIN_LABELS, LABELS_MAGIC)
    assert labels.tolist() == list(raw(TRAIN_LABELS)[8:])
    assert labels[:3].tolist() == [9, 0, 0]  # Fashion-MNIST's first training labels: ankle boot, T-shirt, T-shirt


def test_plain_and_gzipped_files_read_the_same(tmp_path):
    plain = tmp_path / "train-images-idx3-ubyte"
    plain.write_bytes(raw(TRAIN_IMAGES))
    assert np.array_equal(read_idx(plain, IMAGES_MAGIC), read_idx(TRAIN_IMAGES, IMAGES_MAGIC))


def test_wrong_magic_names_the_file_and_the_expected_number():
    with pytest.raises(UserError, match=r"train-labels-idx1-ubyte.gz has magic number 2049, expected 2051"):
        read_idx(TRAIN_LABELS, IMAGES_MAGIC)


@pytest.mark.parametrize("keep", [3, 10, 16 + 784 * 5 + 1])
def test_truncated_files_name_the_file_and_the_expected_size(tmp_path, keep):
    path = tmp_path / "cut-idx3-ubyte"
    path.write_bytes(raw(TRAIN_IMAGES)[:keep])
    with pytest.raises(UserError, match=r"cut-idx3-ubyte is truncated") as e:
        read_idx(path, IMAGES_MAGIC)
    assert "\n" not in str(e.value)
    if keep > 16:
        assert "expected 235216 for shape 300 x 28 x 28" in str(e.value)


def test_a_cut_gzip_stream_is_a_user_error(tmp_path):
    path = tmp_path / "cut.gz"
    path.write_bytes(TRAIN_IMAGES.read_bytes()[:5000])
    with pytest.raises(UserError, match=r"cut.gz is a truncated or corrupt gzip file"):
        read_idx(path, IMAGES_MAGIC)


def test_image_and_label_counts_must_agree(tmp_path):
    for p in FIXTURE.glob("*.gz"):
        shutil.copy(p, tmp_path / p.name)
    labels = raw(TRAIN_LABELS)
    short = labels[:4] + struct.pack(">i", 299) + labels[8:-1]  # a consistent file of 299 labels
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(short))
    with pytest.raises(UserError, match=r"holds 300 images but .*train-labels-idx1-ubyte.gz holds 299 labels"):
        read_split(tmp_path, "train")


def test_validation_is_held_out_of_train_and_test_stays_apart():
    splits = image_splits(FIXTURE, ("train", "val", "test"), val_size=50, seed=0)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [250, 50, 100]
    train = {im.tobytes() for im in splits["train"].images}
    assert not train & {im.tobytes() for im in splits["val"].images}
    again = image_splits(FIXTURE, ("val",), val_size=50, seed=0)["val"]
    assert np.array_equal(again.images, splits["val"].images)  # seeded: the same held-out images
    assert len(image_splits(FIXTURE, ("train",), val_size=50, seed=0, train_size=20)["train"]) == 20


def test_missing_folder_and_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_split(tmp_path / "nowhere", "train")
    with pytest.raises(UserError, match="has no train-images-idx3-ubyte.gz"):
        read_split(tmp_path, "train")
