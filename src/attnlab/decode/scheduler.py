"""Continuous batching's scheduler: which sequences are in the batch and which cache rows they hold.

The scheduler knows no model and no tensor (vLLM keeps its scheduler apart from its model runner
in the same way; `attnlab.decode.runner` runs the steps). It holds the sequences being decoded:
those in the cache, `cached[i]` owning row i, so that the rows in use are always 0 … A−1; and
those whose window slides (`windowed`), which have filled block_size positions and are recomputed
in full at each step, unless the model's cache rolls (`rolls`: window attention with positions
inside attention, `attnlab.decode.sampling.rolls_past_block`), where nothing slides and a
sequence stays in its row however long it grows. It groups the prompts that join together for prefilling, places them in
the next free rows, records each new token and lets finished sequences leave: the last row's
sequence then moves into the row set free, and the scheduler asks its `move_row` to copy the
cache row over.

It talks to the runner in one object each way, as vLLM's scheduler does: `schedule` (a step) and
`schedule_prefill` (a group that joins) say what the model is to read, a `SchedulerOutput`; the
runner answers with a `RunnerOutput`, a token (and its score) for each of the output's sequences,
which `update_from_output` records. Nothing here imports PyTorch (`attnlab.decode.requests` holds
the plain data a sequence carries).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from attnlab.decode.requests import Penalties, Picker, TokenMask, TokenScore

PAD_SLACK = 8  # pad tokens a prompt may take to share its prefill forward (see `Scheduler.prefill_groups`)

PREFILL_MODES = ("unpadded", "padded", "equal", "alone")
"""How a runner prefills several prompts: all in one call whatever their lengths ("unpadded"), those
of similar lengths in one call, padded to the longest ("padded"), those of the same length in one
call ("equal": a rolling cache, where a pad would take a prompt key's slot), or one prompt per call
("alone")."""

RowMove = Callable[[int, int, int], None]
"""move_row(from_row, to_row, slots): copy the first `slots` cache slots of one row into another."""

RowLeaving = Callable[["Sequence"], None]
"""on_leave(seq): seq is about to give up its cache row, which still holds what it wrote."""

RowJoined = Callable[["Sequence"], None]
"""on_join(seq): seq has just taken its cache row, which holds its prefilled window."""


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
    penalties: Penalties | None = None  # presence, frequency, logit bias: its logits before the pick
    logprobs: int | None = None  # score each new token, with this many most likely others (None: no scores)
    echo_logprobs: bool = False  # score the prompt's tokens too, when it joins (`prompt_scores`)
    scores: list[TokenScore] = field(default_factory=list)  # tokens[i]'s score, when logprobs is set
    prompt_scores: list[TokenScore | None] = field(default_factory=list)  # prompt[0]'s is None
    mask: TokenMask | None = None  # the tokens allowed at each step (a grammar): applied before the pick
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache, not a prefill

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class SchedulerOutput:
    """What the runner is to compute in one call, and for whom: a token for each of `seqs`, in
    that order. Either a prefill (`prompts` into rows first_row, first_row + 1, …, with `cached`
    tokens of a lone prompt already in its row: a cached prefix) or a step (the cached rows 0 …
    A−1 each read `step_tokens[r]` at `step_positions[r]`; `windows`, sliding, are read in full,
    with `free_row` the first row no sequence holds)."""

    seqs: list[Sequence]
    prompts: list[list[int]] = field(default_factory=list)
    first_row: int = 0
    cached: int = 0
    step_tokens: list[int] = field(default_factory=list)
    step_positions: list[int] = field(default_factory=list)
    windows: list[list[int]] = field(default_factory=list)

    @property
    def free_row(self) -> int:
        """The first row no sequence holds during a step: the rows after the stepping ones."""
        return len(self.step_tokens)


@dataclass(frozen=True)
class RunnerOutput:
    """The runner's answer to a `SchedulerOutput`: the token picked for each of its sequences, in
    order, and its score where the sequence asked for scores (None elsewhere)."""

    tokens: list[int]
    scores: list[TokenScore | None]


class Scheduler:
    """The sequences decoded together over a cache of `max_batch` rows of `block` slots each.

    `admit` checks new sequences in, `prefill_groups` groups them for prefilling and `place` gives
    them the next free rows; before each step `slide_full` moves the sequences with no slot left
    to the sliding windows, after it `stepped` counts the slot each cached row wrote and `record`
    gives each sequence its token, finished ones leaving (`leave`). `move_row` is called whenever
    a sequence changes rows; `on_leave`, where given, just before a sequence gives up its row (the
    prefix cache keeps what the row wrote) and `on_join` just after one takes its row.
    """

    def __init__(
        self,
        max_batch: int,
        block: int,
        move_row: RowMove,
        *,
        rolls: bool = False,
        on_leave: RowLeaving | None = None,
        on_join: RowJoined | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.block = block
        self.move_row = move_row
        self.on_leave = on_leave
        self.on_join = on_join
        self.rolls = rolls  # the cache rolls: whole prompts are read and no window slides
        self.cached: list[Sequence] = []  # cached[i] owns row i of the cache
        self.windowed: list[Sequence] = []  # past block_size: recomputed in full at each step

    def __len__(self) -> int:
        return len(self.cached) + len(self.windowed)

    @property
    def free_row(self) -> int:
        """The first row no sequence holds: the next to join goes there."""
        return len(self.cached)

    def admit(self, seqs: list[Sequence]) -> list[Sequence]:
        """Check that new sequences (each with a prompt of at least one token and nothing generated
        yet) fit in the batch; those that ask for no token are done at once. Returns the others,
        to prefill."""
        if len(self) + len(seqs) > self.max_batch:
            raise RuntimeError(f"the batch is full ({self.max_batch} sequences)")
        if any(not s.prompt for s in seqs):
            raise ValueError("a prompt needs at least one token")
        for seq in seqs:
            if seq.max_new_tokens <= 0:
                seq.finish_reason = "length"
        return [s for s in seqs if not s.done]

    def window(self, seq: Sequence) -> list[int]:
        """The tokens the model reads for seq's next token: its last block_size tokens (all of
        them where the cache rolls)."""
        tokens = seq.prompt + seq.tokens
        return tokens if self.rolls else tokens[-self.block :]

    def window_length(self, seq: Sequence) -> int:
        """len(self.window(seq)), without making the window."""
        n = len(seq.prompt) + len(seq.tokens)
        return n if self.rolls else min(n, self.block)

    def prefill_groups(self, seqs: list[Sequence], mode: str) -> list[list[Sequence]]:
        """The sequences grouped for prefilling in the runner's `mode` (`PREFILL_MODES`). Padded,
        longest prompts first, a shorter prompt joins a group when padding it to the group's length
        costs at most PAD_SLACK tokens or half the length: a forward's fixed cost (launching every
        layer, reading every weight) is worth about that much compute on a CPU."""
        if mode == "unpadded":
            return [seqs] if seqs else []
        if mode == "alone":
            return [[s] for s in seqs]
        if mode == "equal":
            by_length: dict[int, list[Sequence]] = {}
            for seq in seqs:
                by_length.setdefault(self.window_length(seq), []).append(seq)
            return list(by_length.values())
        groups: list[list[Sequence]] = []
        for seq in sorted(seqs, key=lambda s: -self.window_length(s)):
            longest = self.window_length(groups[-1][0]) if groups else 0
            if groups and longest - self.window_length(seq) <= max(PAD_SLACK, longest // 2):
                groups[-1].append(seq)
            else:
                groups.append([seq])
        return groups

    def place(self, group: list[Sequence]) -> None:
        """Give a prefilled group the next free rows, in order; each has written its window."""
        first = self.free_row
        for i, seq in enumerate(group):
            seq.row, seq.filled = first + i, self.window_length(seq)
        self.cached.extend(group)
        if self.on_join is not None:
            for seq in group:
                self.on_join(seq)

    def schedule_prefill(self, group: list[Sequence], cached: int = 0) -> SchedulerOutput:
        """A group to prefill (one of `prefill_groups`) into the next free rows: each sequence's
        window; `cached`: the tokens of a lone sequence's window that its row already holds."""
        if cached and len(group) != 1:
            raise ValueError("a cached prefix is prefilled after one sequence at a time")
        return SchedulerOutput(list(group), [self.window(s) for s in group], self.free_row, cached)

    def schedule(self) -> SchedulerOutput:
        """The next step: the sequences with no slot left first slide (`slide_full`); then every
        cached row reads its last token at its next slot, and every sliding window is read whole."""
        self.slide_full()
        cached, windowed = list(self.cached), list(self.windowed)
        tokens, positions = [s.tokens[-1] for s in cached], [s.filled for s in cached]
        return SchedulerOutput(cached + windowed, step_tokens=tokens, step_positions=positions,
                               windows=[self.window(s) for s in windowed])  # fmt: skip

    def update_from_output(self, scheduled: SchedulerOutput, output: RunnerOutput) -> None:
        """Take the runner's answer to `scheduled`: a prefilled group takes its rows, a step's
        cached rows count the slot they wrote; then each sequence gets its token (its mask, where
        it has one, takes it too) and those that finish leave (`record`)."""
        if scheduled.prompts:
            self.place(scheduled.seqs)
        else:
            self.stepped()
        for seq, token in zip(scheduled.seqs, output.tokens, strict=True):
            if seq.mask is not None:
                seq.mask.accept(token)
        self.record(scheduled.seqs, output.tokens, output.scores)

    def slide_full(self) -> None:
        """Move the cached sequences with no slot left for their next token to the sliding windows
        (none where the cache rolls)."""
        for seq in [s for s in self.cached if s.filled >= self.block and not self.rolls]:
            self.leave(seq)
            self.windowed.append(seq)

    def stepped(self) -> None:
        """Count the slot every cached row has just written."""
        for seq in self.cached:
            seq.filled += 1

    def record(self, seqs: list[Sequence], tokens: list[int], scores: list[TokenScore | None] | None = None) -> None:
        """Give each sequence its next token (and its score, where there is one); those that it
        finishes (the end-of-text token, the end of what its mask allows, max_new_tokens) leave."""
        for i, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
            seq.tokens.append(token)
            if scores is not None and scores[i] is not None:
                seq.scores.append(scores[i])
            if seq.eos_id is not None and token == seq.eos_id:
                seq.finish_reason = "stop"
            elif seq.mask is not None and seq.mask.finished:  # its grammar is complete
                seq.finish_reason = "stop"
            elif len(seq.tokens) >= seq.max_new_tokens:
                seq.finish_reason = "length"
            if seq.done:
                self.leave(seq)

    def leave(self, seq: Sequence) -> None:
        """Take seq out of the batch (finished, or no longer wanted); its row goes to the last
        row's sequence, whose cache row moves there (`move_row`)."""
        if seq.row >= 0:
            if self.on_leave is not None:
                self.on_leave(seq)
            last = self.cached.pop()
            if last is not seq:
                self.move_row(last.row, seq.row, last.filled)  # the slots written so far, all the row holds
                last.row = seq.row
                self.cached[seq.row] = last
            seq.row = -1
        elif seq in self.windowed:
            self.windowed.remove(seq)


__all__ = [
    "PAD_SLACK",
    "PREFILL_MODES",
    "RowJoined",
    "RowLeaving",
    "RunnerOutput",
    "Scheduler",
    "SchedulerOutput",
    "Sequence",
]
