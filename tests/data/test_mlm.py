"""BERT's masked-LM corruption: the 15% / 80-10-10 statistics, special tokens, labels, determinism."""

import pytest
import torch

from attnlab.data.mlm import IGNORE_INDEX, mask_tokens

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = [PAD, CLS, SEP, MASK]  # UNK may be chosen, as in BERT
V = 1000


def batch(n_rows: int, width: int, vocab_size: int = V, seed: int = 0) -> torch.Tensor:
    """Rows "[CLS] w_1 ... w_n [SEP] [PAD] ...", n varying, words uniform over the non-special ids."""
    g = torch.Generator().manual_seed(seed)
    words = torch.tensor([i for i in range(vocab_size) if i not in SPECIAL])
    ids = torch.full((n_rows, width), PAD)
    lengths = torch.randint(width // 2, width - 1, (n_rows,), generator=g)
    for b, n in enumerate(lengths.tolist()):
        ids[b, 0] = CLS
        ids[b, 1 : n + 1] = words[torch.randint(len(words), (n,), generator=g)]
        ids[b, n + 1] = SEP
    return ids


def corrupt(ids: torch.Tensor, seed: int = 0, vocab_size: int = V, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return mask_tokens(ids, mask_id=MASK, vocab_size=vocab_size, special_ids=SPECIAL, generator=g, **kwargs)


def test_bert_proportions_on_a_large_sample():
    ids = batch(400, 512)
    inputs, labels = corrupt(ids)
    special = torch.isin(ids, torch.tensor(SPECIAL))
    chosen = labels != IGNORE_INDEX
    n_chosen = int(chosen.sum())
    assert n_chosen / int((~special).sum()) == pytest.approx(0.15, abs=0.005)

    masked = chosen & (inputs == MASK)
    changed = chosen & (inputs != ids) & (inputs != MASK)
    unchanged = chosen & (inputs == ids)
    # A random replacement is uniform over the K ids that are neither special nor [MASK]; every
    # original word is one of them, so 1/K of the random draws give the word back and look
    # unchanged. Expected: changed = 0.1 (1 - 1/K), unchanged = 0.1 + 0.1 / K.
    K = V - len(SPECIAL)
    assert int(masked.sum()) / n_chosen == pytest.approx(0.8, abs=0.01)
    assert int(changed.sum()) / n_chosen == pytest.approx(0.1 * (1 - 1 / K), abs=0.01)
    assert int(unchanged.sum()) / n_chosen == pytest.approx(0.1 + 0.1 / K, abs=0.01)


def test_random_hitting_the_original_is_visible_with_a_small_vocabulary():
    """With 4 candidate ids a quarter of the random draws give the original back, which shifts the
    measured shares far beyond the tolerance: this checks the draws are uniform over the candidates."""
    ids = batch(200, 512, vocab_size=8)
    inputs, labels = corrupt(ids, vocab_size=8)
    chosen = labels != IGNORE_INDEX
    n_chosen = int(chosen.sum())
    changed = chosen & (inputs != ids) & (inputs != MASK)
    unchanged = chosen & (inputs == ids)
    assert int(changed.sum()) / n_chosen == pytest.approx(0.1 * 3 / 4, abs=0.01)
    assert int(unchanged.sum()) / n_chosen == pytest.approx(0.1 + 0.1 / 4, abs=0.01)
    counts = torch.bincount(inputs[changed], minlength=8)
    assert counts[SPECIAL].sum() == 0 and counts[UNK] > 0
    assert counts[[UNK, 5, 6, 7]].max() / counts[[UNK, 5, 6, 7]].min() < 1.25


def test_special_tokens_are_never_chosen_nor_drawn():
    ids = batch(100, 128)
    inputs, labels = corrupt(ids, mask_prob=0.9, replace_prob=0.0, random_prob=1.0)
    special = torch.isin(ids, torch.tensor(SPECIAL))
    assert bool((labels[special] == IGNORE_INDEX).all())
    assert torch.equal(inputs[special], ids[special])
    assert not bool(torch.isin(inputs[~special], torch.tensor(SPECIAL)).any())  # no [MASK] either


def test_labels_hold_the_original_ids_at_chosen_positions_only():
    ids = batch(20, 64)
    inputs, labels = corrupt(ids)
    chosen = labels != IGNORE_INDEX
    assert bool(chosen.any())
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])  # nothing outside the chosen is touched
    assert labels.dtype == inputs.dtype == torch.long


def test_ids_are_not_modified_in_place():
    ids = batch(10, 32)
    before = ids.clone()
    inputs, labels = corrupt(ids, mask_prob=1.0)
    assert torch.equal(ids, before)
    assert inputs.data_ptr() != ids.data_ptr() and labels.data_ptr() != ids.data_ptr()


def test_same_seed_same_result_and_another_seed_differs():
    ids = batch(8, 64)
    a, b, c = corrupt(ids, seed=3), corrupt(ids, seed=3), corrupt(ids, seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 0), (64, 3)])
def test_any_batch_shape(shape: tuple[int, int]):
    ids = torch.randint(5, V, shape)
    inputs, labels = corrupt(ids, mask_prob=0.5)
    assert inputs.shape == labels.shape == ids.shape


def test_everything_masked_at_probability_one():
    ids = batch(4, 16)
    inputs, labels = corrupt(ids, mask_prob=1.0, replace_prob=1.0, random_prob=0.0)
    special = torch.isin(ids, torch.tensor(SPECIAL))
    assert bool((inputs[~special] == MASK).all())
    assert torch.equal(labels[~special], ids[~special])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mask_prob=1.5), "mask_prob must be in"),
        (dict(replace_prob=-0.1), "replace_prob must be in"),
        (dict(replace_prob=0.8, random_prob=0.3), "at most 1"),
    ],
)
def test_bad_probabilities(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        corrupt(batch(2, 8), **kwargs)


def test_bad_arguments():
    g = torch.Generator().manual_seed(0)
    ids = batch(2, 8)
    with pytest.raises(ValueError, match="mask_id must be in"):
        mask_tokens(ids, mask_id=V, vocab_size=V, special_ids=SPECIAL, generator=g)
    with pytest.raises(ValueError, match="long tensor"):
        mask_tokens(ids.float(), mask_id=MASK, vocab_size=V, special_ids=SPECIAL, generator=g)
    with pytest.raises(ValueError, match="no token id"):
        mask_tokens(ids, mask_id=MASK, vocab_size=5, special_ids=[0, 1, 2, 3], generator=g)
