"""The BiLSTM baseline on tiny CPU configs: shapes, padding invariance, both directions, config
validation, and learning a toy classification task."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.models.bilstm import BiLSTM, BiLSTMConfig, padded_lengths

V, PAD = 12, 0


def tiny_model(head: str = "sequence", seed: int = 0, **overrides) -> BiLSTM:
    torch.manual_seed(seed)
    fields = dict(vocab_size=V, d_embed=8, hidden=6, n_layers=2, dropout=0.0, head=head, n_labels=3)
    return BiLSTM(BiLSTMConfig(**(fields | overrides))).eval()


def right_padded(rows: list[list[int]], width: int | None = None) -> torch.Tensor:
    width = max(len(r) for r in rows) if width is None else width
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


ROWS = [[3, 7, 1, 9, 4], [5, 2], [8, 8, 11]]


@pytest.mark.parametrize("head, shape", [("sequence", (3, 3)), ("token", (3, 5, 3))])
def test_output_shapes(head: str, shape: tuple[int, ...]):
    model = tiny_model(head)
    ids = right_padded(ROWS)
    assert model(ids).shape == shape
    states = model.encode(ids, segments=torch.zeros_like(ids))  # segments are accepted and ignored
    assert states.shape == (3, 5, 2 * 6)
    assert torch.equal(states, model.encode(ids))
    assert bool((states[1, 2:] == 0).all())  # padding positions hold zeros


def test_padding_is_zero_embedding():
    model = tiny_model()
    assert bool((model.embedding.weight[PAD] == 0).all())


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_padding_does_not_change_real_positions(head: str):
    model = tiny_model(head)
    with torch.no_grad():
        alone = [model(torch.tensor([row])) for row in ROWS]
        extra_pads = model(right_padded(ROWS, width=9))
        batched = model(right_padded(ROWS))
    for b, row in enumerate(ROWS):
        if head == "sequence":
            torch.testing.assert_close(extra_pads[b], alone[b][0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batched[b], alone[b][0], atol=1e-5, rtol=0)
        else:
            n = len(row)
            torch.testing.assert_close(extra_pads[b, :n], alone[b][0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batched[b, :n], alone[b][0], atol=1e-5, rtol=0)


def test_both_directions_reach_every_position():
    """Position 0 sees the last token (backward LSTM); the last position sees the first (forward)."""
    model = tiny_model("token")
    a = torch.tensor([[3, 7, 1, 9, 4]])
    last_changed = torch.tensor([[3, 7, 1, 9, 5]])
    first_changed = torch.tensor([[2, 7, 1, 9, 4]])
    with torch.no_grad():
        base = model(a)
        assert not torch.allclose(model(last_changed)[0, 0], base[0, 0])
        assert not torch.allclose(model(first_changed)[0, -1], base[0, -1])


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_an_all_padding_row_does_not_crash(head: str):
    model = tiny_model(head)
    out = model(right_padded([[3, 4], []]))
    assert bool(torch.isfinite(out).all())


def test_left_padding_is_rejected():
    with pytest.raises(ValueError, match="right-padded"):
        tiny_model()(torch.tensor([[0, 3, 4]]))
    assert padded_lengths(right_padded([[3, 4, 5], [6], []]), PAD).tolist() == [3, 1, 0]


def test_dropout_is_active_in_training_only():
    model = tiny_model(dropout=0.5)
    ids = right_padded(ROWS)
    with torch.no_grad():
        assert torch.equal(model(ids), model(ids))
        model.train()
        assert not torch.equal(model(ids), model(ids))


def test_learns_whether_a_token_occurs():
    """Label 1 iff token 5 is in the sentence: max-pooling over time makes this easy to fit."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(64):
        n = int(torch.randint(3, 9, (1,), generator=g))
        rows.append(torch.randint(1, V, (n,), generator=g).tolist())
    ids = right_padded(rows)
    labels = torch.tensor([int(5 in row) for row in rows])
    assert 0.25 < labels.float().mean() < 0.75  # both classes are well represented

    model = tiny_model("sequence", d_embed=16, hidden=16, n_layers=1, n_labels=2).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = F.cross_entropy(model(ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if bool((model(ids).argmax(-1) == labels).all()):
            break
    model.eval()
    with torch.no_grad():
        assert bool((model(ids).argmax(-1) == labels).all())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(kind="lstm"), "kind must be 'bilstm'"),
        (dict(head="pooled"), "head must be one of"),
        (dict(vocab_size=0), "vocab_size must be >= 1"),
        (dict(d_embed=0), "d_embed must be >= 1"),
        (dict(hidden=0), "hidden must be >= 1"),
        (dict(n_layers=0), "n_layers must be >= 1"),
        (dict(n_labels=0), "n_labels must be >= 1"),
        (dict(dropout=1.0), "dropout must be in"),
        (dict(dropout=-0.1), "dropout must be in"),
        (dict(pad_id=8000), "pad_id must be in"),
        (dict(pad_id=-1), "pad_id must be in"),
    ],
)
def test_config_validation(overrides: dict, message: str):
    with pytest.raises(ValueError, match=message):
        BiLSTMConfig(**overrides)


def test_config_is_frozen_with_the_documented_defaults():
    config = BiLSTMConfig()
    assert (config.kind, config.head, config.hidden, config.n_layers) == ("bilstm", "sequence", 256, 2)
    with pytest.raises(AttributeError):
        config.hidden = 3  # type: ignore[misc]
