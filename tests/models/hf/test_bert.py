"""attnlab.models.hf.load_bert: BERT checkpoints saved by transformers give HF's exact outputs.

The reference is transformers itself: a tiny randomly initialised BERT is saved to a temp folder
(nothing is downloaded) beside a small vocab.txt, loaded back with `load_bert`, and both models
encode the same padded batch.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from attnlab.data.tokenizers import WordPieceTokenizer
from attnlab.errors import CheckpointError, UserError
from attnlab.models.hf import bert_config_from_hf, load_bert

transformers = pytest.importorskip("transformers")

VOCAB = 99
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
    pad_token_id=0,
)
VOCAB_TXT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "."]


def hf_bert(kind: str = "model", seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random HF BERT in eval mode, with LayerNorms and biases moved off their 1/0 init and
    q, k scaled up so that attention is far from uniform (a q/k/v or head mix-up shows)."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(**{**TINY, **overrides})
    classes = {
        "model": transformers.BertModel,
        "mlm": transformers.BertForMaskedLM,
        "pretraining": transformers.BertForPreTraining,
    }
    model = classes[kind](config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            if name.endswith(("attention.self.query.weight", "attention.self.key.weight")):
                p.mul_(5.0)
    return model


def saved(model: torch.nn.Module, folder, *, vocab: list[str] = VOCAB_TXT):
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return folder


def edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """ids `(2, 11)`: a full row and a row of 6 real tokens then padding; segment ids for both."""
    ids = torch.randint(1, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    ids[1, 6:] = 0
    segments = torch.zeros_like(ids)
    segments[0, 5:] = 1
    segments[1, 3:6] = 1
    return ids, segments


def real(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return x[ids != 0]  # (N, ...) the unpadded positions


def test_base_model_matches_hf(tmp_path):
    hf = hf_bert()
    folder = saved(hf, tmp_path)
    assert not any(k.startswith("bert.") for k in load_file(folder / "model.safetensors"))
    loaded = load_bert(folder)
    model = loaded.model
    assert not model.training
    assert loaded.config.head == "none" and model.head is None and loaded.missing == []
    assert loaded.config.activation == "gelu" and loaded.config.d_ff == 37 and loaded.config.max_len == 64
    assert isinstance(loaded.tokenizer, WordPieceTokenizer) and loaded.tokenizer.vocab_size == len(VOCAB_TXT)

    ids, segments = padded_batch()
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=segments, attention_mask=(ids != 0).long())
        ours = model.encode(ids, segments)
        pooled = model.pooled(ids, segments)
    torch.testing.assert_close(real(ours, ids), real(theirs.last_hidden_state, ids), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pooled, theirs.pooler_output, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, segments), ours)  # head "none": forward is encode


def test_masked_lm_matches_hf(tmp_path):
    hf = hf_bert("mlm")
    folder = saved(hf, tmp_path)
    assert any(k.startswith("bert.") for k in load_file(folder / "model.safetensors"))
    loaded = load_bert(folder)
    model = loaded.model
    assert loaded.config.head == "mlm"
    assert model.head.decoder.weight is model.embeddings.token.weight
    # transformers builds BertForMaskedLM without a pooler: ours keeps its fresh initialisation.
    assert loaded.missing == ["pooler.weight", "pooler.bias"]

    ids, segments = padded_batch()
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=segments, attention_mask=(ids != 0).long()).logits
        ours = model(ids, segments)
    assert ours.shape == (2, 11, VOCAB)
    torch.testing.assert_close(real(ours, ids), real(theirs, ids), atol=1e-4, rtol=1e-4)


def test_masked_lm_checkpoint_without_its_head(tmp_path):
    hf = hf_bert("mlm")
    loaded = load_bert(saved(hf, tmp_path), head="none")
    assert loaded.model.head is None
    ids, segments = padded_batch()
    with torch.no_grad():
        theirs = hf.bert(input_ids=ids, token_type_ids=segments, attention_mask=(ids != 0).long())
        ours = loaded.model.encode(ids, segments)
    torch.testing.assert_close(real(ours, ids), real(theirs.last_hidden_state, ids), atol=1e-4, rtol=1e-4)


def test_pretraining_checkpoint_pytorch_bin_with_legacy_names(tmp_path):
    # The layout of the original bert-base .bin files: "bert." prefix, LayerNorm gamma / beta, the
    # decoder stored beside the word embeddings, position_ids buffer, the next-sentence head.
    # transformers 5 always writes safetensors, so the state dict is saved by hand.
    hf = hf_bert("pretraining", hidden_act="gelu_new")
    state = {}
    for key, value in hf.state_dict().items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[key] = value.clone()
    state["bert.embeddings.position_ids"] = torch.arange(64).unsqueeze(0)
    assert "cls.predictions.decoder.weight" in state and "cls.seq_relationship.weight" in state
    hf.config.save_pretrained(tmp_path)
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB_TXT) + "\n", encoding="utf-8")

    loaded = load_bert(tmp_path)
    assert loaded.config.head == "mlm" and loaded.config.activation == "gelu_tanh" and loaded.missing == []
    ids, segments = padded_batch()
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=segments, attention_mask=(ids != 0).long())
        ours = loaded.model(ids, segments)
        pooled = loaded.model.pooled(ids, segments)
    torch.testing.assert_close(real(ours, ids), real(theirs.prediction_logits, ids), atol=1e-4, rtol=1e-4)
    pooled_theirs = hf.bert(input_ids=ids, token_type_ids=segments, attention_mask=(ids != 0).long()).pooler_output
    torch.testing.assert_close(pooled, pooled_theirs, atol=1e-4, rtol=1e-4)


def test_tokenizer_from_vocab_txt_and_lowercase(tmp_path):
    folder = saved(hf_bert(), tmp_path)
    tok = load_bert(folder).tokenizer
    assert tok.encode("The cats sat.") == [5, 6, 10, 7, 11]
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert load_bert(folder).tokenizer.encode("The cats") == [1, 6, 10]  # "The" is not in the vocabulary


def test_tokenizer_json_is_preferred(tmp_path):
    folder = saved(hf_bert(), tmp_path)
    WordPieceTokenizer.from_vocab_txt(folder / "vocab.txt").save(folder / "tokenizer.json")
    (folder / "vocab.txt").unlink()
    assert load_bert(folder).tokenizer.encode("the mats") == [5, 9, 10]


def test_dtype(tmp_path):
    model = load_bert(saved(hf_bert("mlm"), tmp_path), dtype=torch.float64).model
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.head.decoder.weight is model.embeddings.token.weight


def test_config_from_dict():
    config = bert_config_from_hf({"model_type": "bert"})  # transformers' defaults: bert-base
    shape = (config.vocab_size, config.d_model, config.n_layers, config.n_heads, config.d_ff)
    assert shape == (30522, 768, 12, 12, 3072)
    assert (config.max_len, config.layer_norm_eps, config.dropout, config.pad_id) == (512, 1e-12, 0.1, 0)
    assert bert_config_from_hf({"architectures": ["BertForMaskedLM"]}, head="mlm").head == "mlm"
    differing = {"model_type": "bert", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.2}
    assert bert_config_from_hf(differing, dropout=0.0).dropout == 0.0
    with pytest.raises(CheckpointError, match="dropout"):
        bert_config_from_hf(differing)
    with pytest.raises(CheckpointError, match="'roberta'"):
        bert_config_from_hf({"model_type": "roberta"})
    with pytest.raises(CheckpointError, match="pad_token_id=0"):
        bert_config_from_hf({"model_type": "bert"}, pad_id=3)


def check_error(excinfo: pytest.ExceptionInfo, *needles: str) -> None:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, UserError)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_missing_config(tmp_path):
    folder = saved(hf_bert(), tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError) as e:
        load_bert(folder)
    check_error(e, "config.json", "not found")


def test_missing_weights(tmp_path):
    folder = saved(hf_bert(), tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        load_bert(folder)
    check_error(e, "no weights", "model.safetensors", "pytorch_model.bin")


def test_missing_tokenizer(tmp_path):
    folder = saved(hf_bert(), tmp_path)
    (folder / "vocab.txt").unlink()
    with pytest.raises(CheckpointError) as e:
        load_bert(folder)
    check_error(e, "tokenizer.json", "vocab.txt")


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_bert(tmp_path / "nope")
    check_error(e, "nope", "does not exist")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("position_embedding_type", "relative_key", '"relative_key"'),
        ("hidden_act", "swish", "'swish'"),
        ("is_decoder", True, "true"),
        ("add_cross_attention", True, "true"),
    ],
)
def test_unsupported_config(tmp_path, key, value, needle):
    folder = saved(hf_bert(), tmp_path)
    edit_config(folder, **{key: value})
    with pytest.raises(CheckpointError) as e:
        load_bert(folder)
    check_error(e, "config.json", key, needle)


def test_missing_tensor(tmp_path):
    hf = hf_bert()
    hf.config.save_pretrained(tmp_path)
    state = {k: v for k, v in hf.state_dict().items() if k != "encoder.layer.1.attention.self.value.bias"}
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB_TXT), encoding="utf-8")
    with pytest.raises(CheckpointError) as e:
        load_bert(tmp_path)
    check_error(e, "pytorch_model.bin", "encoder.layer.1.attention.self.value.bias", "missing")


def test_shape_mismatch(tmp_path):
    folder = saved(hf_bert(), tmp_path)
    edit_config(folder, intermediate_size=36)
    with pytest.raises(CheckpointError) as e:
        load_bert(folder)
    check_error(e, "model.safetensors", "intermediate.dense.weight", "(37, 32)", "(36, 32)")


def test_unexpected_tensor(tmp_path):
    folder = saved(hf_bert(), tmp_path)
    edit_config(folder, num_hidden_layers=1)
    with pytest.raises(CheckpointError) as e:
        load_bert(folder)
    check_error(e, "unexpected tensor encoder.layer.1.")


def test_head_mlm_requires_the_head(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_bert(saved(hf_bert(), tmp_path), head="mlm")
    check_error(e, "cls.predictions")


def test_vocabulary_larger_than_the_model(tmp_path):
    folder = saved(hf_bert(), tmp_path, vocab=VOCAB_TXT + [f"w{i}" for i in range(VOCAB)])
    with pytest.raises(CheckpointError) as e:
        load_bert(folder)
    check_error(e, "vocab_size=99")
