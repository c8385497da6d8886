"""weights_sha256: the base a fine-tuning run records and checks on resume."""

import pytest

from attnlab.checkpoints import file_sha256, weights_sha256


def test_a_file_hashes_as_itself_and_a_folder_changes_with_any_weight_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "train_state.pt").write_bytes(b"optimizer")
    assert weights_sha256(tmp_path / "model.safetensors") == file_sha256(tmp_path / "model.safetensors")
    before = weights_sha256(tmp_path)
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "train_state.pt").write_bytes(b"other")
    assert weights_sha256(tmp_path) == before  # not weights
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    changed = weights_sha256(tmp_path)
    assert changed != before
    (tmp_path / "extra.bin").write_bytes(b"")
    assert weights_sha256(tmp_path) not in (before, changed)


def test_a_folder_without_weights_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no weight files"):
        weights_sha256(tmp_path)
