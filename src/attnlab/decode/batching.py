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

`Batcher` composes the two halves, as vLLM keeps a scheduler apart from its model runner: the
`Scheduler` (`attnlab.decode.scheduler`) decides which sequences hold which cache rows, who joins,
who leaves and whose window slides, with no model; the `Runner` (`attnlab.decode.runner`) runs one
step for the rows it is given, through PyTorch or the fused C++ step.

Every sequence follows `generate_tokens`' rules exactly, so a batch gives each sequence the tokens
it would get decoded alone: the prompt's last block_size tokens are prefilled, and once a sequence
fills block_size positions its window slides, its next tokens predicted from its last block_size
tokens recomputed in full (those sequences leave the cache and are batched among themselves;
with the fused step, their windows are prefilled afresh at each step into the rows no sequence
holds). A window-attention model whose positions are offsets inside attention (rope, alibi) needs
no recomputation: its cache rows are rings of the window's keys (`attnlab.nn.RollingKVCache`),
its whole prompts are prefilled, and its sequences stay in their rows however long they grow.

With `prefix_memory`, the keys and values that rows wrote are kept in blocks found again by their
token prefix (`attnlab.decode.prefix_cache`, vLLM's automatic prefix caching): a prompt that begins
as an earlier one (or as an earlier prompt and its reply) copies those blocks into its row and
prefills only the rest (`Runner.prefill_after`), with the logits of a cold prefill up to float32
rounding. Rolling caches take none.
"""

import torch
from torch import nn

from attnlab.decode.prefix_cache import BLOCK_TOKENS, block_keys, for_cache
from attnlab.decode.runner import Runner, takes_row_positions
from attnlab.decode.sampling import Picker, mask_rows, penalize, pick_rows, prompt_scores, token_scores
from attnlab.decode.scheduler import Scheduler, Sequence


class Batcher:
    """The sequences decoded together by one model (a GPT-style decoder: `model(idx, cache=...,
    positions=..., last_only=True)`, `model.new_cache`, `model.config.block_size`).

    `join` prefills a sequence and picks its first token (`join_all`: several, prompts of similar
    lengths in one forward); `step` gives every sequence its next token; sequences that finish
    leave by themselves, `leave` takes one out early (a client gone, a stop string). `fused`: the
    cached rows' step in C++ where `attnlab.accel.fused` covers the model (a warning and
    PyTorch's path where it does not), its weights fp32, bf16 or int8 (`weights`). Not
    thread-safe: one thread drives it.

    `prefix_memory`: bytes of cached prompt prefixes (`prefix`, a `PrefixCache` in blocks of
    `prefix_block` tokens; None where 0 or where the cache rolls); each sequence's `cached_tokens`
    says how many of its prompt's tokens it reused.

    `scheduler` (who holds which row) and `runner` (the model's steps over those rows) are its two
    halves; the attributes below read through to them.
    """

    def __init__(
        self,
        model: nn.Module,
        max_batch: int = 32,
        *,
        fused: bool = False,
        weights: str = "fp32",
        prefix_memory: int = 0,
        prefix_block: int = BLOCK_TOKENS,
    ) -> None:
        self.runner = Runner(model, max_batch, fused=fused, weights=weights)
        # the prompts' cached prefixes (`attnlab.decode.prefix_cache`), at most prefix_memory bytes; None: off
        self.prefix = for_cache(self.runner.cache, prefix_memory, prefix_block)
        on_leave = self._keep_prefix if self.prefix is not None else None
        self.scheduler = Scheduler(
            max_batch, model.config.block_size, self._move_row, rolls=self.runner.rolls, on_leave=on_leave
        )

    def _move_row(self, from_row: int, to_row: int, slots: int) -> None:
        self.runner.move_row(from_row, to_row, slots)

    @property
    def model(self) -> nn.Module:
        return self.runner.model

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @property
    def cache(self) -> list:
        """The KV cache, a `KVCache` per layer; row i belongs to `cached[i]`."""
        return self.runner.cache

    @property
    def fused(self):
        """The fused C++ step (`attnlab.accel.fused.FusedStep`), or None: PyTorch's path."""
        return self.runner.fused

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def row_positions(self) -> bool:
        return self.runner.row_positions

    @property
    def cached(self) -> list[Sequence]:
        return self.scheduler.cached

    @property
    def windowed(self) -> list[Sequence]:
        return self.scheduler.windowed

    def __len__(self) -> int:
        return len(self.scheduler)

    def join(self, prompt: list[int], max_new_tokens: int, pick: Picker | None = None, eos_id: int | None = None):
        """Prefill `prompt` (token ids, at least one) and pick its first token. Returns the
        `Sequence`, already done when that token ends it."""
        return self.join_all([Sequence(list(prompt), max_new_tokens, pick, eos_id)])[0]

    def join_all(self, seqs: list[Sequence]) -> list[Sequence]:
        """Prefill new sequences (each with a prompt of at least one token and nothing generated
        yet) and pick their first tokens. Prompts of similar lengths share one forward. Returns
        seqs; those already done left at once. Those with `echo_logprobs` get their prompt's
        scores first (a forward of its own: a prompt that asks for no new token is scored too)."""
        for seq in seqs:
            if seq.echo_logprobs:
                if len(seq.prompt) > self.scheduler.block:
                    raise ValueError(f"a prompt scored whole holds at most {self.scheduler.block} tokens")
                seq.prompt_scores = prompt_scores(self.runner.score(seq.prompt), seq.prompt, seq.logprobs or 0)
        pending = self.scheduler.admit(seqs)
        while pending:  # one round, or more where a prompt waits for blocks another one writes
            now, pending = self._next_round(pending)
            cold = [s for s in now if s.cached_tokens == 0]
            for group in self.scheduler.prefill_groups(cold, self.runner.prefill_mode):
                logits = self.runner.prefill([self.scheduler.window(s) for s in group], self.scheduler.free_row)
                self._placed(group, logits)
            for seq, blocks in ((s, now[s]) for s in now if s.cached_tokens):
                row = self.scheduler.free_row
                self.prefix.load(blocks, row, seq.cached_tokens)
                self._placed([seq], self.runner.prefill_after(self.scheduler.window(seq), row, seq.cached_tokens))
        return seqs

    def _next_round(self, seqs: list[Sequence]) -> tuple[dict[Sequence, list], list[Sequence]]:
        """The sequences to prefill now, each with its cached blocks (its `cached_tokens` set:
        those blocks' tokens, all but the window's last at most), and those to prefill after them:
        a prompt that shares more full blocks with one prefilled now than the cache holds waits
        for that one's blocks (two requests with the same long system prompt: one prefill of it)."""
        if self.prefix is None:
            return dict.fromkeys(seqs, []), []
        now: dict[Sequence, list] = {}
        keys: list[list[bytes]] = []
        later = []
        for seq in seqs:
            window = self.scheduler.window(seq)
            mine = block_keys(window, self.prefix.block_tokens)
            shared = max((_common(mine, theirs) for theirs in keys), default=0)
            blocks = self.prefix.lookup(window)
            if shared > len(blocks):
                later.append(seq)
                continue
            seq.cached_tokens = min(len(blocks) * self.prefix.block_tokens, len(window) - 1)
            now[seq] = blocks
            keys.append(mine)
        return now, later

    def _placed(self, group: list[Sequence], logits: torch.Tensor) -> None:
        """The prefilled group takes its rows; the prefix cache keeps its prompts' full blocks; each
        picks its first token."""
        self.scheduler.place(group)
        if self.prefix is not None:
            for seq in group:
                self.prefix.store(self.scheduler.window(seq), seq.row)
        self._advance(group, logits)

    def _keep_prefix(self, seq: Sequence) -> None:
        """Keep the full blocks of what a leaving sequence's row holds (its prompt, then the tokens
        it was fed): a conversation's next turn begins with them."""
        tokens = seq.prompt + seq.tokens
        start = max(0, len(seq.prompt) - self.scheduler.block)  # where its window began when it joined
        self.prefix.store(tokens[start : start + seq.filled], seq.row)

    def step(self) -> list[Sequence]:
        """Feed every sequence its last token and pick the next one. Returns the sequences that
        got a token (finished ones have left the batch)."""
        s = self.scheduler
        moving = list(s.cached) + list(s.windowed)
        if not moving:
            return []
        s.slide_full()  # no slot left for their token: from here on their windows slide
        cached, windowed = list(s.cached), list(s.windowed)
        # Both sets of logits before any token is recorded: a sequence that finishes leaves, and
        # moves another's row.
        if cached:
            cached_logits = self.runner.step([q.tokens[-1] for q in cached], [q.filled for q in cached])
            s.stepped()
        if windowed:
            windowed_logits = self.runner.recompute([s.window(q) for q in windowed], s.free_row)
        if cached:
            self._advance(cached, cached_logits)
        if windowed:
            self._advance(windowed, windowed_logits)
        return moving

    def leave(self, seq: Sequence) -> None:
        """Take seq out of the batch (finished, or no longer wanted); its row goes to the last row's sequence."""
        self.scheduler.leave(seq)

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Pick each sequence's next token from its logits row, after its penalties and among the
        tokens its mask allows (each row its own); score it under the model's own logits where
        asked; finished sequences leave."""
        adjusted = penalize(logits, [q.penalties for q in seqs], [q.tokens for q in seqs])
        adjusted = mask_rows(adjusted, [q.mask for q in seqs])
        tokens = pick_rows([q.pick for q in seqs], adjusted)
        for seq, token in zip(seqs, tokens, strict=True):
            if seq.mask is not None:
                seq.mask.accept(token)
        scores = token_scores(logits, tokens, [q.logprobs for q in seqs])
        self.scheduler.record(seqs, tokens, scores)


def _common(a: list[bytes], b: list[bytes]) -> int:
    """How many keys two chains share from their start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


__all__ = ["Batcher", "Sequence", "takes_row_positions"]
