"""Continuous batching's scheduler alone, without a model: rows, joins, leaves, sliding windows."""

import random

import pytest

from attnlab.decode.scheduler import Scheduler, Sequence

BLOCK = 8


class RowCache:
    """A stand-in for the runner's cache: each row a list of the token ids its slots hold."""

    def __init__(self, rows: int) -> None:
        self.rows = [[None] * BLOCK for _ in range(rows)]
        self.moves: list[tuple[int, int, int]] = []

    def move_row(self, from_row: int, to_row: int, slots: int) -> None:
        self.moves.append((from_row, to_row, slots))
        self.rows[to_row][:slots] = self.rows[from_row][:slots]

    def write(self, row: int, start: int, tokens: list[int]) -> None:
        self.rows[row][start : start + len(tokens)] = tokens


def scheduler(max_batch: int = 4) -> tuple[Scheduler, RowCache]:
    cache = RowCache(max_batch)
    return Scheduler(max_batch, BLOCK, cache.move_row), cache


def joined(s: Scheduler, cache: RowCache, *prompts: list[int], max_new: int = 5, mode="alone") -> list[Sequence]:
    """Admit and place sequences one group at a time, writing their windows as a prefill would."""
    seqs = s.admit([Sequence(list(p), max_new) for p in prompts])
    for group in s.prefill_groups(seqs, mode):
        for i, seq in enumerate(group):
            cache.write(s.free_row + i, 0, s.window(seq))
        s.place(group)
    return seqs


def test_admit_refuses_a_full_batch_and_empty_prompts():
    s, cache = scheduler(max_batch=2)
    joined(s, cache, [1, 2])
    with pytest.raises(RuntimeError, match="full"):
        s.admit([Sequence([1], 1)] * 2)
    with pytest.raises(ValueError, match="at least one token"):
        s.admit([Sequence([], 1)])
    assert len(s) == 1


def test_admit_returns_the_sequences_to_prefill_and_finishes_a_request_for_nothing():
    s, _ = scheduler()
    wanted, nothing = Sequence([1, 2], 3), Sequence([3], 0)
    assert s.admit([wanted, nothing]) == [wanted]
    assert nothing.finish_reason == "length" and not wanted.done
    assert len(s) == 0  # admitted, not yet placed


def test_prefill_groups_by_mode():
    s, _ = scheduler(max_batch=8)
    # Windows of 8 (a prompt of 12, cut to the block), 6, 5 and 3, 2, 1.
    seqs = [Sequence([0] * n, 1) for n in (3, 1, 6, 12, 5, 2)]
    lengths = [[s.window_length(q) for q in group] for group in s.prefill_groups(seqs, "padded")]
    assert lengths == [[8, 6, 5, 3, 2, 1]]  # within PAD_SLACK (8) of the longest: one forward
    assert s.prefill_groups(seqs, "unpadded") == [seqs]
    assert s.prefill_groups(seqs, "alone") == [[q] for q in seqs]
    assert s.prefill_groups([], "unpadded") == []


def test_padded_groups_split_where_padding_costs_more_than_the_slack():
    s = Scheduler(16, 64, lambda *move: None)
    seqs = [Sequence([0] * n, 1) for n in (40, 3, 30, 12, 64, 2)]
    # Longest first; a prompt joins when its pads are at most max(8, half the group's longest):
    # 40 joins 64 (24 pads <= 32), 30 does not (34); 12 not with 30 (18 > 15); 3 not with 12
    # (9 > 8); 2 joins 3.
    lengths = [[s.window_length(q) for q in g] for g in s.prefill_groups(seqs, "padded")]
    assert lengths == [[64, 40], [30], [12], [3, 2]]


def test_places_take_the_next_rows_and_a_leaving_sequence_row_goes_to_the_last():
    s, cache = scheduler()
    a, b, c = joined(s, cache, [1, 2, 3], [4], [5, 6], mode="unpadded")  # in the order given
    assert [q.row for q in (a, b, c)] == [0, 1, 2] and s.cached == [a, b, c]
    assert [q.filled for q in (a, b, c)] == [3, 1, 2] and s.free_row == 3
    s.leave(a)
    assert cache.moves == [(2, 0, 2)]  # c's two written slots into the row a held
    assert s.cached == [c, b] and (a.row, c.row) == (-1, 0) and cache.rows[0][:2] == [5, 6]
    s.leave(b)  # the last row: nothing moves
    assert cache.moves == [(2, 0, 2)] and s.cached == [c] and s.free_row == 1


def test_record_finishes_at_the_end_token_or_the_length_and_the_finished_leave():
    s, cache = scheduler()
    stops, runs, ends = (Sequence([1], 3, eos_id=9), Sequence([2], 3, eos_id=9), Sequence([3], 1))
    for seq in (stops, runs, ends):
        s.admit([seq])
        cache.write(s.free_row, 0, s.window(seq))
        s.place([seq])
    s.record([stops, runs, ends], [9, 4, 5])
    assert (stops.finish_reason, runs.finish_reason, ends.finish_reason) == ("stop", None, "length")
    assert s.cached == [runs] and runs.row == 0 and runs.tokens == [4]


def test_a_sequence_with_no_slot_left_slides_its_window():
    s, cache = scheduler()
    full, short = joined(s, cache, list(range(10)), [1, 2])
    assert full.filled == BLOCK and s.window(full) == list(range(2, 10))
    s.slide_full()
    assert s.windowed == [full] and s.cached == [short] and (full.row, short.row) == (-1, 0)
    s.record([full], [42])
    assert s.window(full) == [*range(3, 10), 42] and s.window_length(full) == BLOCK
    s.leave(full)
    assert len(s) == 1 and s.windowed == []


def test_random_joins_steps_and_leaves_keep_every_row_holding_its_own_sequence():
    """Driven as `Batcher` drives it, with a list per row for the cache: after every operation the
    rows in use are 0 … A−1, and each holds its sequence's window and the tokens fed since."""
    rng = random.Random(0)
    s, cache = scheduler(max_batch=5)
    written: dict[int, list[int]] = {}  # id(seq) -> what its row must hold
    slid = 0
    for _ in range(300):
        if len(s) < s.max_batch and rng.random() < 0.4:
            prompt = [rng.randrange(100) for _ in range(rng.randint(1, 11))]
            for seq in joined(s, cache, prompt, max_new=rng.randint(1, 12)):
                written[id(seq)] = s.window(seq)
                s.record([seq], [rng.randrange(100)])
        elif s.cached and rng.random() < 0.1:
            s.leave(rng.choice(s.cached))
        elif len(s):
            s.slide_full()
            cached, windowed = list(s.cached), list(s.windowed)
            for seq in cached:
                cache.write(seq.row, seq.filled, [seq.tokens[-1]])
                written[id(seq)].append(seq.tokens[-1])
            s.stepped()
            slid += len(windowed)
            s.record(cached + windowed, [rng.randrange(100) for _ in cached + windowed])
        assert [q.row for q in s.cached] == list(range(len(s.cached)))
        for seq in s.cached:
            assert seq.filled == len(written[id(seq)]) <= BLOCK
            assert cache.rows[seq.row][: seq.filled] == written[id(seq)]
        assert all(q.row == -1 and not q.done for q in s.windowed)
    assert cache.moves and slid, "no sequence moved rows, or none slid: the test would prove little"
