"""attnlab.models.hf.roberta: RoBERTa checkpoints saved by transformers give transformers' outputs.

The reference is transformers itself, on the same folder: a tiny random RoBERTa (several shapes,
odd head counts among them) saved beside a byte-level BPE tokenizer.json with RoBERTa's special
tokens and post-processor (tests/roberta_folders.py; nothing is downloaded). Both read padded
batches, right- and left-padded: RoBERTa numbers positions from the input ids (padding at row
pad_token_id, real tokens from pad_token_id + 1), which every position's output shows.
"""

import json

import pytest
import torch

from attnlab import families, load
from attnlab.cli import main
from attnlab.data.tokenizers import ROBERTA_SPECIAL_TOKENS, EncoderTokenizer, load_tokenizer
from attnlab.errors import CheckpointError, ExportError
from attnlab.models.bert import Bert, positions_after_padding
from attnlab.models.hf._common import save_hf_checkpoint
from attnlab.models.hf.auto import ENCODER_LOADERS
from attnlab.models.hf.roberta import load_roberta, roberta_export
from attnlab.tasks.embeddings import Pooling, SentenceEncoder, load_sentence_encoder, read_pooling
from helpers import SST2
from roberta_folders import CLS, PAD, SEP, SHAPES, TEXTS, roberta_folder

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")


def hf_batch(folder, texts=TEXTS, side: str = "right") -> dict[str, torch.Tensor]:
    """transformers' tokenizer of the folder on `texts`, padded on `side`: input_ids, attention_mask `(B, T)`."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = side
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any() or len(texts) == 1
    return batch


def both(hf: torch.nn.Module, model: Bert, batch: dict[str, torch.Tensor]):
    """transformers' output and ours for one batch (ours reads the padding from the ids alone)."""
    with torch.no_grad():
        return hf(**batch), model(batch["input_ids"])


def test_position_ids_are_those_of_transformers():
    ids = torch.tensor([[CLS, 9, 8, SEP, PAD, PAD], [PAD, PAD, CLS, 9, 8, SEP], [CLS, PAD, 7, PAD, 6, SEP]])
    embeddings = transformers.models.roberta.modeling_roberta.RobertaEmbeddings
    theirs = embeddings.create_position_ids_from_input_ids(ids, PAD)
    assert positions_after_padding(ids, PAD).tolist() == theirs.tolist()
    assert positions_after_padding(ids, PAD)[1].tolist() == [1, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("side", ["right", "left"])
def test_encoder_matches_transformers(tmp_path, shape, side):
    _, hf = roberta_folder(tmp_path, "model", shape)
    loaded = load_roberta(tmp_path)
    c = loaded.config
    assert (c.head, c.position_ids, c.max_len, c.pad_id, c.type_vocab_size) == ("none", "after_padding", 40, PAD, 1)
    assert loaded.missing == [] and not loaded.model.training
    batch = hf_batch(tmp_path, side=side)
    theirs, ours = both(hf, loaded.model, batch)
    # Every position, padding included: both libraries give padding position pad_token_id.
    torch.testing.assert_close(ours, theirs.last_hidden_state, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        pooled = loaded.model.pooled(batch["input_ids"])
    torch.testing.assert_close(pooled, theirs.pooler_output, atol=1e-4, rtol=1e-4)


def test_encoder_matches_transformers_without_padding(tmp_path):
    _, hf = roberta_folder(tmp_path, "model", "h3")
    loaded = load_roberta(tmp_path)
    batch = hf_batch(tmp_path, TEXTS[:1])
    assert batch["attention_mask"].all() and batch["input_ids"].size(1) > 10
    theirs, ours = both(hf, loaded.model, batch)
    torch.testing.assert_close(ours, theirs.last_hidden_state, atol=1e-4, rtol=1e-4)


def test_masked_lm_matches_transformers(tmp_path):
    _, hf = roberta_folder(tmp_path, "mlm", "h5")
    loaded = load_roberta(tmp_path)
    assert loaded.config.head == "mlm" and loaded.missing == ["pooler.weight", "pooler.bias"]
    assert loaded.model.head.decoder.weight is loaded.model.embeddings.token.weight
    theirs, ours = both(hf, loaded.model, hf_batch(tmp_path))
    torch.testing.assert_close(ours, theirs.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_classifiers_match_transformers(tmp_path, kind):
    _, hf = roberta_folder(tmp_path, kind, "h3", id2label={0: "neg", 1: "mid", 2: "pos"})
    loaded = load_roberta(tmp_path)
    assert loaded.config.head == kind and loaded.labels == ["neg", "mid", "pos"]
    batch = hf_batch(tmp_path)
    theirs, ours = both(hf, loaded.model, batch)
    real = batch["attention_mask"].bool()
    if kind == "sequence":
        torch.testing.assert_close(ours, theirs.logits, atol=1e-4, rtol=1e-4)
    else:
        torch.testing.assert_close(ours[real], theirs.logits[real], atol=1e-4, rtol=1e-4)


def test_tokenizer_gives_the_ids_of_transformers(tmp_path):
    roberta_folder(tmp_path)
    ours = load_roberta(tmp_path).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert isinstance(ours, EncoderTokenizer) and ours.special_tokens == ROBERTA_SPECIAL_TOKENS
    roles = (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id)
    assert roles == tuple(theirs.convert_tokens_to_ids(list(ROBERTA_SPECIAL_TOKENS))) == (PAD, 3, CLS, SEP, 4)
    for text in [*TEXTS, "naïve café — ünïcödé ✓", "a <mask> in the text", ""]:
        assert [ours.cls_id, *ours.encode(text), ours.sep_id] == theirs(text)["input_ids"], text
    ids = ours.encode(TEXTS[0])
    assert ours.decode(ids) == TEXTS[0]
    assert "".join(ours.token_texts(ids)) == TEXTS[0]  # real characters, not the byte alphabet's "Ġ"
    # A run saves the tokenizer and reads it back as the encoder's, roles and all.
    ours.save(tmp_path / "run-tokenizer.json")
    again = load_tokenizer(tmp_path / "run-tokenizer.json")
    assert isinstance(again, EncoderTokenizer) and again.special_tokens == ROBERTA_SPECIAL_TOKENS
    assert again.encode(TEXTS[2]) == ours.encode(TEXTS[2])


def mean_pooled_reference(folder, hf: torch.nn.Module) -> torch.Tensor:
    """sentence-transformers' mean pooling written out: transformers' hidden states averaged over
    the attention mask (<s> and </s> included) -> `(N, C)`."""
    batch = hf_batch(folder)
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state  # (N, T, C)
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (N, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1)


def test_sentence_vectors_are_mean_pooled_hidden_states(tmp_path):
    _, hf = roberta_folder(tmp_path, "model", "h4")
    loaded = load_roberta(tmp_path)
    encoder = SentenceEncoder(loaded.model, loaded.tokenizer, read_pooling(tmp_path))
    assert encoder.pooling == Pooling()  # a plain folder: the mean over every token
    torch.testing.assert_close(encoder.embed_texts(TEXTS), mean_pooled_reference(tmp_path, hf), atol=1e-4, rtol=1e-4)


def test_embed_command_on_a_roberta_folder(tmp_path, capsys):
    _, hf = roberta_folder(tmp_path / "roberta", "model", "h3")
    encoder = load_sentence_encoder(tmp_path / "roberta", torch.device("cpu"))
    want = mean_pooled_reference(tmp_path / "roberta", hf)
    torch.testing.assert_close(encoder.embed_texts(TEXTS), want, atol=1e-4, rtol=1e-4)
    capsys.readouterr()
    assert main(["embed", str(tmp_path / "roberta"), *TEXTS, "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dim"] == 30
    torch.testing.assert_close(torch.tensor(out["vectors"]), want, atol=1e-4, rtol=1e-4)


FINE_TUNE = [
    "--set=data.val_size=20",
    "--set=data.max_tokens=600",
    "--set=train.max_iters=3",
    "--set=train.eval_interval=3",
    "--set=train.warmup_iters=1",
    "--set=train.device=cpu",
    "--quiet",
]


def test_fine_tuning_starts_from_a_roberta_folder(tmp_path):
    roberta_folder(tmp_path / "roberta", "mlm", "h4")
    out = tmp_path / "run"
    args = ["train", "sst2", "--data-dir", str(SST2), "--init-from", str(tmp_path / "roberta"), "--out", str(out)]
    assert main([*args, *FINE_TUNE]) == 0
    run = load(out, checkpoint="last")
    c = run.config.model
    assert run.step == 3 and (c.d_model, c.n_layers, c.head, c.position_ids, c.pad_id) == (
        32,
        2,
        "sequence",
        "after_padding",
        PAD,
    )
    assert isinstance(run.tokenizer, EncoderTokenizer) and run.tokenizer.special_tokens == ROBERTA_SPECIAL_TOKENS
    # `attnlab export --to hf` writes the fine-tuned run back as a RoBERTa classifier transformers reads.
    assert main(["export", str(out), str(tmp_path / "exported"), "--to", "hf"]) == 0
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported").eval()
    ids = torch.tensor([[0, 5, 9, 14, 2]])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, run.model.eval()(ids), atol=1e-4, rtol=0)
    assert theirs.config.model_type == "roberta"


def test_export_gives_transformers_the_same_model(tmp_path):
    _, hf = roberta_folder(tmp_path / "in", "mlm", "h3")
    loaded = load_roberta(tmp_path / "in")
    (tmp_path / "out").mkdir()
    save_hf_checkpoint(roberta_export(loaded.model), tmp_path / "out")
    again = transformers.RobertaForMaskedLM.from_pretrained(str(tmp_path / "out")).eval()
    batch = hf_batch(tmp_path / "in", side="left")
    theirs, ours = both(again, loaded.model, batch)
    torch.testing.assert_close(ours, theirs.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(theirs.logits, hf(**batch).logits, atol=1e-5, rtol=1e-5)


def test_export_refuses_bert_positions(tmp_path):
    roberta_folder(tmp_path, "model", "h4")
    model = load_roberta(tmp_path).model
    model.config = model.config.__class__(**{**model.config.__dict__, "position_ids": "index", "max_len": 42})
    with pytest.raises(ExportError, match="position_ids = 'index'"):
        roberta_export(model)


def test_registered_as_an_encoder_family():
    assert families.by_model_type("roberta").kind == families.ENCODER
    assert ENCODER_LOADERS["roberta"] is load_roberta


def edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    ("key", "value", "needles"),
    [
        ("position_embedding_type", "relative_key", ["relative-position terms"]),
        ("is_decoder", True, ["attends causally"]),
        ("add_cross_attention", True, ["cross-attention"]),
        ("hidden_act", "swish", ["'swish'", "not supported"]),
        ("max_position_embeddings", 2, ["leaves no position", "pad_token_id + 1 = 2"]),
        ("pad_token_id", 0, ["pad_token_id=0", "padding token is id 1"]),
    ],
)
def test_unsupported_config_is_one_line_naming_the_field(tmp_path, key, value, needles):
    roberta_folder(tmp_path, "model", "h4")
    edit_config(tmp_path, **{key: value})
    with pytest.raises(CheckpointError) as e:
        load_roberta(tmp_path)
    message = str(e.value)
    assert "\n" not in message and "config.json" in message and key in message, message
    for needle in needles:
        assert needle in message, message


def test_masked_lm_head_with_another_activation_is_refused(tmp_path):
    # RobertaLMHead applies exact GELU whatever hidden_act says; attnlab's head follows hidden_act.
    roberta_folder(tmp_path, "mlm", "h4", hidden_act="relu")
    with pytest.raises(CheckpointError, match="hidden_act 'relu' with a masked-LM head"):
        load_roberta(tmp_path)
    assert load_roberta(tmp_path, head="none").config.activation == "relu"


def test_bad_folders(tmp_path):
    roberta_folder(tmp_path / "no-tokenizer")
    (tmp_path / "no-tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        load_roberta(tmp_path / "no-tokenizer")
    roberta_folder(tmp_path / "bert-type")
    edit_config(tmp_path / "bert-type", model_type="bert")
    with pytest.raises(CheckpointError, match="model_type is 'bert', not 'roberta'"):
        load_roberta(tmp_path / "bert-type")


def test_a_lora_run_from_a_roberta_folder_exports_what_peft_puts_on_the_base(tmp_path):
    """LoRA fine-tuning from a RoBERTa folder, its adapters written as a peft folder (`--adapter`):
    peft's PeftModel on transformers' RobertaForSequenceClassification of the same base folder gives
    the run's logits (the pooler and head travel as RoBERTa's classifier.dense and out_proj)."""
    peft = pytest.importorskip("peft")
    roberta_folder(tmp_path / "roberta", "mlm", "h4")
    out, adapter = tmp_path / "run", tmp_path / "adapter"
    args = ["train", "sst2", "--data-dir", str(SST2), "--init-from", str(tmp_path / "roberta"), "--out", str(out)]
    lora = ["--set=train.lora.rank=2", "--set=train.lora.alpha=4.0"]
    assert main([*args, *FINE_TUNE, *lora]) == 0
    assert main(["export", str(out), str(adapter), "--to", "hf", "--adapter"]) == 0
    n_labels = len(load(out).model.head.proj.bias)
    base = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "roberta", num_labels=n_labels)
    theirs = peft.PeftModel.from_pretrained(base, adapter).eval()
    ids = torch.tensor([[0, 5, 9, 14, 2], [0, 7, 7, 21, 2]])
    with torch.no_grad():
        want = load(out, merge_lora=False).model.eval()(ids)
        torch.testing.assert_close(theirs(input_ids=ids).logits, want, atol=1e-5, rtol=0)
