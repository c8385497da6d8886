"""Configuration plumbing: `--set` overrides, deep merge, typed dataclass building, presets and files."""

import dataclasses
import tomllib
from pathlib import Path

import pytest

from attnlab.config import build, load_preset_or_file, merge, parse_overrides, presets
from attnlab.errors import ConfigError
from attnlab.models import GPTConfig
from attnlab.tasks import TASKS
from attnlab.train import RunConfig, TrainConfig, resolve
from attnlab.train.config import apply_overrides

# ------------------------------------------------------------------ parse_overrides


@pytest.mark.parametrize(
    "item,expected",
    [
        ("train.max_iters=10", 10),
        ("train.max_iters=-3", -3),
        ("train.learning_rate=1e-3", 1e-3),
        ("train.learning_rate=0.5", 0.5),
        ("train.decay_lr=true", True),
        ("train.decay_lr=false", False),
        ('train.device="cuda"', "cuda"),
        ("train.device=cuda", "cuda"),
        ("data.path=input.txt", "input.txt"),
        ("data.path=~/my corpus/a b.txt", "~/my corpus/a b.txt"),
        ("data.path=", ""),
        ("train.betas=[0.9, 0.95]", [0.9, 0.95]),
        ("train.names=['a', 'b']", ["a", "b"]),
        ("train.max_iters = 7", 7),
    ],
)
def test_parse_overrides_types(item, expected):
    out = parse_overrides([item])
    section, key = item.partition("=")[0].strip().split(".")
    assert out == {section: {key: expected}}
    value = out[section][key]
    assert type(value) is type(expected)


def test_parse_overrides_value_may_contain_equals_sign():
    assert parse_overrides(["data.path=a=b.txt"]) == {"data": {"path": "a=b.txt"}}


def test_parse_overrides_nesting_and_several_items():
    out = parse_overrides(["train.max_iters=10", "data.path=x.txt", "a.b.c=1", "a.b.d=2", "a.e=3", "top=4"])
    assert out == {
        "train": {"max_iters": 10},
        "data": {"path": "x.txt"},
        "a": {"b": {"c": 1, "d": 2}, "e": 3},
        "top": 4,
    }


def test_parse_overrides_later_item_wins():
    assert parse_overrides(["train.seed=1", "train.seed=2"]) == {"train": {"seed": 2}}


@pytest.mark.parametrize("item", ["train.max_iters", "", "novalue", "=5", " =5"])
def test_parse_overrides_malformed_is_a_config_error(item):
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides([item])


def test_parse_overrides_value_then_section_is_a_config_error():
    with pytest.raises(ConfigError, match="not a section"):
        parse_overrides(["train=1", "train.max_iters=2"])


# ------------------------------------------------------------------ merge


def test_merge_deep_merges_and_does_not_mutate():
    base = {"task": "lm", "model": {"n_layers": 4, "n_heads": 4}, "train": {"max_iters": 100, "batch_size": 8}}
    overrides = {"model": {"n_layers": 2}, "train": {"seed": 1}, "data": {"path": "x"}}
    base_copy = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    out = merge(base, overrides)
    assert out == {
        "task": "lm",
        "model": {"n_layers": 2, "n_heads": 4},
        "train": {"max_iters": 100, "batch_size": 8, "seed": 1},
        "data": {"path": "x"},
    }
    assert base == base_copy


def test_merge_three_levels_and_replacement():
    base = {"a": {"b": {"c": 1, "d": 2}, "e": [1, 2]}, "f": {"g": 1}}
    out = merge(base, {"a": {"b": {"d": 3}, "e": [9]}, "f": 5})
    assert out == {"a": {"b": {"c": 1, "d": 3}, "e": [9]}, "f": 5}


# ------------------------------------------------------------------ build


def test_build_accepts_valid_values():
    cfg = build(TrainConfig, {"max_iters": 5, "learning_rate": 0.01, "decay_lr": False}, "train")
    assert cfg == dataclasses.replace(TrainConfig(), max_iters=5, learning_rate=0.01, decay_lr=False)


def test_build_unknown_key_suggests_close_match():
    with pytest.raises(ConfigError) as e:
        build(TrainConfig, {"max_iter": 5}, "train")
    msg = str(e.value)
    assert "train.max_iter" in msg
    assert "did you mean 'max_iters'" in msg


def test_build_unknown_key_without_close_match_lists_keys():
    with pytest.raises(ConfigError) as e:
        build(GPTConfig, {"zzzzzz": 1}, "model")
    assert "did you mean" not in str(e.value)
    assert "n_layers" in str(e.value)


@pytest.mark.parametrize(
    "key,value,type_name",
    [
        ("max_iters", "10", "int"),
        ("max_iters", 1.5, "int"),
        ("max_iters", True, "int"),
        ("learning_rate", "fast", "float"),
        ("learning_rate", True, "float"),
        ("decay_lr", 1, "bool"),
        ("device", 0, "str"),
        ("lr_decay_iters", "x", "int"),
    ],
)
def test_build_wrong_type_names_key_and_type(key, value, type_name):
    with pytest.raises(ConfigError) as e:
        build(TrainConfig, {key: value}, "train")
    msg = str(e.value)
    assert f"train.{key}" in msg
    assert type_name in msg


def test_build_accepts_int_for_float_field():
    cfg = build(TrainConfig, {"learning_rate": 1, "grad_clip": 0}, "train")
    assert cfg.learning_rate == 1.0 and type(cfg.learning_rate) is float
    assert cfg.grad_clip == 0.0 and type(cfg.grad_clip) is float


def test_build_optional_field_accepts_none_and_value():
    assert build(TrainConfig, {"lr_decay_iters": 50}, "train").lr_decay_iters == 50
    assert build(TrainConfig, {"lr_decay_iters": None}, "train").lr_decay_iters is None


def test_build_turns_value_error_into_config_error():
    with pytest.raises(ConfigError) as e:
        build(GPTConfig, {"d_model": 30, "n_heads": 4}, "model")
    assert e.value.__cause__ is None
    assert "[model]" in str(e.value) and "divisible" in str(e.value)
    with pytest.raises(ConfigError, match="dtype"):
        build(TrainConfig, {"dtype": "float8"}, "train")


def test_build_rejects_a_non_table():
    with pytest.raises(ConfigError, match=r"\[train\]"):
        build(TrainConfig, 5, "train")  # type: ignore[arg-type]


def test_build_result_is_frozen():
    cfg = build(TrainConfig, {}, "train")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_iters = 3  # type: ignore[misc]


# ------------------------------------------------------------------ presets, files, resolve


def test_shipped_presets_are_the_toml_files():
    folder = Path(__file__).resolve().parents[1] / "src" / "attnlab" / "presets"
    assert presets() == sorted(p.stem for p in folder.glob("*.toml"))
    assert {"demo", "shakespeare-char", "shakespeare-char-cpu"} <= set(presets())


@pytest.mark.parametrize("name", presets())
def test_each_preset_resolves(name):
    run_name, doc = load_preset_or_file(name)
    assert run_name == name
    cfg = resolve(doc)
    assert isinstance(cfg, RunConfig)
    assert cfg.task == doc.get("task", "lm") and cfg.task in TASKS
    # Every value the preset sets ends up in the config.
    for section in ("model", "data", "train"):
        for key, value in doc.get(section, {}).items():
            expected = tuple(value) if isinstance(value, list) else value  # TOML arrays become tuples
            assert getattr(getattr(cfg, section), key) == expected, f"{section}.{key}"


def test_unknown_preset_suggests_close_matches():
    with pytest.raises(ConfigError) as e:
        load_preset_or_file("shakespeare-chr")
    msg = str(e.value)
    assert "unknown preset 'shakespeare-chr'" in msg
    assert "did you mean" in msg and "'shakespeare-char'" in msg


def test_unknown_preset_without_close_match_lists_presets():
    with pytest.raises(ConfigError) as e:
        load_preset_or_file("qqqq")
    assert "did you mean" not in str(e.value)
    for name in presets():
        assert name in str(e.value)


def test_toml_path_works(tmp_path: Path):
    path = tmp_path / "my-run.toml"
    path.write_text('task = "lm"\n[model]\nn_layer = 1\n[train]\nlearning_rate = 1\n', encoding="utf-8")
    run_name, doc = load_preset_or_file(str(path))
    assert run_name == "my-run"
    assert doc == tomllib.loads(path.read_text(encoding="utf-8"))
    cfg = resolve(doc)
    assert cfg.model.n_layers == 1
    assert cfg.train.learning_rate == 1.0


def test_config_toml_in_a_run_folder_is_named_after_the_folder(tmp_path: Path):
    run = tmp_path / "run-7"
    run.mkdir()
    (run / "config.toml").write_text('task = "lm"\n', encoding="utf-8")
    assert load_preset_or_file(str(run / "config.toml"))[0] == "run-7"


def test_missing_toml_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_preset_or_file(str(tmp_path / "absent.toml"))


def test_invalid_toml_is_a_config_error(tmp_path: Path):
    path = tmp_path / "bad.toml"
    path.write_text("[model\nn_layer = ", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_preset_or_file(str(path))


def test_resolve_unknown_top_level_key_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        resolve({"task": "lm", "trian": {"max_iters": 1}})
    assert "'trian'" in str(e.value) and "did you mean 'train'" in str(e.value)


def test_resolve_unknown_task_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        resolve({"task": "lmm"})
    assert "unknown task 'lmm'" in str(e.value) and "'lm'" in str(e.value)


def test_resolve_unknown_key_in_a_section_is_a_config_error():
    with pytest.raises(ConfigError, match="model.n_layerz.*did you mean 'n_layers'"):
        resolve({"model": {"n_layerz": 2}})


def test_the_gpts_old_field_names_are_read_as_todays_and_not_beside_them():
    """Configs written before the GPT took the other families' vocabulary (n_layer, n_head, n_embd,
    n_kv_head) resolve to the same model; a field given under both names is refused."""
    old = resolve({"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_kv_head": 1}})
    new = resolve({"model": {"n_layers": 2, "n_heads": 2, "d_model": 32, "n_kv_heads": 1}})
    assert old.model == new.model and (new.model.n_layers, new.model.d_model) == (2, 32)
    with pytest.raises(ConfigError, match="model.n_embd is the old name of model.d_model"):
        resolve({"model": {"n_embd": 32, "d_model": 64}})
    overridden = apply_overrides({"model": {"n_layers": 6}}, {"model": {"n_layer": 2}})  # --set model.n_layer=2
    assert overridden == {"model": {"n_layers": 2}}


def test_resolve_with_overrides_end_to_end():
    _, doc = load_preset_or_file("demo")
    cfg = resolve(merge(doc, parse_overrides(["train.max_iters=3", "model.n_layers=1", "data.path=x.txt"])))
    assert cfg.train.max_iters == 3 and cfg.model.n_layers == 1 and cfg.data.path == "x.txt"
    assert cfg.model.d_model == doc["model"]["d_model"]


def test_task_that_is_not_a_name_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown task"):
        resolve({"task": ["lm"]})
