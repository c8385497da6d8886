"""fine_tune_config: the pre-trained encoder's shape, this run's head, dropout and pooling."""

from attnlab.models.bert import BertConfig
from attnlab.tasks.encoder import fine_tune_config


def test_fine_tune_config_keeps_the_encoder_shape_and_takes_the_run_choices():
    pretrained = BertConfig(vocab_size=300, d_model=32, n_heads=4, n_layers=3, d_ff=64, position_init="sinusoidal")
    wanted = BertConfig(
        vocab_size=99,
        d_model=16,
        n_heads=2,
        n_layers=1,
        d_ff=8,
        head="sequence",
        n_labels=2,
        dropout=0.25,
        pooling="mean",
    )
    got = fine_tune_config(pretrained, wanted)
    assert (got.vocab_size, got.d_model, got.n_heads, got.n_layers, got.d_ff) == (300, 32, 4, 3, 64)
    assert got.position_init == "sinusoidal"
    assert (got.head, got.n_labels, got.dropout, got.pooling) == ("sequence", 2, 0.25, "mean")
