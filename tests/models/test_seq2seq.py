import pytest
import torch

from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

V, PAD = 29, 0


def tiny(seed: int = 0, **overrides) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    fields = dict(vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=48, dropout=0.0)
    model = Seq2SeqTransformer(Seq2SeqConfig(**(fields | overrides))).eval()
    with torch.no_grad():  # larger weights than the init, so that every input visibly matters
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.4)
    return model


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (3, 8), generator=g)
    src[1, 5:] = PAD
    src[2, 2:] = PAD
    tgt_in = torch.randint(3, V, (3, 6), generator=g)
    return src, tgt_in


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_shapes_and_step_equals_teacher_forcing(norm):
    model = tiny(norm=norm)
    src, tgt_in = batch()
    logits = model(src, tgt_in)
    assert logits.shape == (3, 6, V)
    state = model.start(src, max_len=10)
    stepped = torch.stack([model.step(tgt_in[:, t], state) for t in range(6)], dim=1)
    torch.testing.assert_close(stepped, logits, atol=1e-5, rtol=1e-5)


def test_no_future_leakage_in_the_decoder():
    model = tiny().double()
    src, tgt_in = batch()
    changed = tgt_in.clone()
    changed[:, 3:] = (changed[:, 3:] + 5) % (V - 3) + 3
    a, b = model(src, tgt_in), model(src, changed)
    torch.testing.assert_close(a[:, :3], b[:, :3], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 3:], b[:, 3:], atol=1e-3)


def test_padding_is_never_attended():
    model = tiny().double()  # float64: any difference left is a leak, not rounding
    src, tgt_in = batch()
    # More padding after a sentence changes nothing:
    longer = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    torch.testing.assert_close(model(longer, tgt_in), model(src, tgt_in), atol=1e-5, rtol=1e-5)
    # and a sentence's output does not depend on its neighbours in the batch
    alone = model(src[2:3, :2], tgt_in[2:3])
    torch.testing.assert_close(alone, model(src, tgt_in)[2:3], atol=1e-5, rtol=1e-5)


def test_cross_attention_rows_sum_to_one_and_skip_padding():
    model = tiny()
    src, tgt_in = batch()
    layers = model.cross_attention_layers(src, tgt_in)
    assert len(layers) == 2 and layers[0].shape == (3, 4, 6, 8)
    align = model.cross_attention(src, tgt_in)
    assert align.shape == (3, 6, 8)
    torch.testing.assert_close(align.sum(-1), torch.ones(3, 6))
    assert torch.all(align[1, :, 5:] == 0) and torch.all(align[2, :, 2:] == 0)
    torch.testing.assert_close(align, layers[-1].mean(dim=1))


def test_tied_embeddings_share_one_matrix():
    model = tiny()
    assert model.src_embedding.weight is model.tgt_embedding.weight is model.output.weight
    untied = tiny(tie_embeddings=False)
    assert untied.src_embedding.weight is not untied.tgt_embedding.weight
    assert untied.output.weight is not untied.tgt_embedding.weight


def test_select_follows_rows():
    model = tiny()
    src, tgt_in = batch()
    full = model.start(src, 5)
    picked = model.start(src, 5)
    index = torch.tensor([2, 0, 0])
    picked.select(index)
    torch.testing.assert_close(model.step(tgt_in[:, 0], full)[index], model.step(tgt_in[index, 0], picked))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("d_model", 30, "divisible by n_heads"),
        ("dropout", 1.0, "dropout"),
        ("norm", "sandwich", "norm"),
        ("positions", "rotary", "positions"),
        ("kind", "rnn", "kind"),
        ("n_encoder_layers", 0, "n_encoder_layers"),
    ],
)
def test_config_validation_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        Seq2SeqConfig(vocab_size=V, **{field: value})


def test_sequence_longer_than_max_len_is_an_error():
    model = tiny(max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(3, V, (1, 9)), torch.randint(3, V, (1, 3)))
