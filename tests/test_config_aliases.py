"""nanoGPT's field names (n_layer, n_head, n_embd, n_kv_head), attnlab's own until the rename, are
taken by `GPTConfig(...)` from Python as TOML files and `--set` take them: the same config, with a
DeprecationWarning that names today's field (issue 59); so are the block parts' n_kv_head (and the
table's other old names of their fields) by the other configs the rename changed, `BertConfig`
and `Seq2SeqConfig`."""

import dataclasses
import warnings

import pytest

from attnlab.models import GPTConfig
from attnlab.models.bert import BertConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.names import OLD_FIELDS, with_model_fields
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


# -- the other configs renamed with the GPT's: BERT's and the encoder-decoder's block parts (n_kv_head) --
# Each takes the table's old names of the fields it has, as TOML and --set read them for any model.
TODAYS = {"n_layers": 2, "n_heads": 4, "d_model": 32, "n_kv_heads": 2}


@pytest.mark.parametrize("cls", [BertConfig, Seq2SeqConfig])
def test_the_renamed_configs_take_their_old_names_and_warn(cls, recwarn):
    fields = {f.name for f in dataclasses.fields(cls)}
    renamed = {old: new for old, new in OLD_FIELDS.items() if new in fields}
    assert "n_kv_head" in renamed  # the block parts' field, renamed for this config too
    old = cls(**{o: TODAYS[n] for o, n in renamed.items()})
    assert old == cls(**{n: TODAYS[n] for n in renamed.values()})
    messages = [str(w.message) for w in recwarn.list if w.category is DeprecationWarning]
    assert messages == [f"{cls.__name__}({o}=...) is deprecated: the field is {n} now" for o, n in renamed.items()]
    assert all(w.filename == __file__ for w in recwarn.list)
    # As TOML reads them (`attnlab.names.with_model_fields`): the same config.
    assert cls(**with_model_fields({"model": {o: TODAYS[n] for o, n in renamed.items()}})["model"]) == old


@pytest.mark.parametrize("cls", [BertConfig, Seq2SeqConfig])
def test_the_renamed_configs_refuse_both_names_and_check_the_values(cls):
    with pytest.raises(TypeError, match="n_kv_head is the old name of n_kv_heads"):
        cls(n_kv_head=2, n_kv_heads=2)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide"):
        cls(n_kv_head=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls(n_heads=4, d_model=32, n_kv_heads=2)  # today's names: no warning
