"""Continuous batching (Yu et al. 2022, "Orca"): many sequences decoded together, each at its own
position, joining and leaving between steps.

A language model served to many clients spends a one-sequence decoding step mostly on fixed
costs: launching each layer's kernels, reading every weight. Run as one batch, N sequences cost
little more than one. But requests arrive at any time and stop at different lengths, so the batch
cannot wait for all its sequences to start or finish together: a new sequence is prefilled into a
free row of one preallocated KV cache and joins at the next step; a finished one leaves, and the
last row moves into its place so that the rows in use stay 0 … A−1. Each step runs the model once
over those rows, every row writing its key and value at its own position (`KVCache.update` with
per-row positions) and attending to its own filled slots.

With `fused=True`, a GPT that `attnlab.accel.fused` covers takes the cached rows' step in one C++
call (`FusedStep.rows`) instead of ~100 PyTorch operators: the step's fixed cost, which batching
shares among the rows, mostly goes. The prompts that join together are prefilled in one C++ call
too (`FusedStep.prefill`), whatever their lengths, each prompt's tokens in its own row: none is
padded, and a prompt's tokens see those before it (Orca's "selective batching").

Every sequence follows `generate_tokens`' rules exactly, so a batch gives each sequence the tokens
it would get decoded alone: the prompt's last block_size tokens are prefilled, and once a sequence
fills block_size positions its window slides, its next tokens predicted from its last block_size
tokens recomputed in full (those sequences leave the cache and are batched among themselves;
with the fused step, their windows are prefilled afresh at each step into the rows no sequence
holds).
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from attnlab.accel import for_decoding
from attnlab.accel.fused import gpt_step as fused_step
from attnlab.decode.sampling import Picker, _eval_mode, pick_rows
from attnlab.nn.attention import MultiHeadAttention

PAD_SLACK = 8  # pad tokens a prompt may take to share its prefill forward (see Batcher._prefill_groups)


@dataclass(eq=False)
class Sequence:
    """One sequence being decoded: its prompt, the tokens generated so far, and how it ends."""

    prompt: list[int]
    max_new_tokens: int
    pick: Picker | None = None  # None: greedy, taken for all greedy rows at once
    eos_id: int | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (the end-of-text token) or "length"
    row: int = -1  # its row of the cache; -1 once its window slides (or before it joins)
    filled: int = 0  # cache slots written: the position the next token is written at

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def takes_row_positions(model: nn.Module) -> bool:
    """Whether every attention layer of the model accepts per-row positions `(B, T)`."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    return all(m.pattern is None and (m.positions is None or m.positions.row_positions) for m in layers)


class Batcher:
    """The sequences decoded together by one model (a GPT-style decoder: `model(idx, cache=...,
    positions=..., last_only=True)`, `model.new_cache`, `model.config.block_size`).

    `join` prefills a sequence and picks its first token (`join_all`: several, prompts of similar
    lengths in one forward); `step` gives every sequence its next token; sequences that finish
    leave by themselves, `leave` takes one out early (a client gone, a stop string). `fused`: the
    cached rows' step in C++ where `attnlab.accel.fused` covers the model (a warning and
    PyTorch's path where it does not). Not thread-safe: one thread drives it.
    """

    def __init__(self, model: nn.Module, max_batch: int = 32, *, fused: bool = False) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = for_decoding(model).model  # the projections' decoding routes, in place
        self.max_batch = max_batch
        self.block = model.config.block_size
        self.row_positions = takes_row_positions(model)  # else the cached rows step one at a time
        self.cache = model.new_cache(max_batch, self.block)
        self.fused = fused_step(model, self.cache) if fused else None
        self.device = self.cache[0].k.device
        self.cached: list[Sequence] = []  # cached[i] owns row i of the cache
        self.windowed: list[Sequence] = []  # past block_size: recomputed in full at each step

    def __len__(self) -> int:
        return len(self.cached) + len(self.windowed)

    def join(self, prompt: list[int], max_new_tokens: int, pick: Picker | None = None, eos_id: int | None = None):
        """Prefill `prompt` (token ids, at least one) and pick its first token. Returns the
        `Sequence`, already done when that token ends it."""
        return self.join_all([Sequence(list(prompt), max_new_tokens, pick, eos_id)])[0]

    def join_all(self, seqs: list[Sequence]) -> list[Sequence]:
        """Prefill new sequences (each with a prompt of at least one token and nothing generated
        yet) and pick their first tokens. Prompts of similar lengths share one forward. Returns
        seqs; those already done left at once."""
        if len(self) + len(seqs) > self.max_batch:
            raise RuntimeError(f"the batch is full ({self.max_batch} sequences)")
        if any(not s.prompt for s in seqs):
            raise ValueError("a prompt needs at least one token")
        for seq in seqs:
            if seq.max_new_tokens <= 0:
                seq.finish_reason = "length"
        starting = [s for s in seqs if not s.done]
        for group in self._prefill_groups(starting):
            self._prefill(group)
        return seqs

    def step(self) -> list[Sequence]:
        """Feed every sequence its last token and pick the next one. Returns the sequences that
        got a token (finished ones have left the batch)."""
        moving = list(self.cached) + list(self.windowed)
        if not moving:
            return []
        for seq in [s for s in self.cached if s.filled >= self.block]:
            self._slide(seq)  # no slot left for the token: from here on its window slides
        with _eval_mode(self.model):
            cached, windowed = self._cached_logits(), self._windowed_logits()
        if self.cached:
            self._advance(list(self.cached), cached)
        if self.windowed:
            self._advance(list(self.windowed), windowed)
        return moving

    def leave(self, seq: Sequence) -> None:
        """Take seq out of the batch (finished, or no longer wanted); its row goes to the last row's sequence."""
        if seq.row >= 0:
            last = self.cached.pop()
            if last is not seq:
                n = last.filled  # the slots written so far, all the row holds
                for layer in self.cache:
                    layer.k[seq.row, :, :n] = layer.k[last.row, :, :n]
                    layer.v[seq.row, :, :n] = layer.v[last.row, :, :n]
                last.row = seq.row
                self.cached[seq.row] = last
            seq.row = -1
        elif seq in self.windowed:
            self.windowed.remove(seq)

    def _prefill_groups(self, seqs: list[Sequence]) -> list[list[Sequence]]:
        """The sequences grouped for prefilling, longest prompts first. A shorter prompt joins a
        group when padding it to the group's length costs at most PAD_SLACK tokens or half the
        length: a forward's fixed cost (launching every layer, reading every weight) is worth
        about that much compute on a CPU. Models whose positions cannot differ by row go alone; with
        the fused step all go together, unpadded."""
        if self.fused is not None:  # prompts of any lengths share one C++ call, unpadded
            return [seqs] if seqs else []
        if not self.row_positions:
            return [[s] for s in seqs]
        groups: list[list[Sequence]] = []
        for seq in sorted(seqs, key=lambda s: -self._window_length(s)):
            longest = self._window_length(groups[-1][0]) if groups else 0
            if groups and longest - self._window_length(seq) <= max(PAD_SLACK, longest // 2):
                groups[-1].append(seq)
            else:
                groups.append([seq])
        return groups

    def _window_length(self, seq: Sequence) -> int:
        return min(len(seq.prompt), self.block)

    def _prefill(self, group: list[Sequence]) -> None:
        """Prefill a group's prompts into the next free rows, in one call, and pick their first tokens."""
        windows = [s.prompt[-self.block :] for s in group]
        first = len(self.cached)
        for i, (seq, window) in enumerate(zip(group, windows, strict=True)):
            seq.row, seq.filled = first + i, len(window)
        with _eval_mode(self.model):
            if self.fused is not None:
                logits = self.fused.prefill(windows, first)
            else:
                logits = self._prefill_eager(windows, first)
        self.cached.extend(group)
        self._advance(group, logits)

    def _prefill_eager(self, windows: list[list[int]], first: int) -> torch.Tensor:
        """The model's forward over windows (longest first) into rows first, first + 1, …

        Shorter prompts are padded on the left, and the pads are placed after the prompt (at
        positions L … T-1): each prompt token then sits at its own position and sees only the
        prompt before it, the last column holds every row's last prompt token, and the pads' keys
        wait in slots that the row's next tokens overwrite before anything attends to them. `(G, V)`"""
        t = len(windows[0])
        views = [layer.view_rows(slice(first, first + len(windows))) for layer in self.cache]
        idx = torch.tensor([w[:1] * (t - len(w)) + w for w in windows], dtype=torch.long, device=self.device)
        if len(windows) == 1:
            return self.model(idx, cache=views, last_only=True)[:, -1]  # (1, V)
        order = [list(range(len(w), t)) + list(range(len(w))) for w in windows]
        positions = torch.tensor(order, dtype=torch.long, device=self.device)  # (G, T)
        return self.model(idx, cache=views, positions=positions, last_only=True)[:, -1]  # (G, V)

    def _slide(self, seq: Sequence) -> None:
        self.leave(seq)
        self.windowed.append(seq)

    def _cached_logits(self) -> torch.Tensor | None:
        """One step for the cached rows: each writes its last token at its own position. `(A, V)`."""
        if not self.cached:
            return None
        tokens = torch.tensor([[s.tokens[-1]] for s in self.cached], dtype=torch.long, device=self.device)
        positions = torch.tensor([[s.filled] for s in self.cached], dtype=torch.long, device=self.device)
        if self.fused is not None:
            logits = self.fused.rows(tokens.view(-1), positions.view(-1))
        elif self.row_positions:
            length = max(s.filled for s in self.cached) + 1  # attend to the filled slots alone
            views = [layer.view_rows(slice(0, len(self.cached)), length) for layer in self.cache]
            logits = self.model(tokens, cache=views, positions=positions, last_only=True)[:, -1]
        else:  # a model whose positions act on the scores: one row at a time
            rows = []
            for i, seq in enumerate(self.cached):
                views = [layer.view_rows(slice(i, i + 1), seq.filled + 1) for layer in self.cache]
                rows.append(self.model(tokens[i : i + 1], cache=views, positions=positions[i], last_only=True)[:, -1])
            logits = torch.cat(rows)
        for seq in self.cached:
            seq.filled += 1
        return logits

    def _windowed_logits(self) -> torch.Tensor | None:
        """The sliding windows, each its last block_size tokens (all the same length). `(W, V)`."""
        if not self.windowed:
            return None
        windows = [(s.prompt + s.tokens)[-self.block :] for s in self.windowed]
        if self.fused is not None:  # in the rows no sequence holds: there are as many as windows, or more
            return self.fused.prefill(windows, len(self.cached))
        idx = torch.tensor(windows, dtype=torch.long, device=self.device)
        return self.model(idx, last_only=True)[:, -1]

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Pick each sequence's next token from its logits row; finished sequences leave."""
        for seq, token in zip(seqs, pick_rows([s.pick for s in seqs], logits), strict=True):
            seq.tokens.append(token)
            if seq.eos_id is not None and token == seq.eos_id:
                seq.finish_reason = "stop"
            elif len(seq.tokens) >= seq.max_new_tokens:
                seq.finish_reason = "length"
            if seq.done:
                self.leave(seq)


__all__ = ["Batcher", "Sequence", "takes_row_positions"]
