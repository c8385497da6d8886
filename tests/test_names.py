"""Task and model-kind names (`attnlab.names`): today's names, and the old ones configs still use.

A config written before the renaming (a run folder's config.toml, a TOML file, `--set task=...`)
must resolve to the config today's names give, build the same model, and load the same weights.
"""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import load
from attnlab.config import load_preset_or_file, presets, read_toml
from attnlab.errors import ConfigError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.names import OLD_KINDS, OLD_TASKS, TASK_KINDS, kind_name, task_name, upgrade, with_model_fields
from attnlab.tasks import TASKS
from attnlab.train import resolve
from attnlab.train.config import apply_overrides
from helpers import assert_user_error, cli, shared

FORMAT1 = Path(__file__).parent / "fixtures" / "run-format1"
FORMAT2 = Path(__file__).parent / "fixtures" / "run-format2"  # a run of each family, written with the old names

# The renaming as the docs' table states it (old task, old kind) -> (task, kind), written out here
# rather than read from attnlab.names, so that a wrong entry there fails.
RENAMED = {
    ("lm", None): ("language-model", None),
    ("chat", None): ("chat", None),
    ("translation", "transformer"): ("translation", "seq2seq-transformer"),
    ("translation", "rnn"): ("translation", "gru"),
    ("translation", "rnn-attention"): ("translation", "gru-attention"),
    ("mlm", "bert"): ("masked-lm", "bert"),
    ("replaced-token-detection", "electra"): ("replaced-token-detection", "electra"),
    ("classification", "bert"): ("text-classification", "bert"),
    ("classification", "bilstm"): ("text-classification", "bilstm"),
    ("tagging", "bert"): ("token-classification", "bert"),
    ("tagging", "bilstm"): ("token-classification", "bilstm"),
    ("nodes", "gat"): ("node-classification", "gat"),
    ("nodes", "gcn"): ("node-classification", "gcn"),
    ("nodes", "transformer"): ("node-classification", "node-transformer"),
    ("images", "pixelcnn"): ("image-density", "pixelcnn"),
    ("images", "gated_pixelcnn"): ("image-density", "gated-pixelcnn"),
    ("images", "gpt"): ("image-density", "pixel-gpt"),
    ("image-classification", "vit"): ("image-classification", "vit"),
    ("image-classification", "cnn"): ("image-classification", "cnn"),
    ("audio", "wavenet"): ("audio-density", "wavenet"),
    ("digits", "spectrogram_cnn"): ("audio-classification", "spectrogram-cnn"),
}
# What a model needs besides its kind to be built without data (the tokenizer or graph sets these).
SIZES = {
    "language-model": {"vocab_size": 11, "n_layers": 1, "d_model": 16, "n_heads": 2},
    "chat": {"vocab_size": 11, "n_layers": 1, "d_model": 16, "n_heads": 2},
    "translation": {"vocab_size": 11},
    "node-classification": {"n_features": 5, "n_classes": 3},
    "image-density": {},
}


def doc(task: str, kind: str | None) -> dict:
    model = ({"kind": kind} if kind else {}) | SIZES.get(task_name(task), {})
    if task_name(task) == "image-density" and kind in ("gpt", "pixel-gpt"):
        model |= {"vocab_size": 257, "n_layers": 1, "d_model": 16, "n_heads": 2}
    return {"task": task, "model": model}


def test_the_table_names_every_task_and_each_task_its_kinds():
    assert set(TASK_KINDS) == set(TASKS) == {new for new, _ in RENAMED.values()}
    assert {(task, kind) for task, kind in RENAMED.values()} == {
        (task, kind) for task, kinds in TASK_KINDS.items() for kind in kinds or (None,)
    }
    classes: dict[str, type] = {}
    for task, kinds in TASK_KINDS.items():
        for kind in kinds:
            config = resolve(doc(task, kind))
            assert config.task == task and config.model.kind == kind
            assert classes.setdefault(kind, type(config.model)) is type(config.model), f"{kind}: two model classes"
        for other in {k for ks in TASK_KINDS.values() for k in ks} - set(kinds):
            refusal = f"unknown model.kind '{other}' for task {task}" if kinds else "has no model.kind"
            with pytest.raises(ConfigError, match=refusal):
                resolve(doc(task, other))


def test_the_alias_table_maps_every_old_name():
    olds = {old_task: new_task for (old_task, _), (new_task, _) in RENAMED.items() if old_task != new_task}
    assert OLD_TASKS == olds
    for (old_task, old_kind), (new_task, new_kind) in RENAMED.items():
        assert task_name(old_task) == task_name(new_task) == new_task
        if old_kind is not None:
            assert kind_name(new_task, old_kind) == kind_name(new_task, new_kind) == new_kind
    renamed_kinds = {(new_task, old) for (_, old), (new_task, new) in RENAMED.items() if old != new}
    assert {(task, old) for task, table in OLD_KINDS.items() for old in table} == renamed_kinds


@pytest.mark.parametrize("old_task, old_kind", list(RENAMED))
def test_an_old_config_resolves_and_builds_as_the_new_names_do(old_task, old_kind):
    new_task, new_kind = RENAMED[(old_task, old_kind)]
    old, new = resolve(doc(old_task, old_kind)), resolve(doc(new_task, new_kind))
    assert old == new and old.task == new_task
    written = old.to_doc()  # what a new run folder's config.toml holds
    assert written["task"] == new_task and written["model"].get("kind") == new_kind
    assert resolve(written) == old  # the new names round-trip
    build = TASKS[new_task].build_model_from_config
    torch.manual_seed(0)
    a = build(old.model).state_dict()
    torch.manual_seed(0)
    b = build(new.model).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", presets())
def test_the_presets_use_todays_names(name):
    _, doc = load_preset_or_file(name)
    assert doc.get("task", "language-model") in TASK_KINDS, "an old task name in a shipped preset"
    kind = doc.get("model", {}).get("kind")
    assert kind is None or kind in TASK_KINDS[doc["task"]], "an old model kind in a shipped preset"


def test_an_old_kind_on_the_command_line_is_the_same_kind():
    preset = {"task": "nodes", "model": {"kind": "node-transformer", "n_layers": 3}}
    # The same kind by its old name keeps the preset's model settings; another kind starts afresh.
    assert apply_overrides(preset, {"model": {"kind": "transformer"}})["model"]["n_layers"] == 3
    assert "n_layers" not in apply_overrides(preset, {"model": {"kind": "gat"}})["model"]
    assert upgrade({"task": "images", "model": {"kind": "gpt"}}) == {
        "task": "image-density",
        "model": {"kind": "pixel-gpt"},
    }
    assert upgrade({})["task"] == "language-model"


def test_an_unknown_name_lists_todays_names_and_says_the_old_ones_are_read():
    with pytest.raises(ConfigError) as e:
        resolve({"task": "image"})
    message = str(e.value)
    assert "unknown task 'image'" in message and "did you mean" in message
    assert all(task in message for task in TASK_KINDS) and "older names still read: lm -> language-model" in message
    with pytest.raises(ConfigError) as e:
        resolve({"task": "translation", "model": {"kind": "lstm"}})
    assert "choose one of seq2seq-transformer, gru, gru-attention" in str(e.value)
    assert "older names still read: transformer -> seq2seq-transformer" in str(e.value)
    with pytest.raises(ConfigError, match="trains a GPT, which has no model.kind"):
        resolve({"task": "lm", "model": {"kind": "gpt"}})


def test_the_format1_fixtures_load_with_todays_names_and_their_saved_weights(tmp_path):
    lm = load(shutil.copytree(FORMAT1 / "lm", tmp_path / "lm"))
    assert read_toml(FORMAT1 / "lm" / "config.toml")["task"] == "lm" and lm.config.task == "language-model"
    # The family's model built by hand from the saved config and weights gives the same logits.
    saved = with_model_fields(read_toml(FORMAT1 / "lm" / "config.toml"))["model"]  # n_layer -> n_layers ...
    reference = GPT(GPTConfig(**saved)).eval()
    missing, unexpected = reference.load_state_dict(load_file(FORMAT1 / "lm" / "model.safetensors"), strict=False)
    assert missing == ["token_embedding.weight"] and not unexpected  # tied to lm_head, saved once
    assert reference.token_embedding.weight is reference.lm_head.weight
    ids = torch.randint(lm.config.model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(lm.model.eval()(ids), reference(ids), rtol=0, atol=0)

    cls = load(shutil.copytree(FORMAT1 / "classification", tmp_path / "classification"))
    assert cls.config.task == "text-classification" and cls.config.model.kind == "bilstm"
    saved = load_file(FORMAT1 / "classification" / "best.safetensors")
    state = cls.model.state_dict()
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], state[k]) for k in saved)


@pytest.mark.parametrize("family", sorted(p.name for p in FORMAT2.iterdir() if p.is_dir()))
def test_each_familys_old_run_folder_loads_with_todays_names(family, tmp_path):
    """tests/train/test_run_format2.py checks these folders' logits; here, the names they are read
    with, and the names their config is written with now (a resumed run rewrites its config.toml)."""
    saved = read_toml(FORMAT2 / family / "config.toml")
    old = (saved.get("task", "lm"), saved.get("model", {}).get("kind"))
    run = load(FORMAT2 / family)
    assert (run.config.task, getattr(run.config.model, "kind", None)) == RENAMED[old]
    written = tmp_path / "config.toml"
    written.write_text(run.config.to_toml(), encoding="utf-8")
    assert (read_toml(written)["task"], read_toml(written)["model"].get("kind")) == RENAMED[old]


def test_a_run_folder_written_with_the_old_names_loads_to_the_same_logits(tmp_path_factory, tmp_path):
    # A run folder of today's version, its config.toml as the version before the renaming wrote it.
    run_dir = shutil.copytree(shared(tmp_path_factory, "mt-transformer"), tmp_path / "old")
    config = (run_dir / "config.toml").read_text(encoding="utf-8")
    assert 'kind = "seq2seq-transformer"' in config
    (run_dir / "config.toml").write_text(config.replace('"seq2seq-transformer"', '"transformer"'), encoding="utf-8")
    old, new = load(run_dir), load(shared(tmp_path_factory, "mt-transformer"))
    assert old.config == new.config and old.config.model.kind == "seq2seq-transformer"
    src = torch.randint(4, old.config.model.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    tgt = src[:, :5]
    torch.testing.assert_close(old.model.eval()(src, tgt), new.model.eval()(src, tgt), rtol=0, atol=0)


def test_train_reads_old_names_and_writes_new_ones(tiny_toml, tmp_path, capsys):
    assert 'task = "lm"' in tiny_toml.read_text(encoding="utf-8")  # the shared tiny config: an old name
    out = tmp_path / "run"
    code, _, _ = cli(capsys, "train", str(tiny_toml), "--set", "task=lm", "--set", "train.max_iters=2", "--out", out)
    assert code == 0 and read_toml(out / "config.toml")["task"] == "language-model"
    code, _, _ = cli(capsys, "train", str(out), "--set", "train.max_iters=3", "--resume", "--quiet")
    assert code == 0 and load(out).step == 3
    result = cli(capsys, "train", str(tiny_toml), "--set", "task=imagess", "--out", tmp_path / "x")
    assert_user_error(result, "unknown task 'imagess'", "image-density", "older names still read")
