"""ModernBERT's classifiers, export and LoRA adapters: what attnlab writes, transformers (and peft)
read back with the same logits.

The reference is transformers itself: `ModernBertForSequenceClassification` and
`ModernBertForTokenClassification` loaded from the folder attnlab exports, and peft's `PeftModel`
on the classifier transformers builds from the base folder. The folders are the tiny random
ModernBERTs of test_modernbert.py (several shapes, odd head counts, windows far shorter than the
texts); nothing is downloaded.
"""

import dataclasses
import json

import pytest
import torch

from attnlab import load
from attnlab.cli import main
from attnlab.errors import CheckpointError, ExportError
from attnlab.models.bert import Bert, BertConfig, PredictionClassifierHead
from attnlab.models.hf._common import save_hf_checkpoint
from attnlab.models.hf.bert import bert_export_problems
from attnlab.models.hf.modernbert import (
    load_modernbert,
    modernbert_config_from_hf,
    modernbert_export,
    modernbert_export_problems,
)
from attnlab.models.hf.peft import ADAPTER_CONFIG, peft_adapter
from attnlab.nn.lora import add_lora, lora_layers
from helpers import SST2, UD
from models.hf.test_modernbert import hf_batch, modernbert_folder
from roberta_folders import TEXTS

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

HF_CLASSES = {"sequence": "ModernBertForSequenceClassification", "token": "ModernBertForTokenClassification"}
LABELS = ["neg", "neutral", "pos"]
NEW_KEYS = ("layer_types", "rope_parameters")  # transformers 5's; older files say the same another way


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory):
    """A ModernBertForMaskedLM folder of a shape, written once per module: `mlm_folder("h4")`."""
    made = {}

    def folder(shape: str = "h4"):
        if shape not in made:
            made[shape] = tmp_path_factory.mktemp(f"modernbert-{shape}")
            modernbert_folder(made[shape], "mlm", shape)
        return made[shape]

    return folder


def spread(module: torch.nn.Module, seed: int = 1) -> None:
    """Weights drawn wide enough that the logits are of order one (attnlab's 0.02 would leave them
    near zero, where any mix-up passes a 1e-4 tolerance); norms moved off one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else noise / p.shape[-1] ** 0.5)


def classifier(folder, head: str, pooling: str = "cls") -> Bert:
    """A ModernBERT classifier over the folder's encoder, its head drawn at random."""
    loaded = load_modernbert(folder)
    model = Bert(dataclasses.replace(loaded.config, head=head, n_labels=len(LABELS), pooling=pooling))
    model.load_encoder(loaded.model.state_dict())
    spread(model.head)
    return model.eval()


def hf_classifier(folder, head: str) -> torch.nn.Module:
    auto = transformers.AutoModelForSequenceClassification if head == "sequence" else None
    auto = auto or transformers.AutoModelForTokenClassification
    model = auto.from_pretrained(str(folder)).eval()
    assert type(model).__name__ == HF_CLASSES[head]
    return model


def assert_same_logits(theirs: torch.nn.Module, ours: torch.nn.Module, batch: dict, head: str, atol=1e-4) -> None:
    """Both models' logits on a batch; a tagger's at the real positions (what either computes at
    padding is never read)."""
    with torch.no_grad():
        want, got = theirs(**batch).logits, ours(batch["input_ids"])
    if head == "token":
        real = batch["attention_mask"].bool()
        want, got = want[real], got[real]
    assert want.std() > 0.1  # logits far from zero: a mix-up cannot hide in the tolerance
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)


@pytest.mark.parametrize(
    ("head", "pooling", "shape"), [("sequence", "cls", "h4"), ("sequence", "mean", "h3"), ("token", "cls", "h5")]
)
def test_export_gives_transformers_classifier_the_same_logits(mlm_folder, tmp_path, head, pooling, shape):
    folder = mlm_folder(shape)
    model = classifier(folder, head, pooling)
    assert isinstance(model.head, PredictionClassifierHead) and model.pooler is None
    save_hf_checkpoint(modernbert_export(model, LABELS), tmp_path)
    theirs = hf_classifier(tmp_path, head)
    assert theirs.config.classifier_pooling == pooling and theirs.config.id2label == dict(enumerate(LABELS))
    padded, single = hf_batch(folder), hf_batch(folder, TEXTS[:1])
    assert (padded["attention_mask"] == 0).any() and single["attention_mask"].all()
    assert_same_logits(theirs, model, padded, head)
    assert_same_logits(theirs, model, single, head)
    # Older readers (the Hub's files) take the pattern and the bases from the keys before transformers 5.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k not in NEW_KEYS}))
    assert_same_logits(hf_classifier(tmp_path, head), model, padded, head)


def test_a_classifier_pooling_attnlab_does_not_compute_is_refused():
    with pytest.raises(CheckpointError, match="config.json: classifier_pooling must be one of"):
        modernbert_config_from_hf({"model_type": "modernbert", "classifier_pooling": "max"})


def test_transformers_classifier_folders_import_with_their_head(mlm_folder, tmp_path):
    """A ModernBertForSequenceClassification (mean pooling) and a ModernBertForTokenClassification
    saved by transformers load with their heads and labels, give transformers' logits, and export
    back to the same tensors."""
    folder = mlm_folder("h3")
    for head, cls in HF_CLASSES.items():
        out = tmp_path / head
        hf = getattr(transformers, cls).from_pretrained(
            str(folder), num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), classifier_pooling="mean"
        )
        spread(hf.head), spread(hf.classifier, seed=2)
        hf.eval().save_pretrained(out)
        (out / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
        loaded = load_modernbert(out)
        assert (loaded.config.head, loaded.labels, loaded.config.pooling) == (head, LABELS, "mean")
        assert_same_logits(hf, loaded.model, hf_batch(folder), head)
        again = modernbert_export(loaded.model, loaded.labels).tensors
        assert set(again) == set(hf.state_dict())
        for name, tensor in hf.state_dict().items():
            torch.testing.assert_close(again[name], tensor, atol=0, rtol=0)


def test_a_classifier_starts_from_the_masked_lm_transform_as_transformers_does(mlm_folder):
    """`ModernBertForSequenceClassification.from_pretrained` of a masked-LM folder takes its head's
    dense layer and norm (the same names); so does attnlab's classifier (`Bert.load_encoder`), and
    never the label layer."""
    folder = mlm_folder("h4")
    loaded = load_modernbert(folder)
    model = Bert(dataclasses.replace(loaded.config, head="sequence", n_labels=2))
    fresh = model.head.proj.weight.clone()
    model.load_encoder(loaded.model.state_dict())
    theirs = transformers.ModernBertForSequenceClassification.from_pretrained(str(folder), num_labels=2)
    torch.testing.assert_close(model.head.dense.weight, theirs.head.dense.weight, atol=0, rtol=0)
    torch.testing.assert_close(model.head.norm.weight, theirs.head.norm.weight, atol=0, rtol=0)
    torch.testing.assert_close(model.head.proj.weight, fresh, atol=0, rtol=0)


FINE_TUNE = [
    "--set=data.max_tokens=600",
    "--set=train.max_iters=3",
    "--set=train.eval_interval=3",
    "--set=train.lr_decay_iters=3",
    "--set=train.warmup_iters=1",
    "--set=train.device=cpu",
    "--quiet",
]
TASKS = {"sequence": ("sst2", SST2, ["--set=data.val_size=20"]), "token": ("ud-pos", UD, [])}


@pytest.fixture(scope="module")
def runs(mlm_folder, tmp_path_factory):
    """Runs fine-tuned from the masked-LM folder, one per head (built on first use)."""
    made = {}

    def run(head: str):
        if head not in made:
            preset, data, extra = TASKS[head]
            out = tmp_path_factory.mktemp(f"run-{head}") / "run"
            args = ["train", preset, "--data-dir", str(data), "--init-from", str(mlm_folder("h4")), "--out", str(out)]
            assert main([*args, *FINE_TUNE, *extra]) == 0
            made[head] = out
        return made[head]

    return run


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_a_run_fine_tuned_from_modernbert_exports_to_transformers(runs, tmp_path, head):
    """`attnlab export RUN --to hf` writes a ModernBERT folder: transformers' classifier gives the
    run's logits with and without padding, and its tokenizer the run's ids."""
    out = runs(head)
    assert main(["export", str(out), str(tmp_path / "hf"), "--to", "hf"]) == 0
    run = load(out)
    assert run.config.model.classifier_head == "prediction"
    theirs = hf_classifier(tmp_path / "hf", head)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    t = run.tokenizer
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == [t.cls_id, *t.encode(text), t.sep_id], text
    padded = tokenizer(list(TEXTS), padding=True, return_tensors="pt")
    assert (padded["attention_mask"] == 0).any()
    assert_same_logits(theirs, run.model.eval(), padded, head, atol=1e-4)
    assert_same_logits(theirs, run.model, tokenizer(TEXTS[:1], return_tensors="pt"), head, atol=1e-4)


PEFT_TARGETS = ("query", "value", "output", "gate", "ff-out")  # parts of both fused layers, and whole ones


def test_lora_adapters_on_the_fused_layers_are_what_peft_computes(mlm_folder, tmp_path):
    """attnlab's adapters on q and v (two slices of Wqkv) and on the gate (one half of Wi) as peft
    adapters on ModernBERT's fused layers: peft's PeftModel on transformers' classifier of the base
    folder gives the model's logits."""
    peft = pytest.importorskip("peft")
    folder = mlm_folder("h4")
    model = classifier(folder, "sequence")
    add_lora(model, PEFT_TARGETS, rank=2, alpha=3.0)
    for layer in lora_layers(model).values():
        spread(layer.lora_B, seed=3)  # B starts at zero: drawn here, so the adapters change the logits
    config, tensors = peft_adapter(model)
    wqkv = "model.layers.1.attn.Wqkv"
    assert config["rank_pattern"][wqkv.replace(".", "\\.")] == 4  # q and v: two rank-2 slices stacked
    assert {"head", "classifier"} <= set(config["modules_to_save"])
    (tmp_path / ADAPTER_CONFIG).write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    base = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=len(LABELS))
    theirs = peft.PeftModel.from_pretrained(base, tmp_path).eval()
    batch = hf_batch(folder)
    assert_same_logits(theirs, model, batch, "sequence", atol=1e-5)
    with torch.no_grad():  # the adapters matter: without them the logits are others
        adapted = model(batch["input_ids"])
        for layer in lora_layers(model).values():
            for b in layer.lora_B.values():
                b.zero_()
        assert (model(batch["input_ids"]) - adapted).abs().max() > 1e-2


def test_a_lora_run_from_modernbert_exports_what_peft_puts_on_the_base(mlm_folder, tmp_path):
    """The whole path: LoRA fine-tuning from the folder, `attnlab export --adapter`, peft on
    transformers' ModernBertForSequenceClassification of the same folder."""
    peft = pytest.importorskip("peft")
    folder, out, adapter = mlm_folder("h4"), tmp_path / "run", tmp_path / "adapter"
    args = ["train", "sst2", "--data-dir", str(SST2), "--init-from", str(folder), "--out", str(out)]
    lora = ["--set=train.lora.rank=2", "--set=train.lora.alpha=4.0", "--set=train.learning_rate=3e-2"]
    lora.append(f"--set=train.lora.targets={list(PEFT_TARGETS)}")
    assert main([*args, *FINE_TUNE, "--set=data.val_size=20", *lora]) == 0
    assert main(["export", str(out), str(adapter), "--to", "hf", "--adapter"]) == 0
    run = load(out, merge_lora=False)
    base = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(folder), num_labels=run.config.model.n_labels
    )
    theirs = peft.PeftModel.from_pretrained(base, adapter).eval()
    assert_same_logits(theirs, run.model.eval(), hf_batch(folder), "sequence", atol=1e-5)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"classifier_head": "linear"}, "classifier_head = 'linear' (ModernBERT has classifiers over its prediction"),
        ({"norm": "post", "norm_first_block": True}, "norm = 'post' (ModernBERT has a norm before each sublayer"),
        ({"bias": True}, "bias = True (ModernBERT has no biases)"),
        ({"activation": "swiglu"}, "activation = 'swiglu' (ModernBERT has a GeGLU"),
        ({"n_kv_heads": 2}, "n_kv_heads = 2"),
        ({"rope_scaling": "linear", "rope_factor": 2.0}, "rope_scaling = 'linear'"),
    ],
)
def test_a_part_modernbert_lacks_is_refused_by_name(mlm_folder, changes, needle):
    config = load_modernbert(mlm_folder("h4")).config
    model = Bert(dataclasses.replace(config, head="sequence", n_labels=2, **changes))
    assert any(needle in problem for problem in modernbert_export_problems(model.config))
    with pytest.raises(ExportError, match="cannot export to transformers ModernBERT") as e:
        modernbert_export(model)
    assert "\n" not in str(e.value) and needle in str(e.value)
    assert not modernbert_export_problems(dataclasses.replace(config, head="sequence", n_labels=2))


def test_bert_export_refuses_modernberts_classifier():
    """A BERT classifier with ModernBERT's head has no BERT class to go to (BERT's reads the pooler)."""
    config = BertConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=1, d_ff=32, head="token", n_labels=2)
    assert not bert_export_problems(config)
    problems = bert_export_problems(dataclasses.replace(config, classifier_head="prediction"))
    assert problems == [
        "classifier_head = 'prediction' (BERT has a linear classifier, a sentence's on the tanh pooler)"
    ]


def test_export_of_a_run_with_rotary_positions_but_not_modernberts_parts_is_one_line(tmp_path, capsys):
    """A BERT trained with rotary positions is a ModernBERT in nothing else: `attnlab export` names
    each part ModernBERT lacks, on one line, exit 2, and writes nothing."""
    out = tmp_path / "run"
    small = ["--set=model.d_model=16", "--set=model.n_heads=2", "--set=model.n_layers=1", "--set=model.d_ff=32"]
    small += ["--set=model.positions='rope'", "--set=data.vocab_size=200", "--set=data.val_size=20"]
    args = ["train", "sst2", "--data-dir", str(SST2), "--out", str(out), *FINE_TUNE, *small]
    assert main([*args, "--set=train.max_iters=1", "--set=train.eval_interval=1"]) == 0
    capsys.readouterr()
    assert main(["export", str(out), str(tmp_path / "hf"), "--to", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for needle in ("ModernBERT", "norm = 'post'", "bias = True", "classifier_head = 'linear'", "type_vocab_size"):
        assert needle in err, err
    assert not (tmp_path / "hf").exists()


def test_an_unknown_classifier_head_is_refused_by_name():
    with pytest.raises(ValueError, match=r"classifier_head must be one of \['linear', 'prediction'\], got 'mlp'"):
        BertConfig(head="sequence", n_labels=2, classifier_head="mlp")
