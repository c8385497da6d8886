"""Export to transformers' MarianMTModel: the same weights give the same function."""

import pytest
import torch

from attnlab.decode.seq2seq import greedy_translate
from attnlab.models.hf import marian_feature_order, to_marian
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import sinusoidal_positions

pytest.importorskip("transformers")

PAD, BOS, EOS, V = 0, 1, 2, 60


def tiny_translator(**overrides) -> Seq2SeqTransformer:
    fields = dict(vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32, dropout=0.0)
    torch.manual_seed(0)
    return Seq2SeqTransformer(Seq2SeqConfig(**(fields | overrides))).eval()


def test_feature_order_maps_attnlab_sinusoids_onto_marians_layout():
    d = 16
    ours = sinusoidal_positions(30, d)
    # Marian's table (transformers MarianSinusoidalPositionalEmbedding): all sines, then all cosines.
    pos = torch.arange(30, dtype=torch.float64)[:, None]
    freq = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    marian = torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=1).float()
    torch.testing.assert_close(ours[:, marian_feature_order(d)], marian, atol=1e-6, rtol=0)


def test_exported_marian_gives_the_same_logits_with_padding():
    model = tiny_translator(activation="gelu")
    marian = to_marian(model, bos_id=BOS, eos_id=EOS)
    g = torch.Generator().manual_seed(3)
    src = torch.randint(3, V, (3, 9), generator=g)
    src[1, 6:] = PAD
    src[2, 3:] = PAD
    tgt = torch.cat([torch.full((3, 1), BOS), torch.randint(3, V, (3, 7), generator=g)], dim=1)
    with torch.no_grad():
        ours = model(src, tgt)
        theirs = marian(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)


def test_exported_marian_decodes_the_same_greedy_translation():
    model = tiny_translator()
    marian = to_marian(model, bos_id=BOS, eos_id=EOS)
    src = torch.randint(3, V, (1, 8), generator=torch.Generator().manual_seed(4))  # seed 4: a varied output
    ours = greedy_translate(model, src, bos_id=BOS, eos_id=EOS, max_len_ratio=0.0, max_len_extra=12)[0]
    with torch.no_grad():
        out = marian.generate(src, num_beams=1, do_sample=False, max_new_tokens=12)[0].tolist()
    # Both stop at 12 tokens counting <eos>: attnlab's 11 tokens, transformers' 11 and its forced
    # <eos> (Marian's forced_eos_token_id), after its start token. The whole sequence must agree.
    assert len(ours) == 11 and len(set(ours)) > 1  # the limit was reached, and on a varied output
    assert out == [marian.config.decoder_start_token_id, *ours, EOS]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(norm="pre"), "post-norm"),
        (dict(positions="learned"), "sinusoidal"),
        (dict(tie_embeddings=False), "shared"),
    ],
)
def test_what_marian_cannot_represent_is_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        to_marian(tiny_translator(**overrides), bos_id=BOS, eos_id=EOS)
