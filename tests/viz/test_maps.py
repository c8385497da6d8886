"""Attention maps of real tiny runs: the weights drawn are the model's, in every family.

GPT's first layer is recomputed here from its parameters with the formula of the paper (an
independent reference); the other layers and families are checked against the models' own
weight-returning methods, on the decoding the library does (beam search), redone here.
"""

import math

import numpy as np
import pytest
import torch

import attnlab
from attnlab.decode.seq2seq import beam_search
from attnlab.errors import UserError
from attnlab.viz.maps import AttentionMaps, attention_maps
from helpers import shared

TEXT = "ROMEO: Is it so?"
GERMAN = "Ein Mann schläft."


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return attnlab.load(shared(tmp_path_factory, "lm"))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return attnlab.load(shared(tmp_path_factory, "mlm"))


@pytest.fixture(scope="module", params=["transformer", "rnn-attention"])
def mt(request, tmp_path_factory):
    return attnlab.load(shared(tmp_path_factory, f"mt-{request.param}"))


def assert_rows_are_distributions(maps: AttentionMaps) -> None:
    for w in maps.weights:
        assert w.dtype == np.float32 and w.shape == (maps.n_heads, len(maps.query_tokens), len(maps.key_tokens))
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)


def manual_first_layer(model, ids: list[int]) -> np.ndarray:
    """softmax(q kᵀ / √D + look-ahead mask) of GPT's first block, written out from its parameters."""
    c = model.config
    idx = torch.tensor(ids)
    with torch.no_grad():
        x = model.token_embedding.weight[idx] + model.positions(torch.arange(len(ids)))  # (T, C)
        block = model.blocks[0]
        h = torch.nn.functional.layer_norm(x, (c.d_model,), block.norm1.weight, block.norm1.bias, c.layer_norm_eps)
        q, k, _ = (h @ block.attn.in_proj.weight.T + block.attn.in_proj.bias).split(c.d_model, dim=-1)
        t, d = len(ids), c.d_model // c.n_heads
        q, k = (m.view(t, c.n_heads, d).transpose(0, 1) for m in (q, k))  # (H, T, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        return torch.softmax(scores.masked_fill(future, -math.inf), dim=-1).numpy()


def test_gpt_maps_are_causal_and_match_the_formula(lm):
    maps = attention_maps(lm, TEXT)
    ids = lm.tokenizer.encode(TEXT)
    assert maps.query_tokens == maps.key_tokens == list(TEXT)  # one character per token
    assert maps.causal and not maps.cross and maps.n_layers == 2 and maps.n_heads == 2
    assert_rows_are_distributions(maps)
    upper = np.triu_indices(len(ids), k=1)
    for w in maps.weights:
        assert (w[:, upper[0], upper[1]] == 0).all()  # exactly 0: no query sees a later token
    np.testing.assert_allclose(maps.weights[0], manual_first_layer(lm.model, ids), atol=1e-6)
    returned = lm.model.attention_weights(torch.tensor([ids]))
    for w, r in zip(maps.weights, returned, strict=True):
        np.testing.assert_array_equal(w, r[0].numpy())


def test_bert_maps_are_bidirectional_over_cls_and_sep(bert):
    text = "the film was good ."
    maps = attention_maps(bert, text)
    tok = bert.tokenizer
    assert maps.key_tokens[0] == "[CLS]" and maps.key_tokens[-1] == "[SEP]"
    assert maps.key_tokens[1:-1] == tok.token_texts(tok.encode(text))
    assert not maps.causal
    assert_rows_are_distributions(maps)
    ids = torch.tensor([[tok.cls_id, *tok.encode(text), tok.sep_id]])
    for w, r in zip(maps.weights, bert.model.attention_weights(ids), strict=True):
        np.testing.assert_array_equal(w, r[0].numpy())
    upper = np.triu_indices(len(maps.key_tokens), k=1)
    assert all((w[:, upper[0], upper[1]] > 0).all() for w in maps.weights)  # every token sees the later ones


def test_translation_maps_align_the_beam_translation_with_the_source(mt):
    maps = attention_maps(mt, GERMAN, beam=2)
    tok = mt.tokenizer
    src_ids = tok.encode(GERMAN)
    (target,) = beam_search(mt.model, torch.tensor([src_ids]), beam_size=2, bos_id=tok.bos_id, eos_id=tok.eos_id)
    assert maps.cross and maps.kind == "decoder cross-attention"
    assert maps.key_tokens == tok.token_texts(src_ids)
    assert maps.query_tokens == [*tok.token_texts(target), "</s>"]
    assert maps.output == tok.decode(target, skip_special=True).strip()
    assert_rows_are_distributions(maps)
    tgt_in = torch.tensor([[tok.bos_id, *target]])
    if hasattr(mt.model, "cross_attention_layers"):
        expected = [w[0].numpy() for w in mt.model.cross_attention_layers(torch.tensor([src_ids]), tgt_in)]
    else:  # the RNN's additive attention: one layer, one head
        with torch.no_grad():
            expected = [mt.model.cross_attention(torch.tensor([src_ids]), tgt_in).numpy()]
        assert maps.n_layers == maps.n_heads == 1
    for w, e in zip(maps.weights, expected, strict=True):
        np.testing.assert_array_equal(w, e)


def test_translation_encoder_self_attention(tmp_path_factory):
    mt = attnlab.load(shared(tmp_path_factory, "mt-transformer"))
    maps = attention_maps(mt, GERMAN, kind="self")
    src = torch.tensor([mt.tokenizer.encode(GERMAN)])
    assert maps.kind == "encoder self-attention" and maps.query_tokens == maps.key_tokens
    assert_rows_are_distributions(maps)
    assert maps.n_layers == mt.model.config.n_encoder_layers
    with torch.no_grad():  # the first encoder layer by hand: the block's own attention on the embedded source
        x = mt.model._embed(src, mt.model.src_embedding)
        block = mt.model.encoder[0]
        _, first = block.attn(block.norm1(x) if block.pre_norm else x, need_weights=True)
    np.testing.assert_allclose(maps.weights[0], first[0].numpy(), atol=1e-6)


def test_layer_and_head_out_of_range_name_the_valid_range(lm):
    maps = attention_maps(lm, TEXT)
    maps.check(1, 1)
    with pytest.raises(UserError, match=r"--layer 2 is out of range.*2 layer\(s\), 0 to 1"):
        maps.check(2, None)
    with pytest.raises(UserError, match=r"--head 5 is out of range.*2 head\(s\) per layer, 0 to 1"):
        maps.check(0, 5)


def test_bad_texts_and_kinds_are_user_errors(lm, bert, tmp_path_factory):
    with pytest.raises(UserError, match="empty"):
        attention_maps(lm, "  ")
    with pytest.raises(UserError, match="at most 16"):
        attention_maps(lm, "a" * 17)
    with pytest.raises(UserError, match="self-attention only"):
        attention_maps(bert, "the film", kind="cross")
    with pytest.raises(UserError, match="unknown attention kind"):
        attention_maps(lm, TEXT, kind="decoder")
    rnn = attnlab.load(shared(tmp_path_factory, "mt-rnn-attention"))
    with pytest.raises(UserError, match="no self-attention"):
        attention_maps(rnn, GERMAN, kind="self")
    bilstm = attnlab.load(shared(tmp_path_factory, "sst2-bilstm"))
    with pytest.raises(UserError, match="has no attention"):
        attention_maps(bilstm, "a fine film")
