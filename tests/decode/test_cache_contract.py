"""The seams of decoding, one contract each: a layer's cache returns what the new queries see in
one form, for one token or many; the model keeps the one count of positions and advances it once
a forward; the scheduler imports no PyTorch and talks to the runner in one object each way."""

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from attnlab.decode.scheduler import RunnerOutput, Scheduler, Sequence
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.nn import CachedKeys, KVCache, ModelCache, RollingKVCache
from decode.conftest import tiny_gpt

B, H, D, SLOTS, W = 2, 2, 4, 12, 4


def attend_by_hand(q: torch.Tensor, seen: CachedKeys, q_pos: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √D) v over what `update` returned, each query seeing the keys its mask allows
    (or, without one, the keys at positions up to its own: the look-ahead rule). `(B, H, Tq, D)`"""
    k_pos = torch.arange(seen.k.size(2)) if seen.positions is None else seen.positions
    sees = k_pos[..., None, :] <= q_pos[:, None] if seen.mask is None else seen.mask
    scores = (q @ seen.k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~sees, float("-inf"))
    return torch.softmax(scores, dim=-1) @ seen.v


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_pos: torch.Tensor, window: int | None):
    """The same queries over every key written so far, at positions 0 … N−1, masked by the rule
    written out: the past and the query itself, within `window` positions where there is one."""
    k_pos = torch.arange(keys.size(2))
    sees = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        sees &= k_pos[None, :] > q_pos[:, None] - window
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(D)).masked_fill(~sees, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values


@pytest.mark.parametrize("ring", [False, True], ids=["full", "ring"])
@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
def test_update_returns_what_the_queries_see_in_one_form_for_one_token_or_many(ring, static):
    """A prompt of 6 (more than the ring's 4 slots), then steps of one token and of three: every
    return is a `CachedKeys` of keys and values `(B, H, Tk, D)` with positions and a mask sized to
    them, and attending to it gives the attention of the whole history masked by the rule."""
    torch.manual_seed(0)
    cache = RollingKVCache(B, H, W, D) if ring else KVCache(B, H, SLOTS, D)
    keys, values = torch.randn(B, H, SLOTS, D), torch.randn(B, H, SLOTS, D)
    start = 0
    for n in (6, 1, 1, 3, 1):
        q_pos = torch.arange(start, start + n)
        seen = cache.update(q_pos if static else start, keys[:, :, start : start + n], values[:, :, start : start + n])
        assert isinstance(seen, CachedKeys)
        t_k = seen.k.size(2)
        assert seen.k.shape == seen.v.shape == (B, H, t_k, D)
        assert seen.positions is None or seen.positions.shape[-1] == t_k
        assert seen.mask is None or seen.mask.shape[-2:] == (n, t_k)
        q = torch.randn(B, H, n, D)
        want = reference(q, keys[:, :, : start + n], values[:, :, : start + n], q_pos, W if ring else None)
        torch.testing.assert_close(attend_by_hand(q, seen, q_pos), want, rtol=0, atol=1e-6)
        start += n


class CountedWrites(ModelCache):
    """A model cache that records every value its count is set to."""

    def __init__(self, layers) -> None:
        super().__init__(layers)
        self.writes: list[int] = []

    def __setattr__(self, name: str, value) -> None:
        if name == "length" and hasattr(self, "writes"):
            self.writes.append(value)
        super().__setattr__(name, value)


@pytest.mark.parametrize("attention", ["full", "window"])
def test_the_gpt_advances_its_one_count_once_a_forward(attention):
    model = tiny_gpt(attention=attention, attention_window=W, positions="rope")
    cache = CountedWrites(model.new_cache(2))
    assert all(not hasattr(layer, "length") for layer in cache)  # the layers count nothing
    seq = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(seq[:, :5], cache=cache)
        model(seq[:, 5:6], cache=cache)
        model(seq[:, 6:9], cache=cache)
        assert cache.writes == [5, 6, 9] and cache.length == 9
        model(seq[:, :1], cache=cache, positions=torch.tensor([9]))  # the static path: the caller counts
    assert cache.writes == [5, 6, 9]


def test_the_translation_model_advances_its_one_count_once_a_step():
    torch.manual_seed(0)
    config = Seq2SeqConfig(vocab_size=13, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=16)
    model = Seq2SeqTransformer(config).eval()
    with torch.no_grad():
        state = model.start(torch.randint(3, 13, (2, 5)), 8)
        state.caches = CountedWrites(state.caches)
        for _ in range(3):
            model.step(torch.tensor([1, 1]), state)
    assert state.caches.writes == [1, 2, 3]


def test_the_scheduler_imports_no_torch():
    """It knows no model and no tensor: importing it with PyTorch made unimportable succeeds."""
    code = textwrap.dedent(
        """
        import sys

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked here")

        sys.meta_path.insert(0, NoTorch())
        import attnlab.decode.scheduler
        assert "torch" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


class Grammar:
    """A token mask that records the tokens it is given."""

    finished = False

    def __init__(self) -> None:
        self.taken: list[int] = []

    def accept(self, token: int) -> None:
        self.taken.append(token)


def test_one_object_each_way_between_scheduler_and_runner():
    moves = []
    s = Scheduler(3, 4, lambda *move: moves.append(move))
    a, b = Sequence([1, 2, 3], 5, eos_id=9), Sequence([4], 5, mask=Grammar())
    prefill = s.schedule_prefill(s.admit([a, b]))
    assert prefill.prompts == [[1, 2, 3], [4]] and prefill.first_row == 0 and prefill.seqs == [a, b]
    s.update_from_output(prefill, RunnerOutput([7, 8], [None, None]))
    assert (a.row, a.filled, a.tokens) == (0, 3, [7]) and (b.row, b.filled, b.tokens) == (1, 1, [8])
    step = s.schedule()
    assert step.step_tokens == [7, 8] and step.step_positions == [3, 1] and step.windows == []
    s.update_from_output(step, RunnerOutput([9, 5], [None, None]))  # a ends (its eos) and leaves
    assert a.finish_reason == "stop" and b.mask.taken == [8, 5] and b.filled == 2
    assert s.cached == [b] and b.row == 0 and moves == [(1, 0, 2)]  # b's row moved into a's
    step = s.schedule()  # b has filled the block's 4 slots after two more: then its window slides
    s.update_from_output(step, RunnerOutput([6], [None]))
    s.update_from_output(s.schedule(), RunnerOutput([6], [None]))
    step = s.schedule()
    assert step.step_tokens == [] and step.windows == [[4, 8, 5, 6, 6][-4:]] and step.seqs == [b]
