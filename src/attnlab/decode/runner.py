"""Continuous batching's runner: one step of the model for the cache rows it is given.

The runner holds the model, one preallocated KV cache of `rows` rows and, where asked for and
covered, the fused C++ step (`attnlab.accel.fused`); it knows nothing of which sequence holds which
row (`attnlab.decode.scheduler` does). Each call runs the model once (or once per row, for models
whose positions cannot differ by row) and returns next-token logits, a row per sequence:

- `prefill`: prompts into rows first, first + 1, … (the model's forward, padded; or one C++ call,
  unpadded, each prompt's tokens in its own row: Orca's "selective batching");
- `step`: the cached rows 0 … A−1, each writing its key and value at its own position
  (`KVCache.update` with per-row positions) and attending to its own filled slots; with the fused
  step, one C++ call (`FusedStep.rows`) instead of ~100 PyTorch operators;
- `prefill_after`: the rest of one prompt whose first keys and values its row already holds (a
  cached prefix, `attnlab.decode.prefix_cache`), at their positions after them;
- `recompute`: sliding windows read in full (with the fused step, prefilled afresh into the rows
  no sequence holds).

`execute` takes the scheduler's `SchedulerOutput`, runs the call it asks for and picks each
sequence's token from its logits (after its penalties, among the tokens its mask allows, scored
where asked), answering with one `RunnerOutput`, as vLLM's model runner samples too.

A window-attention GPT's cache is a ring of the window's keys a row (`RollingKVCache`): its rows
take per-row positions like full attention's, its prompts are prefilled by equal lengths (a pad
would take the slot of a prompt key) and, where its positions are offsets inside attention
(`rolls`), whole and block_size tokens at a time, its sequences never sliding.
"""

import torch
from torch import nn

from attnlab.accel import for_decoding
from attnlab.accel.fused import gpt_step as fused_step
from attnlab.accel.plan import EAGER, DecodePlan
from attnlab.decode.sampling import _eval_mode, mask_rows, penalize, pick_rows, rolls_past_block, token_scores
from attnlab.decode.scheduler import RunnerOutput, SchedulerOutput, Sequence
from attnlab.errors import UserError
from attnlab.models.protocols import CausalDecoder
from attnlab.nn.attention import KVCache, MultiHeadAttention


def takes_row_positions(model: nn.Module, ring: bool = False) -> bool:
    """Whether every attention layer of the model accepts per-row positions `(B, T)`; `ring`: over
    rolling caches, which mask a window pattern row by row."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    return all((m.pattern is None or ring) and (m.positions is None or m.positions.row_positions) for m in layers)


class Runner:
    """Steps of a GPT-style decoder (`model(idx, cache=..., positions=..., last_only=True)`,
    `model.new_cache`, `model.config.block_size`) over a cache of `rows` rows of block_size slots.

    `plan` (`attnlab.accel.plan.DecodePlan`): with `fused`, the steps in C++ where
    `attnlab.accel.fused` covers the model (a warning and PyTorch's path where it does not), reading
    the weights as its `weights` says (fp32, bf16, int8, int4 or q4_k).
    Every call runs in eval mode without autograd.
    """

    def __init__(self, model: CausalDecoder, rows: int, plan: DecodePlan = EAGER) -> None:
        self.model = for_decoding(model).model  # the projections' decoding routes, in place
        self.block = model.config.block_size
        self.cache = model.new_cache(rows, self.block)
        if not isinstance(self.cache[0], KVCache):  # a convolution's cache: its last inputs, no slots
            evolved = getattr(model.config, "block", None) == "evolved"  # convolutions inside its cells
            what = "block 'evolved'" if evolved else f"attention {model.config.attention!r}"
            raise UserError(
                f"{what} keeps no key/value slots for continuous batching to "
                "share; decode it with `attnlab sample` (or use full or window attention)"
            )
        self.ring = self.cache[0].window is not None  # a ring of the window's keys a row
        self.rolls = self.ring and rolls_past_block(model)  # whole prompts, and no window slides
        self.row_positions = takes_row_positions(model, self.ring)  # else the cached rows step one at a time
        self.fused = fused_step(model, self.cache, plan.weights) if plan.fused else None
        self.device = self.cache[0].k.device

    @property
    def prefill_mode(self) -> str:
        """How several prompts share a prefill (`scheduler.PREFILL_MODES`): any lengths in one C++
        call; similar lengths in one padded forward; or, for models whose positions cannot differ
        by row, one at a time; over a ring, equal lengths in one forward."""
        if self.fused is not None:
            return "unpadded"
        if self.ring:
            return "equal"
        return "padded" if self.row_positions else "alone"

    def prefill(self, windows: list[list[int]], first_row: int) -> torch.Tensor:
        """Write windows (token ids, at most block_size each unless the cache rolls; longest first
        unless `prefill_mode` is "unpadded") into rows first_row, first_row + 1, …, window i's tokens at positions
        0 … len − 1. Returns the next-token logits after each window's last token `(G, V)`."""
        with _eval_mode(self.model):
            if self.fused is not None:
                return self.fused.prefill(windows, first_row)
            return self._prefill_eager(windows, first_row)

    def prefill_after(self, window: list[int], row: int, start: int) -> torch.Tensor:
        """Write window[start:] into cache row `row` at positions start … len − 1, its slots 0 …
        start − 1 already holding window[:start]'s keys and values (a cached prefix). Returns the
        next-token logits after the window's last token `(1, V)`."""
        with _eval_mode(self.model):
            if self.fused is not None:  # one C++ call for the rest of the prompt
                rest = torch.tensor(window[start:], dtype=torch.long)
                return self.fused.extend(rest, start, row)[-1:]
            views = self.cache.view_rows(slice(row, row + 1))
            views.length = start  # the growing path: the new tokens continue after the prefix
            idx = torch.tensor([window[start:]], dtype=torch.long, device=self.device)
            return self.model(idx, cache=views, last_only=True)[:, -1]  # (1, V)

    def _prefill_eager(self, windows: list[list[int]], first: int) -> torch.Tensor:
        """The model's forward over windows (longest first) into rows first, first + 1, …

        Shorter prompts are padded on the left, and the pads are placed after the prompt (at
        positions L … T-1): each prompt token then sits at its own position and sees only the
        prompt before it, the last column holds every row's last prompt token, and the pads' keys
        wait in slots that the row's next tokens overwrite before anything attends to them. `(G, V)`"""
        t = len(windows[0])
        views = self.cache.view_rows(slice(first, first + len(windows)))
        idx = torch.tensor([w[:1] * (t - len(w)) + w for w in windows], dtype=torch.long, device=self.device)
        if len(windows) == 1 or self.ring:  # one length: the growing path, block_size tokens a forward
            for start in range(0, t, self.block):
                logits = self.model(idx[:, start : start + self.block], cache=views, last_only=True)
            return logits[:, -1]  # (G, V)
        order = [list(range(len(w), t)) + list(range(len(w))) for w in windows]
        positions = torch.tensor(order, dtype=torch.long, device=self.device)  # (G, T)
        return self.model(idx, cache=views, positions=positions, last_only=True)[:, -1]  # (G, V)

    def step(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One token for each of the rows 0 … A−1: row r's token `tokens[r]` is written at
        `positions[r]` (its filled slots, all below) and attends to its slots 0 … positions[r].
        Returns the next-token logits `(A, V)`."""
        idx = torch.tensor([[t] for t in tokens], dtype=torch.long, device=self.device)  # (A, 1)
        at = torch.tensor([[p] for p in positions], dtype=torch.long, device=self.device)  # (A, 1)
        with _eval_mode(self.model):
            if self.fused is not None:
                return self.fused.rows(idx.view(-1), at.view(-1))
            if not self.row_positions:
                return self._step_one_row_at_a_time(idx, at, positions)
            views = self.cache.view_rows(slice(0, len(tokens)), max(positions) + 1)
            return self.model(idx, cache=views, positions=at, last_only=True)[:, -1]

    def _step_one_row_at_a_time(self, idx: torch.Tensor, at: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """`step` for a model whose positions act on the scores (ALiBi, relative): a forward per row."""
        rows = []
        for i, position in enumerate(positions):
            views = self.cache.view_rows(slice(i, i + 1), position + 1)
            rows.append(self.model(idx[i : i + 1], cache=views, positions=at[i], last_only=True)[:, -1])
        return torch.cat(rows)

    def recompute(self, windows: list[list[int]], free_row: int) -> torch.Tensor:
        """Next-token logits `(W, V)` of windows of block_size tokens each, read in full (their
        sequences hold no cache row). With the fused step they are prefilled into the rows from
        free_row on, which no sequence holds: there are as many as windows, or more."""
        with _eval_mode(self.model):
            if self.fused is not None:
                return self.fused.prefill(windows, free_row)
            idx = torch.tensor(windows, dtype=torch.long, device=self.device)
            return self.model(idx, last_only=True)[:, -1]

    def score(self, prompt: list[int]) -> torch.Tensor:
        """The model's next-token logits after every token of prompt (at most block_size ids),
        read in full with no cache `(T, V)`: what `echo` with `logprobs` reports of a prompt."""
        with _eval_mode(self.model):
            idx = torch.tensor([prompt], dtype=torch.long, device=self.device)
            return self.model(idx)[0]

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        """Run the call `scheduled` asks for (a prefill, or a step of the cached rows and the
        sliding windows) and pick a token for each of its sequences."""
        if scheduled.prompts:
            if scheduled.cached:
                logits = self.prefill_after(scheduled.prompts[0], scheduled.first_row, scheduled.cached)
            else:
                logits = self.prefill(scheduled.prompts, scheduled.first_row)
            return self.pick(scheduled.seqs, logits)
        # Both sets of logits before any token is picked: the scheduler records them all at once.
        a = len(scheduled.step_tokens)
        parts = []
        if a:
            parts.append(self.step(scheduled.step_tokens, scheduled.step_positions))
        if scheduled.windows:
            parts.append(self.recompute(scheduled.windows, scheduled.free_row))
        picked = [self.pick(seqs, logits) for seqs, logits in zip(_split(scheduled.seqs, a), parts, strict=True)]
        return RunnerOutput([t for p in picked for t in p.tokens], [c for p in picked for c in p.scores])

    @staticmethod
    def pick(seqs: list[Sequence], logits: torch.Tensor) -> RunnerOutput:
        """Each sequence's next token from its row of logits `(N, V)`, after its penalties and
        among the tokens its mask allows (each row its own), scored under the model's own logits
        where it asks for scores."""
        adjusted = penalize(logits, [q.penalties for q in seqs], [q.tokens for q in seqs])
        adjusted = mask_rows(adjusted, [q.mask for q in seqs])
        tokens = pick_rows([q.pick for q in seqs], adjusted)
        return RunnerOutput(tokens, token_scores(logits, tokens, [q.logprobs for q in seqs]))

    def move_row(self, from_row: int, to_row: int, slots: int) -> None:
        """Copy the first `slots` slots of every layer's cache row from_row into row to_row (a ring
        holds positions past its slots in the same slots: all of them, then)."""
        for layer in self.cache:
            n = min(slots, layer.max_len)
            layer.view_rows(slice(to_row, to_row + 1)).update(
                0, layer.k[from_row : from_row + 1, :, :n], layer.v[from_row : from_row + 1, :, :n]
            )


def _split(seqs: list[Sequence], a: int) -> list[list[Sequence]]:
    """A step's sequences as its two calls take them: the a cached rows', the windows' (each
    where there is any)."""
    return [part for part in (seqs[:a], seqs[a:]) if part]


__all__ = ["Runner", "takes_row_positions"]
