"""attnlab.accel.fused: the encoder–decoder's C++ decoder step against the model's own `step`.

The reference is the eager beam search (itself tested against brute force in test_beam.py): with
`fused=True` it must return the same translations, and the fused state must give the model's
logits, to float rounding, while its rows are reordered, duplicated and dropped the way beam
search does it. The extension is built once per machine (cached by torch.utils.cpp_extension).
"""

import pytest
import torch

from attnlab.accel.fused import FusedDecoderState, extension, supports_decoder
from attnlab.decode.seq2seq import beam_search, greedy_translate
from attnlab.models.rnn import RNNConfig, build_rnn
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from tolerance import assert_float32_close, decoder_sums

pytestmark = pytest.mark.skipif(extension() is None, reason="the fused step could not be built here")

PAD, BOS, EOS = 0, 1, 2


def random_transformer(seed: int = 0, vocab: int = 13, **overrides) -> Seq2SeqTransformer:
    """A random encoder–decoder whose greedy and beam outputs wander (weights drawn wide)."""
    torch.manual_seed(seed)
    fields = dict(vocab_size=vocab, d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=48, dropout=0.0)
    model = Seq2SeqTransformer(Seq2SeqConfig(**(fields | overrides))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() > 1 else 0.2)  # biases and LayerNorm affine too
    return model


def sources(batch: int, length: int, seed: int, vocab: int = 13) -> torch.Tensor:
    """Source ids `(batch, length)` with right padding of different lengths in some rows."""
    src = torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    for row in range(1, batch, 2):
        src[row, length - row :] = PAD
    return src


@pytest.mark.parametrize(
    "overrides, batch, beam",
    [
        (dict(norm="post", activation="relu"), 1, 5),  # the paper's decoder, beam search's 5 rows
        (dict(norm="pre", activation="gelu"), 3, 3),  # 9 rows: the matrix-product route
        (dict(norm="post", activation="gelu_tanh", positions="learned", tie_embeddings=False), 4, 2),
        (dict(d_model=24, n_heads=3, positions="none"), 6, 4),  # head dim 8; 24 rows
    ],
)
def test_fused_beam_search_translates_as_the_eager_one(overrides, batch, beam):
    model = random_transformer(**overrides)
    src = sources(batch, 7, seed=batch)
    kw = dict(beam_size=beam, bos_id=BOS, eos_id=EOS, max_len_extra=6)
    eager = beam_search(model, src, **kw)
    assert beam_search(model, src, fused=True, **kw) == eager
    assert any(len(t) > 2 for t in eager)  # the comparison covers real searches, not instant <eos>
    assert greedy_translate(model, src, bos_id=BOS, eos_id=EOS, fused=True) == greedy_translate(
        model, src, bos_id=BOS, eos_id=EOS
    )


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_fused_state_gives_the_model_logits_while_rows_move(norm):
    """Duplicate rows (beams of one sentence), reorder them, drop some, add more than the caches
    hold: the fused state follows the eager one, whose caches really move."""
    model = random_transformer(3, norm=norm)
    src = sources(3, 6, seed=0)
    src[2, :] = PAD  # an empty source: its queries attend to nothing (zeros), as eagerly
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        eager = model.start(src, 12)
        fused = FusedDecoderState(model, extension(), src, 12)
        index = torch.arange(3).repeat_interleave(4)  # 12 rows, more than the 3 the caches have
        for t in range(11):
            eager.select(index)
            fused.select(index)
            tokens = torch.randint(3, 13, (index.numel(),), generator=g)
            assert_float32_close(fused.step(tokens), model.step(tokens, eager), **decoder_sums(model.config))
            rows = index.numel()
            if t in (3, 7) and rows > 2:  # a sentence's rows leave
                index = torch.randperm(rows, generator=g)[: rows - 3]
            elif t == 5:  # more rows than the caches have, after they were written: they widen
                index = torch.randint(0, rows, (rows + 5,), generator=g)
            else:  # hypotheses continue each other, some twice, some not at all
                index = torch.randint(0, rows, (rows,), generator=g)


def test_fused_state_sees_weights_changed_after_it_was_made():
    model = random_transformer(5)
    src = sources(2, 5, seed=1)
    tokens = torch.tensor([4, 5])
    with torch.inference_mode():
        fused = FusedDecoderState(model, extension(), src, 4)
        eager = model.start(src, 4)
    with torch.no_grad():
        model.decoder[0].ffn.fc2.weight.mul_(-1.0)  # in place: the row kernel reads the same storage
    with torch.inference_mode():
        assert_float32_close(fused.step(tokens), model.step(tokens, eager), **decoder_sums(model.config))


def test_a_new_search_sees_weights_changed_since_the_last():
    """Past 8 rows the products use oneDNN copies of the weights, remade when a weight changes."""
    model = random_transformer(6)
    src = sources(4, 6, seed=3)
    kw = dict(beam_size=4, bos_id=BOS, eos_id=EOS, max_len_extra=5)  # 16 rows
    before = beam_search(model, src, fused=True, **kw)
    with torch.no_grad():
        for block in model.decoder:
            block.cross_attn.in_proj.weight.mul_(-1.0)
            block.ffn.fc1.weight.mul_(-1.0)
        model.output.weight.mul_(-1.0)
    after = beam_search(model, src, fused=True, **kw)
    assert after == beam_search(model, src, **kw)
    assert after != before


def test_fused_state_refuses_a_token_outside_the_vocabulary():
    model = random_transformer(0)
    with torch.inference_mode():
        fused = FusedDecoderState(model, extension(), sources(1, 4, seed=0), 4)
        with pytest.raises(RuntimeError, match="outside the vocabulary"):
            fused.step(torch.tensor([13]))
        fused.step(torch.tensor([12]))
        fused.step(torch.tensor([12]))
        fused.step(torch.tensor([12]))
        fused.step(torch.tensor([12]))
        with pytest.raises(RuntimeError, match="outside the cache"):
            fused.step(torch.tensor([12]))


def test_models_it_does_not_cover_decode_eagerly_with_a_warning():
    torch.manual_seed(0)
    rnn = build_rnn(RNNConfig(kind="gru-attention", vocab_size=13, emb_dim=8, hidden_size=12, dropout=0.0)).eval()
    assert not supports_decoder(rnn)
    src = sources(2, 5, seed=2)
    with pytest.warns(UserWarning, match="decoding eagerly"):
        fused = beam_search(rnn, src, beam_size=3, bos_id=BOS, eos_id=EOS, fused=True)
    assert fused == beam_search(rnn, src, beam_size=3, bos_id=BOS, eos_id=EOS)
    assert not supports_decoder(random_transformer(0).train())  # dropout would be live
    assert not supports_decoder(random_transformer(0).double())


def test_under_cpu_autocast_beam_search_decodes_eagerly_in_the_precision_asked():
    """The training loop evaluates under bf16 autocast on CPUs with bf16 instructions: the encoder's
    memory then comes out in bf16, which the fp32 C++ step cannot read. The eager step runs instead."""
    model = random_transformer(3)
    src = sources(2, 6, seed=3)
    kw = dict(beam_size=3, bos_id=BOS, eos_id=EOS, max_len_extra=4)
    assert supports_decoder(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert not supports_decoder(model)
        with pytest.warns(UserWarning, match="decoding eagerly"):
            fused = beam_search(model, src, fused=True, **kw)
        assert fused == beam_search(model, src, **kw)


def test_without_onednn_the_many_row_products_take_the_matrix_product(monkeypatch):
    """Where PyTorch has no oneDNN, the state passes no reordered weights and the C++ step
    multiplies with PyTorch's matrix product instead: the same translations."""
    import attnlab.accel.fused as fused_module

    model = random_transformer(2, norm="pre")
    src = sources(4, 6, seed=5)
    kw = dict(beam_size=3, bos_id=BOS, eos_id=EOS, max_len_extra=5)  # 12 rows
    monkeypatch.setattr(fused_module, "MKLDNN", False)
    assert beam_search(model, src, fused=True, **kw) == beam_search(model, src, **kw)
