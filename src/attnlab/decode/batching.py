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

from attnlab.accel.plan import DecodePlan, plan_decoding
from attnlab.decode.prefix_cache import BLOCK_TOKENS, block_keys, for_cache
from attnlab.decode.requests import Picker
from attnlab.decode.runner import Runner, takes_row_positions
from attnlab.decode.sampling import prompt_scores
from attnlab.decode.scheduler import Scheduler, SchedulerOutput, Sequence
from attnlab.models.protocols import CausalDecoder


class Batcher:
    """The sequences decoded together by one model (a GPT-style decoder: `model(idx, cache=...,
    positions=..., last_only=True)`, `model.new_cache`, `model.config.block_size`).

    `join` prefills a sequence and picks its first token (`join_all`: several, prompts of similar
    lengths in one forward); `step` gives every sequence its next token; sequences that finish
    leave by themselves, `leave` takes one out early (a client gone, a stop string). `fused`: the
    cached rows' step in C++ where `attnlab.accel.fused` covers the model (a warning and
    PyTorch's path where it does not), its weights fp32, bf16, int8, int4 or q4_k (`weights`); or `plan`,
    those two decided already where the model was loaded (`attnlab.accel.plan.plan_decoding`).
    Not thread-safe: one thread drives it.

    `prefix_memory`: bytes of cached prompt prefixes (`prefix`, a `PrefixCache` in blocks of
    `prefix_block` tokens; None where 0 or where the cache rolls); each sequence's `cached_tokens`
    says how many of its prompt's tokens it reused.

    Its two halves are its attributes: `scheduler` (who holds which row: `max_batch`, `cached`,
    `windowed`) and `runner` (the model's steps over those rows: `model`, `cache`, `fused`,
    `device`), which pass one object each way (`SchedulerOutput`, `RunnerOutput`).
    """

    def __init__(
        self,
        model: CausalDecoder,
        max_batch: int = 32,
        *,
        fused: bool = False,
        weights: str = "fp32",
        plan: DecodePlan | None = None,
        prefix_memory: int = 0,
        prefix_block: int = BLOCK_TOKENS,
    ) -> None:
        if plan is None:  # as asked: the caller decided
            plan = plan_decoding(model, fused=fused, weights=weights)
        self.runner = Runner(model, max_batch, plan)
        # the prompts' cached prefixes (`attnlab.decode.prefix_cache`), at most prefix_memory bytes; None: off
        self.prefix = for_cache(self.runner.cache, prefix_memory, prefix_block)
        keeping = self.prefix is not None
        self.scheduler = Scheduler(
            max_batch,
            model.config.block_size,
            self.runner.move_row,
            rolls=self.runner.rolls,
            on_leave=self._keep_prefix if keeping else None,
            on_join=self._store_prefix if keeping else None,
        )

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
                self._run(self.scheduler.schedule_prefill(group))
            for seq, blocks in ((s, now[s]) for s in now if s.cached_tokens):
                scheduled = self.scheduler.schedule_prefill([seq], seq.cached_tokens)
                self.prefix.load(blocks, scheduled.first_row, seq.cached_tokens)
                self._run(scheduled)
        return seqs

    def _run(self, scheduled: SchedulerOutput) -> None:
        """The runner computes what the scheduler asks for; the scheduler records its answer."""
        self.scheduler.update_from_output(scheduled, self.runner.execute(scheduled))

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

    def _store_prefix(self, seq: Sequence) -> None:
        """Keep the full blocks of the window a sequence has just prefilled into its row."""
        self.prefix.store(self.scheduler.window(seq), seq.row)

    def _keep_prefix(self, seq: Sequence) -> None:
        """Keep the full blocks of what a leaving sequence's row holds (its prompt, then the tokens
        it was fed): a conversation's next turn begins with them."""
        tokens = seq.prompt + seq.tokens
        start = max(0, len(seq.prompt) - self.scheduler.block)  # where its window began when it joined
        self.prefix.store(tokens[start : start + seq.filled], seq.row)

    def step(self) -> list[Sequence]:
        """Feed every sequence its last token and pick the next one. Returns the sequences that
        got a token (finished ones have left the batch)."""
        moving = [*self.scheduler.cached, *self.scheduler.windowed]
        if moving:
            self._run(self.scheduler.schedule())
        return moving

    def leave(self, seq: Sequence) -> None:
        """Take seq out of the batch (finished, or no longer wanted); its row goes to the last row's sequence."""
        self.scheduler.leave(seq)


def _common(a: list[bytes], b: list[bytes]) -> int:
    """How many keys two chains share from their start."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


__all__ = ["Batcher", "Sequence", "takes_row_positions"]
