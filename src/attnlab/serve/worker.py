"""One model's decoding thread: completions asked for by the web app's event loop, decoded together
by continuous batching (`attnlab.decode.batching`), their text sent back piece by piece.

The event loop must never wait on the model, and the model must never wait on a slow client: each
request is a `Stream` whose pieces the decoding thread hands to the loop
(`call_soon_threadsafe`, every stream's pieces of a step at once: `Outbox`) and whose `cancel`
the loop sets. A stream yields its pieces one by one, a token's text each, as soon as the step
that decoded it ends: a client sees one event per token, never a burst of them. New requests wait
in a bounded queue (past it: `QueueFull`, the app's 429) and join the batch between steps; a
cancelled one leaves at the next step.
"""

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch

from attnlab.accel.plan import plan_decoding
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.batching import Batcher, Sequence
from attnlab.decode.sampling import Penalties, Picker, TokenMask, TokenScore, sampling_picker
from attnlab.decode.text import TextPieces
from attnlab.models.protocols import CausalDecoder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    """How one completion is decoded."""

    max_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None  # a generator of the stream's own: the same seed gives the same text
    stop: tuple[str, ...] = ()  # the text ends before the first stop string
    penalties: Penalties | None = None  # presence, frequency, logit bias (OpenAI's)
    logprobs: int | None = None  # score every new token, with this many most likely others
    echo_logprobs: bool = False  # score the prompt's tokens too (`Stream.prompt_scores`)
    mask: TokenMask | None = None  # the tokens allowed at each step (a grammar); the stream's own

    def picker(self, device: torch.device) -> Picker | None:
        """The stream's token picker; None for greedy (which the batch takes for all rows at once)."""
        if self.temperature == 0:
            return None
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        top_p = self.top_p if self.top_p < 1.0 else None
        return sampling_picker(self.temperature, self.top_k, top_p, generator)


class QueueFull(Exception):
    """The model's queue is at its bound; try again after `retry_after` seconds."""

    def __init__(self, waiting: int, retry_after: float) -> None:
        super().__init__(f"{waiting} requests are already waiting for this model; retry in {retry_after:g} s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Piece:
    text: str  # new text: whole characters, never part of a stop string
    tokens: int  # the new tokens it covers
    scores: tuple[TokenScore, ...] = ()  # their scores, when the stream asked for logprobs


class Stream:
    """One completion. Iterate it (`async for piece in stream`) in the event loop's thread."""

    def __init__(
        self, prompt_ids: list[int], sampling: Sampling, loop: asyncio.AbstractEventLoop, outbox: "Outbox"
    ) -> None:
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        self.finish_reason: str | None = None  # "stop" or "length" once finished
        self.error: str | None = None  # set when decoding failed on the server
        self.prompt_scores: list[TokenScore | None] = []  # set when it joins, before its first piece
        self.cached_tokens = 0  # prompt tokens the prefix cache held, set when it joins (`usage`)
        self.cancelled = False
        self._loop, self._outbox = loop, outbox
        self._pieces: asyncio.Queue[Piece | None] = asyncio.Queue()
        self._unsent = 0  # tokens not yet covered by a piece (no whole character yet)
        self._unsent_scores: list[TokenScore] = []  # and their scores

    def cancel(self) -> None:
        """Stop decoding this completion; its batch row is freed at the next step. Thread-safe."""
        self.cancelled = True

    async def __aiter__(self) -> AsyncIterator[Piece]:
        # One piece at a time, never those that piled up joined into one: a client reads a token's
        # text as an event of its own (merging them sent a 20-token completion in 2 events).
        while (piece := await self._pieces.get()) is not None:
            yield piece

    # The decoding thread's side.
    def _send(self, text: str, count: int, scores: list[TokenScore] | None = None) -> None:
        self.completion_tokens += count
        self._unsent += count
        self._unsent_scores.extend(scores or ())
        if text:
            self._put(Piece(text, self._unsent, tuple(self._unsent_scores)))
            self._unsent, self._unsent_scores = 0, []

    def _end(self, finish_reason: str | None, error: str | None = None) -> None:
        if self._unsent_scores:  # tokens whose text never came (held back, then cut by a stop string)
            self._put(Piece("", self._unsent, tuple(self._unsent_scores)))
            self._unsent, self._unsent_scores = 0, []
        self.finish_reason, self.error = finish_reason, error
        self._put(None)

    def _put(self, item: Piece | None) -> None:
        self._outbox.put(self._loop, self._pieces, item)


class Outbox:
    """What the decoding thread has for the event loops' streams, handed over together after each
    step: one wake-up of a loop per step, where one per token woke it (and made the two threads
    pass the interpreter's lock back and forth) as many times as the batch has rows."""

    def __init__(self) -> None:
        self._items: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Piece | None]]] = {}

    def put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: Piece | None) -> None:
        self._items.setdefault(loop, []).append((queue, item))

    def flush(self) -> None:
        for loop, items in self._items.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the event loop has closed (the server is stopping): nobody is listening
                pass
        self._items.clear()


def _put_all(items: list[tuple[asyncio.Queue, Piece | None]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


class ModelWorker:
    """Decodes the completions of one model in a thread of its own.

    max_batch: sequences decoded together (1: one request at a time). max_queue: requests that may
    wait for a row; more are refused with `QueueFull`. max_prompt_tokens: the longest prompt
    accepted (`context`); the model reads a prompt's last block_size tokens, as `attnlab sample` does.
    fused: the decoding step in C++ (`Batcher`'s); None: where it is built and covers the model.
    weights: how the fused step stores the weights (fp32, bf16, int8, int4, q4_k); with those but fp32, None
    takes the fused step wherever it covers the model, and a model it does not cover decodes in fp32.
    The two are decided once, here (`plan`: `attnlab.accel.plan.plan_decoding`), for every request.
    cache_memory: bytes of recent prompts' keys and values kept for the prompts that begin the same
    way (`attnlab.decode.prefix_cache`); 0: none.
    """

    def __init__(
        self,
        model: CausalDecoder,
        tokenizer: Tokenizer,
        *,
        max_batch: int = 32,
        max_queue: int = 64,
        batched: bool = True,
        max_prompt_tokens: int = 4096,
        fused: bool | None = None,
        weights: str = "fp32",
        cache_memory: int = 0,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.plan = plan_decoding(model, fused=fused, weights=weights)  # decided once, for every request
        self.batcher = Batcher(model, max_batch if batched else 1, plan=self.plan, prefix_memory=cache_memory)
        self.max_queue = max_queue
        self.context = max_prompt_tokens
        self.generated_tokens = 0
        self._waiting: collections.deque[Stream] = collections.deque()
        self._running: dict[Sequence, tuple[Stream, TextPieces]] = {}
        self._outbox = Outbox()  # the decoding thread's alone
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="attnlab-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def submit(self, prompt_ids: list[int], sampling: Sampling) -> Stream:
        """Queue a completion of prompt_ids (at least one id). Call from the event loop's thread."""
        if not prompt_ids:
            raise ValueError("a prompt needs at least one token")
        stream = Stream(list(prompt_ids), sampling, asyncio.get_running_loop(), self._outbox)
        with self._wake:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(len(self._waiting), retry_after=1.0)
            self._waiting.append(stream)
            self._wake.notify()
        return stream

    def stats(self) -> dict:
        return {
            "active": len(self._running),
            "queued": len(self._waiting),
            "max_batch": self.batcher.scheduler.max_batch,
            "generated_tokens": self.generated_tokens,
            "batched": self.batcher.scheduler.max_batch > 1,
            "prefix_cache_bytes": self.batcher.prefix.nbytes if self.batcher.prefix is not None else 0,
        }

    # The decoding thread.
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._waiting and not self._running:
                    self._wake.wait()
                if self._closed:
                    break
                joining = []
                while self._waiting and len(self._running) + len(joining) < self.batcher.scheduler.max_batch:
                    joining.append(self._waiting.popleft())
            try:
                self._step(joining)
            except Exception as e:  # a request must never take the thread down with it
                log.exception("decoding failed")
                self._fail_all(f"decoding failed on the server: {type(e).__name__}: {e}")
            self._outbox.flush()
        self._fail_all(None)
        for stream in self._waiting:
            stream._end(None)
        self._outbox.flush()

    def _step(self, joining: list[Stream]) -> None:
        for seq, (stream, _) in list(self._running.items()):
            if stream.cancelled:  # a client gone: free its row before the step
                self.batcher.leave(seq)
                del self._running[seq]
                stream._end(None)
        starting = []
        for stream in joining:
            if stream.cancelled:
                stream._end(None)
                continue
            seq = self._sequence(stream)
            starting.append(seq)
            self._running[seq] = (stream, TextPieces(self.tokenizer, stream.sampling.stop))
        for seq in self.batcher.join_all(starting):  # the prompts that arrived together: prefilled together
            stream = self._running[seq][0]
            stream.prompt_scores, stream.cached_tokens = seq.prompt_scores, seq.cached_tokens
            self._deliver(seq)
        for seq in self.batcher.step():
            self._deliver(seq)

    def _sequence(self, stream: Stream) -> Sequence:
        """The batch's sequence of a stream: its prompt, and how its tokens are picked and scored."""
        s = stream.sampling
        return Sequence(
            list(stream.prompt_ids),
            s.max_tokens,
            s.picker(self.batcher.runner.device),
            self.tokenizer.eos_id,
            penalties=s.penalties,
            logprobs=s.logprobs,
            echo_logprobs=s.echo_logprobs,
            mask=s.mask,
        )

    def _deliver(self, seq: Sequence) -> None:
        """Hand the sequence's newest token to its stream as text; end the stream when it is done."""
        stream, pieces = self._running[seq]
        if not seq.tokens:  # max_tokens 0: done when it joined
            self._finish(seq, "length")
            return
        self.generated_tokens += 1
        token = seq.tokens[-1]
        if seq.finish_reason == "stop" and token == seq.eos_id:  # the end-of-text token: no text of its own
            stream._send(pieces.finish(), 0)
            self._finish(seq, "stop")
            return
        text, stopped = pieces.add(token)
        scores = seq.scores[-1:] if seq.logprobs is not None else []
        if stopped:
            stream._send(text, 1, scores)
            self.batcher.leave(seq)
            self._finish(seq, "stop")
        elif seq.done:  # max_tokens, or the end of what its mask allows ("stop")
            stream._send(text + pieces.finish(), 1, scores)
            self._finish(seq, seq.finish_reason)
        else:
            stream._send(text, 1, scores)

    def _finish(self, seq: Sequence, reason: str) -> None:
        stream, _ = self._running.pop(seq)
        stream._end(reason)

    def _fail_all(self, error: str | None) -> None:
        for seq, (stream, _) in list(self._running.items()):
            self.batcher.leave(seq)
            stream._end(None, error)
        self._running.clear()
