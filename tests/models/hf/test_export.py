"""Export to transformers folders: each family's checkpoint, loaded by transformers' own
`from_pretrained` (the independent reference), computes attnlab's logits, and attnlab's importer
reads it back to the same model. Parts transformers lacks are refused by name."""

import dataclasses
import json

import pytest
import torch

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer, load_tokenizer
from attnlab.errors import ExportError, UserError
from attnlab.models.bert import Bert, BertConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.hf import (
    bert_config_from_hf,
    gpt2_config_from_hf,
    llama_config_from_hf,
    load_bert,
    load_causal_lm,
    load_gpt2,
    load_llama,
)
from attnlab.models.hf._common import save_hf_checkpoint
from attnlab.models.hf.auto import causal_lm_export
from attnlab.models.hf.bert import bert_config_to_hf, bert_export
from attnlab.models.hf.gpt2 import gpt2_config_to_hf
from attnlab.models.hf.llama import llama_config_to_hf
from attnlab.models.hf.marian import load_marian, marian_config_from_hf, marian_config_to_hf, marian_export
from attnlab.models.hf.tokenizer_export import tokenizer_files
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

transformers = pytest.importorskip("transformers")

V = 48
ATOL = 1e-4
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak."


def gpt(**overrides) -> GPT:
    fields = dict(vocab_size=V, block_size=16, n_layers=2, n_heads=2, d_model=16, dropout=0.0)
    torch.manual_seed(0)
    return GPT(GPTConfig(**(fields | overrides))).eval()


LLAMA_PARTS = dict(positions="rope", normalization="rmsnorm", activation="swiglu", bias=False)


def exported(checkpoint, folder):
    save_hf_checkpoint(checkpoint, folder)
    return folder


def ids(shape=(2, 12), high=V, seed=1) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


# -- GPT-2 and Llama --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # attnlab's default GELU (erf), tied
        dict(activation="gelu_tanh", tie_weights=False),
        dict(activation="relu", ffn_mult=2, layer_norm_eps=1e-6),
        dict(bias=False),  # nanoGPT's choice (and the shakespeare-char preset's): zero biases in GPT-2
        dict(ffn_hidden=50),  # a width that is no multiple of d_model: GPT-2's n_inner takes any
        LLAMA_PARTS,
        LLAMA_PARTS | dict(n_heads=4, n_kv_heads=2, d_model=32, tie_weights=False, rope_theta=500.0),
    ],
)
def test_causal_lm_gives_the_same_logits_in_transformers_and_back(tmp_path, overrides):
    model = gpt(**overrides)
    folder = exported(causal_lm_export(model), tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    expected = "LlamaForCausalLM" if overrides.get("positions") == "rope" else "GPT2LMHeadModel"
    assert type(theirs).__name__ == expected
    x = ids()
    with torch.no_grad():
        ours = model(x)
        torch.testing.assert_close(theirs(x).logits, ours, atol=ATOL, rtol=0)
        back = (load_llama if expected == "LlamaForCausalLM" else load_gpt2)(folder)
        torch.testing.assert_close(back(x), ours, atol=ATOL, rtol=0)
    assert back.config.tie_weights == model.config.tie_weights and back.config.d_ff == model.config.d_ff


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_gpt2_config_round_trip(activation):
    config = gpt(activation=activation, ffn_mult=3, layer_norm_eps=1e-6, dropout=0.1).config
    assert gpt2_config_from_hf(gpt2_config_to_hf(config)) == config


def test_llama_config_round_trip():
    config = gpt(**LLAMA_PARTS, n_heads=4, n_kv_heads=1, d_model=32, rope_theta=123.0, layer_norm_eps=1e-6).config
    # The importer names the feed-forward width exactly (ffn_hidden); attnlab derived it from ffn_mult.
    assert llama_config_from_hf(llama_config_to_hf(config)) == dataclasses.replace(config, ffn_hidden=config.d_ff)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (dict(positions="alibi"), "positions = 'alibi' (GPT-2 has learned position embeddings)"),
        (dict(positions="relative"), "positions = 'relative'"),
        (dict(positions="sinusoidal"), "positions = 'sinusoidal'"),
        (dict(normalization="rezero"), "normalization = 'rezero'"),
        (dict(experts=4), "experts = 4"),
        (dict(attention="window", attention_window=4), "attention = 'window'"),
        (dict(block_sharing="all"), "block_sharing = 'all'"),
        (dict(embedding_dim=8), "embedding_dim = 8"),
        (dict(memory_keys=4, memory_top_k=2), "memory_keys = 4"),
        (dict(branched_attention=True), "branched_attention = True"),
        (dict(norm="post"), "norm = 'post'"),
        (dict(activation="swiglu"), "activation = 'swiglu'"),
        (LLAMA_PARTS | dict(positions="alibi"), "cannot export to transformers Llama: positions = 'alibi'"),
        (LLAMA_PARTS | dict(experts=2), "Llama: experts = 2"),
    ],
)
def test_a_part_transformers_lacks_is_refused_by_name(overrides, named):
    with pytest.raises(ExportError, match="cannot export to transformers") as info:
        causal_lm_export(gpt(**overrides))
    message = str(info.value)
    assert named in message and "\n" not in message
    assert isinstance(info.value, UserError)


# -- BERT -------------------------------------------------------------------------------------------

BERT_CLASSES = {
    "mlm": "AutoModelForMaskedLM",
    "sequence": "AutoModelForSequenceClassification",
    "token": "AutoModelForTokenClassification",
    "none": "AutoModel",
}


def bert(head: str = "mlm", n_labels: int = 0, **overrides) -> Bert:
    fields = dict(vocab_size=V, max_len=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0)
    torch.manual_seed(0)
    return Bert(BertConfig(head=head, n_labels=n_labels, **(fields | overrides))).eval()


@pytest.mark.parametrize(("head", "n_labels"), [("mlm", 0), ("sequence", 3), ("token", 5), ("none", 0)])
def test_bert_gives_the_same_outputs_in_transformers_and_back(tmp_path, head, n_labels):
    model = bert(head, n_labels, activation="gelu_tanh")
    labels = [f"tag{i}" for i in range(n_labels)] if n_labels else None
    folder = exported(bert_export(model, labels), tmp_path)
    WordPieceTokenizer.train([TEXT] * 4, V).save(folder / "tokenizer.json")
    theirs = getattr(transformers, BERT_CLASSES[head]).from_pretrained(folder, local_files_only=True).eval()
    x = ids(high=V)
    x[:, 0] = 2  # [CLS] first, as the tasks build inputs
    x[1, 8:] = model.config.pad_id  # a padded row: attnlab masks by id, transformers by attention_mask
    with torch.no_grad():
        ours = model(x)
        out = theirs(input_ids=x, attention_mask=(x != model.config.pad_id).long())
        theirs_out = out.last_hidden_state if head == "none" else out.logits
        torch.testing.assert_close(theirs_out, ours, atol=ATOL, rtol=0)
        back = load_bert(folder)
        torch.testing.assert_close(back.model(x), ours, atol=ATOL, rtol=0)
    assert back.config.head == head and back.labels == (labels or [])
    if head == "none":
        torch.testing.assert_close(out.pooler_output, model.pooled(x), atol=ATOL, rtol=0)


def test_bert_config_round_trip():
    config = bert("sequence", 4, activation="relu", layer_norm_eps=1e-6, dropout=0.2, pad_id=3).config
    hf = json.loads(json.dumps(bert_config_to_hf(config)))  # as config.json holds it
    assert bert_config_from_hf(hf, head="sequence", n_labels=4, pad_id=3) == config


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (dict(positions="relative"), "positions = 'relative' (BERT has learned absolute positions)"),
        (dict(norm="pre"), "norm = 'pre'"),
        (dict(normalization="rmsnorm"), "normalization = 'rmsnorm'"),
        (dict(head="sequence", n_labels=2, pooling="mean"), "pooling = 'mean'"),
        (dict(block_sharing="universal"), "block_sharing = 'universal'"),
    ],
)
def test_bert_parts_transformers_lacks_are_refused_by_name(overrides, named):
    with pytest.raises(ExportError, match=named.replace("(", r"\(").replace(")", r"\)")):
        bert_export(bert(**overrides))


def test_a_classifier_checkpoint_of_unknown_class_needs_its_head_named(tmp_path):
    folder = exported(bert_export(bert("token", 3)), tmp_path)
    WordPieceTokenizer.train([TEXT] * 4, V).save(folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["SomethingElse"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="pass head='sequence' or head='token'"):
        load_bert(folder)
    assert load_bert(folder, head="token").config.n_labels == 3


# -- MarianMT ---------------------------------------------------------------------------------------

PAD, BOS, EOS = 0, 1, 2


def translator(**overrides) -> Seq2SeqTransformer:
    fields = dict(vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=1, d_ff=32, dropout=0.0)
    torch.manual_seed(0)
    return Seq2SeqTransformer(Seq2SeqConfig(**(fields | overrides))).eval()


def test_marian_folder_gives_the_same_logits_in_transformers_and_back(tmp_path):
    model = translator(activation="gelu")
    folder = exported(marian_export(model, bos_id=BOS, eos_id=EOS), tmp_path)
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True).eval()
    assert type(theirs).__name__ == "MarianMTModel"
    src = ids((3, 9), seed=3).clamp(min=3)
    src[1, 6:] = PAD
    tgt = torch.cat([torch.full((3, 1), BOS), ids((3, 6), seed=4).clamp(min=3)], dim=1)
    with torch.no_grad():
        ours = model(src, tgt)
        out = theirs(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt).logits
        torch.testing.assert_close(out, ours, atol=ATOL, rtol=0)
        back = load_marian(folder)
        torch.testing.assert_close(back(src, tgt), ours, atol=ATOL, rtol=0)
    assert back.config == model.config


def test_marian_config_round_trip():
    config = translator(activation="relu", dropout=0.1, pad_id=5, max_len=40).config
    assert marian_config_from_hf(marian_config_to_hf(config, bos_id=BOS, eos_id=EOS)) == config


def test_marian_refuses_what_it_cannot_represent_by_name():
    with pytest.raises(ExportError, match=r"norm = 'pre' \(MarianMT has post-norm\); positions = 'rope'"):
        marian_export(translator(norm="pre", positions="rope"), bos_id=BOS, eos_id=EOS)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (dict(funnel_stages=(1, 1)), "funnel_stages = (1, 1)"),
        (dict(transparent_attention=True), "transparent_attention = True"),
    ],
)
def test_marian_refuses_a_funnel_encoder_and_transparent_attention(overrides, named):
    with pytest.raises(ExportError, match="MarianMT") as info:
        marian_export(translator(**overrides), bos_id=BOS, eos_id=EOS)
    assert named in str(info.value)


# -- tokenizers -------------------------------------------------------------------------------------


def written(files: dict[str, str], folder):
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_char_tokenizer_encodes_and_decodes_as_attnlab(tmp_path):
    ours = CharTokenizer.train(TEXT)
    folder = written(tokenizer_files(ours, max_length=16), tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    sample = "Before we speak,\nhear me."
    assert theirs(sample)["input_ids"] == ours.encode(sample)
    assert theirs.decode(ours.encode(sample)) == sample
    # attnlab reads the file back (as GPT-2 folders' tokenizers are read: a BPE file) with the same ids.
    assert load_tokenizer(folder / "tokenizer.json").encode(sample) == ours.encode(sample)


def test_byte_bpe_tokenizer_keeps_its_special_tokens(tmp_path):
    ours = BPETokenizer.train([TEXT] * 3, 300, special_tokens=("<pad>", "<bos>", "<eos>"))
    folder = written(tokenizer_files(ours, max_length=16), tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert theirs(TEXT)["input_ids"] == ours.encode(TEXT)
    assert (theirs.pad_token_id, theirs.bos_token_id, theirs.eos_token_id) == (PAD, BOS, EOS)


@pytest.mark.parametrize("algorithm", ["wordpiece", "bpe"])
def test_wordpiece_tokenizer_adds_cls_and_sep_as_bert_does(tmp_path, algorithm):
    ours = WordPieceTokenizer.train([TEXT] * 3, 80, algorithm=algorithm)
    folder = written(tokenizer_files(ours, max_length=16), tmp_path)
    assert (folder / "vocab.txt").exists() == (algorithm == "wordpiece")
    theirs = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    sample = "Before we PROCEED, hear me."
    assert theirs(sample)["input_ids"] == [ours.cls_id, *ours.encode(sample), ours.sep_id]
    assert (theirs.pad_token_id, theirs.mask_token_id) == (ours.pad_id, ours.mask_id)
    assert load_tokenizer(folder / "tokenizer.json").encode(sample) == ours.encode(sample)


def test_a_gpt2_folder_with_its_char_tokenizer_loads_as_a_causal_lm(tmp_path):
    ours = CharTokenizer.train(TEXT)
    model = gpt(vocab_size=ours.vocab_size)
    checkpoint = causal_lm_export(model)
    checkpoint.config |= {"bos_token_id": None, "eos_token_id": None}
    folder = written(tokenizer_files(ours, max_length=16), exported(checkpoint, tmp_path))
    loaded = load_causal_lm(folder)
    x = torch.tensor([ours.encode("hear me")])
    assert loaded.tokenizer.encode("hear me") == x[0].tolist()
    torch.testing.assert_close(loaded.model(x), model(x), atol=ATOL, rtol=0)
