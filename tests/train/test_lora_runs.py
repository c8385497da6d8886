"""LoRA runs end to end: a BERT classifier fine-tuned from a Hugging Face folder (its base) and a
GPT language model built from its config (no base elsewhere until language-model runs take
`data.init_from`): what trains, what the checkpoints hold, exact resumption, a changed base refused,
`attnlab.load`, and the exports (merged, and a peft adapter folder that peft puts on the base)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from attnlab import load
from attnlab.checkpoints import TRAIN_STATE, load_train_state
from attnlab.nn.lora import lora_layers
from attnlab.train import resolve, train
from helpers import SST2, UD, assert_user_error, cli, encoder_doc, hf_bert_folder, losses

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LORA = {"rank": 4, "alpha": 8.0, "targets": ["query", "value", "ff-in"]}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return hf_bert_folder(tmp_path_factory.mktemp("hf-bert"))


def classifier_doc(base: Path, **train) -> dict:
    # lr_decay_iters fixed: a run of 3 steps then resumed to 6 follows the 6-step run's schedule.
    settings = {"max_iters": 6, "eval_interval": 3, "log_interval": 1, "lr_decay_iters": 6, **train}
    doc = encoder_doc("classification", SST2, data={"init_from": str(base)}, **settings)
    doc["train"]["lora"] = dict(LORA)
    return doc


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    train(resolve(classifier_doc(base)), run_dir, progress=False)
    return run_dir


def test_checkpoint_holds_adapters_and_head_and_a_reference_to_the_base(lora_run, base):
    from attnlab.checkpoints import weights_sha256

    saved = load_file(lora_run / "model.safetensors")
    # The base (a BertForMaskedLM folder) has no pooler: the run keeps its own initialisation of it.
    assert {k for k in saved if ".lora_" not in k} == {
        "head.proj.weight",
        "head.proj.bias",
        "pooler.weight",
        "pooler.bias",
    }
    assert len([k for k in saved if ".lora_" in k]) == 2 * 2 * 3  # 2 blocks, A and B, 3 parts
    manifest = json.loads((lora_run / "checkpoint.json").read_text())
    assert manifest["base"] == {"path": str(base), "weights_sha256": weights_sha256(base)}


def test_the_frozen_base_has_no_optimizer_state(lora_run):
    state = load_train_state(lora_run)["optimizer"]
    n_params = sum(len(g["params"]) for g in state["param_groups"])
    trainable = [k for k in load_file(lora_run / "model.safetensors") if not k.startswith("pooler.")]  # pooler: frozen
    assert n_params == len(trainable) == len(state["state"]) == 14  # 12 adapter matrices, the head's 2


def test_the_base_stays_as_it_was_and_the_adapters_moved(lora_run, base):
    run = load(lora_run, merge_lora=False)
    hf = transformers.BertForMaskedLM.from_pretrained(base).state_dict()
    q = hf["bert.encoder.layer.0.attention.self.query.weight"]
    torch.testing.assert_close(run.model.blocks[0].attn.in_proj.weight[: q.size(0)], q, rtol=0, atol=0)
    assert torch.count_nonzero(run.model.blocks[0].attn.in_proj.lora_B["query"]) > 0  # B trained away from 0


def test_resume_continues_exactly(base, tmp_path):
    whole, first = tmp_path / "whole", tmp_path / "resumed"
    train(resolve(classifier_doc(base)), whole, progress=False)
    train(resolve(classifier_doc(base, max_iters=3)), first, progress=False)
    train(resolve(classifier_doc(base)), first, resume=True, progress=False)
    assert losses(first) == losses(whole)
    assert torch.equal(
        load_file(first / "model.safetensors")["head.proj.weight"],
        load_file(whole / "model.safetensors")["head.proj.weight"],
    )


def test_a_changed_base_is_refused_on_resume_and_on_load(base, tmp_path, capsys):
    changed = tmp_path / "base"
    changed.mkdir()
    for f in base.iterdir():
        (changed / f.name).write_bytes(f.read_bytes())
    run_dir = tmp_path / "run"
    train(resolve(classifier_doc(changed, max_iters=3)), run_dir, progress=False)
    before = json.loads((run_dir / "checkpoint.json").read_text())["base"]["weights_sha256"]
    tensors = load_file(changed / "model.safetensors")
    tensors["bert.embeddings.word_embeddings.weight"] = tensors["bert.embeddings.word_embeddings.weight"] + 1e-3
    save_file(tensors, changed / "model.safetensors", metadata={"format": "pt"})
    from attnlab.checkpoints import weights_sha256

    now = weights_sha256(changed)
    capsys.readouterr()  # the first training's log
    result = cli(capsys, "train", str(run_dir / "config.toml"), "--out", str(run_dir), "--resume", "--quiet")
    assert_user_error(result, "has changed", before, now)
    result = cli(capsys, "eval", str(run_dir))
    assert_user_error(result, before, now)


def test_load_merges_by_default_and_both_compute_the_same(lora_run):
    merged, apart = load(lora_run), load(lora_run, merge_lora=False)
    assert not lora_layers(merged.model) and lora_layers(apart.model)
    ids = torch.randint(5, 100, (3, 12))
    torch.testing.assert_close(merged.model(ids), apart.model(ids), rtol=0, atol=1e-5)


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_export_merged_equals_the_unmerged_model(lora_run, tmp_path, capsys):
    out = tmp_path / "hf"
    code, _, err = cli(capsys, "export", str(lora_run), "--to", "hf", str(out))
    assert code == 0, err
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    ids = torch.randint(5, 100, (3, 12))
    with torch.no_grad():
        want = load(lora_run, merge_lora=False).model(ids)
    torch.testing.assert_close(hf_logits(hf, ids), want, rtol=0, atol=1e-5)


def test_export_adapter_is_what_peft_puts_on_the_base(lora_run, base, tmp_path, capsys):
    out = tmp_path / "adapter"
    code, stdout, err = cli(capsys, "export", str(lora_run), "--to", "hf", str(out), "--adapter")
    assert code == 0, err
    assert "PeftModel.from_pretrained" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    hf_base = transformers.AutoModelForSequenceClassification.from_pretrained(base, num_labels=2)
    model = peft.PeftModel.from_pretrained(hf_base, out).eval()
    ids = torch.randint(5, 100, (3, 12))
    with torch.no_grad():
        want = load(lora_run, merge_lora=False).model(ids)
    torch.testing.assert_close(hf_logits(model, ids), want, rtol=0, atol=1e-5)


def test_a_tagger_lora_run_exports_an_adapter_peft_puts_on_the_base(base, tmp_path, capsys):
    doc = encoder_doc("tagging", UD, data={"init_from": str(base)}, max_iters=2, eval_interval=2)
    doc["train"]["lora"] = {"rank": 2, "alpha": 4.0, "targets": ["key", "output", "ff-out"]}
    run_dir, out = tmp_path / "run", tmp_path / "adapter"
    train(resolve(doc), run_dir, progress=False)
    assert cli(capsys, "export", str(run_dir), "--to", "hf", str(out), "--adapter")[0] == 0
    n_labels = len(load(run_dir).model.head.proj.bias)
    hf_base = transformers.AutoModelForTokenClassification.from_pretrained(base, num_labels=n_labels)
    model = peft.PeftModel.from_pretrained(hf_base, out).eval()
    ids = torch.randint(5, 100, (2, 9))
    with torch.no_grad():
        want = load(run_dir, merge_lora=False).model(ids)
    torch.testing.assert_close(hf_logits(model, ids), want, rtol=0, atol=1e-5)


def test_export_adapter_of_a_run_without_lora_is_refused(tmp_path, capsys):
    doc = encoder_doc("classification", SST2, max_iters=1, eval_interval=1)
    plain = tmp_path / "plain"
    train(resolve(doc), plain, progress=False)
    capsys.readouterr()
    assert_user_error(
        cli(capsys, "export", str(plain), "--to", "hf", str(tmp_path / "a"), "--adapter"), "not a LoRA run"
    )
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("train.lora.rank=0", "lora.rank must be >= 1"),
        ("train.lora.targets=['qkv']", "'qkv' names no part"),
        ("train.lora.targets=['gate']", "'gate' names no part of this Bert"),
        ("train.lora.targets=[]", "must name at least one part"),
    ],
)
def test_bad_lora_settings_are_one_line_and_write_no_run_folder(base, tmp_path, capsys, setting, fragment):
    out = tmp_path / "run"
    args = ["train", "sst2", "--data-dir", str(SST2), "--init-from", str(base), "--out", str(out)]
    args += ["--set=train.max_iters=1", "--set=data.val_size=40", f"--set={setting}", "--quiet"]
    assert_user_error(cli(capsys, *args), fragment)
    assert not out.exists()


# -- a language model built from its config (no base elsewhere) -------------------------------------
def lm_args(tiny_toml: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        str(tiny_toml),
        "--out",
        str(out),
        "--set=train.lora.rank=2",
        "--set=train.lora.targets=['query','key','value','output','ff-in','ff-out']",
        "--set=train.device=cpu",
        "--set=train.lr_decay_iters=8",
        "--quiet",
        *extra,
    ]


def test_language_model_lora_trains_resumes_exactly_and_exports(tiny_toml, tmp_path, capsys):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert cli(capsys, *lm_args(tiny_toml, whole))[0] == 0
    assert cli(capsys, *lm_args(tiny_toml, resumed, "--set=train.max_iters=4"))[0] == 0
    assert cli(capsys, *lm_args(tiny_toml, resumed, "--resume"))[0] == 0
    assert losses(resumed) == losses(whole)
    # No base elsewhere: the checkpoint holds the whole model, the base frozen at its initialisation.
    with safe_open(whole / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {"blocks.0.attn.in_proj.weight", "blocks.1.ffn.fc2.weight"} <= names
    state = torch.load(whole / TRAIN_STATE, weights_only=True)["optimizer"]
    assert len(state["state"]) == len([n for n in names if ".lora_" in n])
    run = load(whole, merge_lora=False)
    assert len(lora_layers(run.model)) == 2 * 4  # in_proj, out_proj, fc1, fc2 in each of 2 blocks
    out = tmp_path / "hf"
    assert cli(capsys, "export", str(whole), "--to", "hf", str(out))[0] == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    idx = torch.randint(0, run.model.config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, run.model(idx), rtol=0, atol=1e-5)


# -- a language model fine-tuned from a Hugging Face folder (its base) ------------------------------
def lm_takes_a_base() -> bool:
    import dataclasses

    from attnlab.tasks.language_model import LMDataConfig

    return "init_from" in {f.name for f in dataclasses.fields(LMDataConfig)}


@pytest.mark.skipif(not lm_takes_a_base(), reason="language-model runs take no data.init_from in this checkout")
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_language_model_lora_on_a_hugging_face_base(family, corpus, tmp_path, capsys):
    from hf_folders import causal_lm_folder

    base = tmp_path / "base"
    causal_lm_folder(base, family)
    settings = [
        "--set=train.max_iters=4",
        "--set=train.lr_decay_iters=4",
        "--set=train.eval_interval=2",
        "--set=train.log_interval=2",  # rows at the same steps in the interrupted run
        "--set=train.eval_iters=2",
        "--set=train.gradient_accumulation_steps=1",
        "--set=train.device=cpu",
        "--set=train.lora.rank=2",
        "--set=train.lora.targets=['query','value','ff-out']",
        "--quiet",
    ]
    common = ["train", "finetune-lm", "--init-from", str(base), f"--set=data.path={corpus}", *settings]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert cli(capsys, *common, "--out", str(whole))[0] == 0
    assert cli(capsys, *common, "--out", str(resumed), "--set=train.max_iters=2")[0] == 0
    assert cli(capsys, *common, "--out", str(resumed), "--resume")[0] == 0
    assert losses(resumed) == losses(whole)
    assert all(".lora_" in k for k in load_file(whole / "model.safetensors"))  # the base is not copied
    apart = load(whole, merge_lora=False).model
    idx = torch.randint(2, 250, (2, 12))
    with torch.no_grad():
        want = apart(idx)
        for flag in ([], ["--adapter"]):
            out = tmp_path / f"export{len(flag)}"
            code, _, err = cli(capsys, "export", str(whole), "--to", "hf", str(out), *flag)
            assert code == 0, err
            if flag:
                hf = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), out)
            else:
                hf = transformers.AutoModelForCausalLM.from_pretrained(out)
            torch.testing.assert_close(hf.eval()(input_ids=idx).logits, want, rtol=0, atol=1e-5)
