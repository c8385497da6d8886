"""nanoGPT's field names (n_layer, n_head, n_embd, n_kv_head), attnlab's own until the rename, are
taken by `GPTConfig(...)` from Python as TOML files and `--set` take them: the same config, with a
DeprecationWarning that names today's field (issue 59)."""

import warnings

import pytest

from attnlab.models import GPTConfig
from attnlab.names import OLD_FIELDS
from helpers import run_config


def test_old_names_build_the_config_todays_names_build_and_warn(recwarn):
    old = GPTConfig(n_layer=2, n_head=4, n_embd=32, n_kv_head=2)
    assert old == GPTConfig(n_layers=2, n_heads=4, d_model=32, n_kv_heads=2)
    messages = [str(w.message) for w in recwarn.list if w.category is DeprecationWarning]
    assert messages == [f"GPTConfig({o}=...) is deprecated: the field is {n} now" for o, n in OLD_FIELDS.items()]
    assert all(w.filename == __file__ for w in recwarn.list)  # the warning points at the caller's line


def test_python_and_toml_read_the_old_names_alike(tmp_path, corpus):
    toml = tmp_path / "old.toml"
    toml.write_text(
        f'[model]\nblock_size = 16\nn_layer = 2\nn_head = 2\nn_embd = 32\n[data]\npath = "{corpus.as_posix()}"\n',
        encoding="utf-8",
    )
    from_toml = run_config(toml).model
    with pytest.warns(DeprecationWarning) as caught:
        from_python = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32)
    assert [str(w.message).rsplit(" ", 2)[1] for w in caught] == ["n_layers", "n_heads", "d_model"]
    assert from_python == from_toml
    assert from_python == run_config(toml, "model.n_embd=32").model  # and as --set names it


def test_todays_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPTConfig(n_layers=2, n_heads=2, d_model=32)


def test_both_names_of_one_field_or_an_unknown_name_are_refused():
    with pytest.raises(TypeError, match="n_layer is the old name of n_layers"):
        GPTConfig(n_layer=2, n_layers=3)
    with pytest.raises(TypeError, match="n_layr"):
        GPTConfig(n_layr=2)


def test_the_old_names_values_are_still_checked():
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match=r"d_model \(30\) must be divisible by n_heads \(4\)"),
    ):
        GPTConfig(n_embd=30, n_head=4)
