"""Decoding as pure functions outside the models: greedy, sampling, logit filters.

Every strategy runs the same loop: one prefill of the prompt into a preallocated KV cache, then
one-token decoding steps that attend to the cache, each writing its key and value with
`KVCache.update`. Eager steps write after the filled slots and attend to those alone. Compiled
steps (`compile=True`) have the same shapes every time: they write at a position given as a tensor
and attend to the whole cache, masked up to their position, so they compile once. When the
sequence outgrows the model's block_size the window slides: the next token is predicted from the
last block_size tokens, recomputed in full (with absolute positions, every cached key would sit at
the wrong position after a shift). A window-attention model whose positions are offsets inside
attention (`rolls_past_block`) needs no shift: its cache is a ring of the window's keys, and it
reads the whole prompt and goes on past block_size in the cache.

The model interface: `model(idx, cache=..., positions=..., last_only=True) -> logits (B, 1, V)`,
`model.new_cache(batch_size, max_len)`, `model.config.block_size`.
"""

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.accel import for_decoding
from attnlab.accel.plan import EAGER, DecodePlan, plan_decoding
from attnlab.decode.requests import Penalties, Picker, TokenMask, TokenScore
from attnlab.models.protocols import CausalDecoder
from attnlab.nn.positions import NoPositions


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the rest to -inf. logits `(B, V)`."""
    k = min(k, logits.size(-1))
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of tokens whose probability
    sums to at least p (the most likely token always stays). logits `(B, V)`."""
    if p >= 1.0:  # everything; a float32 running sum can reach 1 before the tail and cut it
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Drop a token when the tokens before it already reach p.
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def greedy_picker() -> Picker:
    return lambda logits: logits.argmax(dim=-1)


def sampling_picker(
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Picker:
    """Sample from softmax(logits / temperature) after the optional top-k and top-p filters."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        return greedy_picker()
    return Sampler(temperature, top_k, top_p, generator)


@dataclass(frozen=True, eq=False)
class Sampler:
    """A sampling picker (`sampling_picker`): logits `(B, V)` -> token ids `(B,)`."""

    temperature: float
    top_k: int | None
    top_p: float | None
    generator: torch.Generator | None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float() / self.temperature
        if self.top_k is not None:
            logits = top_k_filter(logits, self.top_k)
        if self.top_p is not None:
            logits = top_p_filter(logits, self.top_p)
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    @property
    def plain(self) -> bool:
        """Temperature alone, no filter: `pick_rows` draws such rows together."""
        return self.top_k is None and self.top_p is None


def penalize(logits: torch.Tensor, penalties: list[Penalties | None], generated: list[list[int]]) -> torch.Tensor:
    """Row i of logits `(B, V)` with penalties[i] applied over the tokens generated[i]; the same
    tensor when no row has any (no copy on the common path). Float32 rows `(B, V)` otherwise."""
    rows = [i for i, p in enumerate(penalties) if p is not None and p.active]
    if not rows:
        return logits
    out = logits.float().clone()
    counts = torch.zeros(len(rows), out.size(-1), device=out.device)  # c[j] of each penalized row
    for r, i in enumerate(rows):
        if generated[i]:
            ids = torch.tensor(generated[i], dtype=torch.long, device=out.device)
            counts[r].index_add_(0, ids, torch.ones(len(ids), device=out.device))
    frequency = out.new_tensor([[penalties[i].frequency] for i in rows])
    presence = out.new_tensor([[penalties[i].presence] for i in rows])
    adjusted = out[rows] - counts * frequency - (counts > 0).float() * presence
    for r, i in enumerate(rows):
        for token, bias in penalties[i].bias:
            adjusted[r, token] += bias
    out[rows] = adjusted
    return out


def mask_rows(logits: torch.Tensor, masks: list[TokenMask | None]) -> torch.Tensor:
    """logits `(B, V)` with row i's forbidden tokens at -inf where masks[i] is set (the rows
    without a mask are left as they are; a copy when any row has one)."""
    rows = [i for i, m in enumerate(masks) if m is not None]
    if not rows:
        return logits
    allowed = torch.stack([masks[i].allowed(logits.size(-1)) for i in rows]).to(logits.device)  # (R, V)
    if len(rows) == len(masks):  # every row masked: one fill, no gather and scatter of rows
        return logits.masked_fill(~allowed, float("-inf"))
    out = logits.clone()
    out[rows] = out[rows].masked_fill(~allowed, float("-inf"))
    return out


def token_scores(logits: torch.Tensor, tokens: list[int], tops: list[int | None]) -> list[TokenScore | None]:
    """Row i's score of tokens[i] under log_softmax(logits[i]) `(B, V)` (the model's own
    distribution: no temperature, filter or penalty), with its tops[i] most likely tokens; None for
    the rows whose tops[i] is None (nobody asked)."""
    scores: list[TokenScore | None] = [None] * len(tokens)
    rows = [i for i, n in enumerate(tops) if n is not None]
    if not rows:
        return scores
    logprobs = torch.log_softmax(logits[rows].float(), dim=-1)  # (R, V)
    chosen = logprobs.gather(1, logprobs.new_tensor([[tokens[i]] for i in rows], dtype=torch.long))[:, 0]
    most = max(tops[i] for i in rows)
    best = torch.topk(logprobs, min(most, logprobs.size(-1)), dim=-1) if most > 0 else None
    for r, i in enumerate(rows):
        top = ()
        if best is not None and tops[i]:
            ids, values = best.indices[r, : tops[i]].tolist(), best.values[r, : tops[i]].tolist()
            top = tuple(zip(ids, values, strict=True))
        scores[i] = TokenScore(tokens[i], float(chosen[r]), top)
    return scores


def prompt_scores(logits: torch.Tensor, prompt: list[int], top: int) -> list[TokenScore | None]:
    """Each prompt token's score given the tokens before it, from the model's logits over the
    prompt `(T, V)` (row t predicts token t + 1); the first token has none (None), as in OpenAI's
    `echo`."""
    return [None, *token_scores(logits[:-1], prompt[1:], [top] * (len(prompt) - 1))]


def pick_rows(pickers: list[Picker | None], logits: torch.Tensor) -> list[int]:
    """Row i's next token by pickers[i] (each with its own settings and generator; None: greedy,
    the argmax of every such row taken at once), logits `(B, V)`.

    The rows of plain `Sampler`s (temperature alone) are drawn together, with the very tokens
    their pickers would draw one by one: torch.multinomial takes one sample as the largest
    p / E over the vocabulary, E ~ Exp(1) drawn from the row's generator, and so does this, one
    small draw per row in place of a whole softmax-and-sample per row (measured with
    `benchmarks/prefill_step.py`: BENCHMARKS.md, "`attnlab serve` under load")."""
    tokens: list[int | None] = [None] * len(pickers)
    greedy = [i for i, p in enumerate(pickers) if p is None]
    if greedy:
        for i, token in zip(greedy, logits[greedy].argmax(dim=-1).tolist(), strict=True):
            tokens[i] = token
    plain = [i for i, p in enumerate(pickers) if isinstance(p, Sampler) and p.plain]
    if plain:
        temperatures = logits.new_tensor([[pickers[i].temperature] for i in plain], dtype=torch.float32)
        probs = torch.softmax(logits[plain].float() / temperatures, dim=-1)
        noise = torch.empty_like(probs)
        for row, i in enumerate(plain):
            noise[row].exponential_(1, generator=pickers[i].generator)
        for i, token in zip(plain, (probs / noise).argmax(dim=-1).tolist(), strict=True):
            tokens[i] = token
    for i, pick in enumerate(pickers):
        if tokens[i] is None:
            tokens[i] = int(pick(logits[i : i + 1])[0])
    return tokens


@contextlib.contextmanager
def _eval_mode(model: nn.Module):
    was_training = model.training
    if was_training:  # model.eval() walks every submodule: not at every step when already eval
        model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train()


class _Step:
    """The one-token decoding step, through torch.compile when asked for. Compilation happens at
    the first call; if it fails there (or torch.compile is unavailable), a warning says so and the
    step runs eagerly.

    torch.compile checks its guards (the inputs' shapes, the model, the cache objects, every
    parameter) before each call, a sizeable part of a small model's step (docs/history.md,
    "Decoding: stream the weights, then fuse the step"). Within one generation
    every step after the first passes the same objects with the same shapes, so those later
    steps skip the guards that cannot tell cache entries apart (`skip_guard_eval_unsafe`; what
    keeps it safe here is that nothing but the token and position values changes)."""

    def __init__(self, model: CausalDecoder, plan: DecodePlan) -> None:
        self.model = model
        self.compile = plan.compile
        self.compile_options = plan.compile_options
        self.compiled: nn.Module | None = None
        self.fused = plan.fused  # still to be made: at the first step, in eval mode
        self.weights = plan.weights
        self.fused_step: Callable[[torch.Tensor, list, int], torch.Tensor] | None = None  # if the model qualifies

    def _make_fused(self, cache: list) -> None:
        if self.fused:
            from attnlab.accel.fused import gpt_step  # a build only where asked for

            self.fused_step = gpt_step(self.model, cache, self.weights)
            self.fused = False

    @property
    def _reads_stored_weights(self) -> bool:
        """Whether the fused step reads bf16 or int8 copies of the weights: then the prompts and the
        slid windows go through it too, or they would see other weights than the steps."""
        return self.weights != "fp32" and self.fused_step is not None

    def prefill(self, prompt: torch.Tensor, cache: list, chunk: int) -> torch.Tensor:
        """Logits `(B, 1, V)` after the prompt `(B, T)`, its keys and values written to the cache,
        `chunk` tokens at a time (a rolling cache takes a prompt of any length, each chunk
        attending to the ring and itself). With bf16 or int8 weights the fused step reads it whole
        (it covers full attention only, so the prompt fits its block)."""
        if self.weights != "fp32":
            self._make_fused(cache)
            if self._reads_stored_weights:
                return self.fused_step.prefill(prompt.tolist(), 0).unsqueeze(1)
        for start in range(0, prompt.size(1), chunk):
            part = prompt[:, start : start + chunk]
            if self.compile:  # the static path: positions as a tensor, the whole cache attended
                positions = torch.arange(start, start + part.size(1), device=prompt.device)
                logits = self.model(part, cache=cache, positions=positions, last_only=True)
            else:
                logits = self.model(part, cache=cache, last_only=True)
        return logits

    def __call__(self, token: torch.Tensor, cache: list, position: int) -> torch.Tensor:
        if self.compile:
            positions = torch.full((1,), position, dtype=torch.long, device=token.device)
            try:
                if self.compiled is None:  # the first call is guarded: it picks or compiles the entry
                    options = dict(self.compile_options)
                    self.compiled = torch.compile(self.model, dynamic=False, options=options)
                    return self.compiled(token, cache=cache, positions=positions, last_only=True)
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self.compiled(token, cache=cache, positions=positions, last_only=True)
            except Exception as e:  # the compiler's failure; an eager error would repeat below
                warnings.warn(f"compiled decoding failed ({type(e).__name__}); decoding eagerly", stacklevel=3)
                self.compile = False
                cache.length = position  # hand over to the growing path, which counts the filled slots
        self._make_fused(cache)
        if self.fused_step is not None:
            return self.fused_step(token, cache, position)
        # Eagerly, attending to the filled slots alone costs less than the static path's mask
        # over the whole buffer, and shapes that change every step cost nothing.
        return self.model(token, cache=cache, last_only=True)

    def window(self, seq: torch.Tensor) -> torch.Tensor:
        """Logits `(B, 1, V)` after a window `(B, block_size)` read in full (the window slides)."""
        if self._reads_stored_weights:  # prefilled afresh into the cache's rows, which nothing reads any more
            return self.fused_step.prefill(seq.tolist(), 0).unsqueeze(1)
        return self.model(seq, last_only=True)


def rolls_past_block(model: nn.Module) -> bool:
    """Whether decoding reads the whole sequence, past block_size, with no recomputation: a GPT
    with window attention (whose cache is a ring, `attnlab.nn.RollingKVCache`) that adds no
    position at its input (its positions are offsets inside attention: rope, alibi, relative; or
    none), so that no cached key changes meaning as the sequence grows. With learned or other
    absolute positions the window slides instead: the last block_size tokens, recomputed."""
    return (
        getattr(model.config, "attention", None) == "window"
        and isinstance(getattr(model, "positions", None), NoPositions)
        and getattr(model, "step_signal", None) is None
    )


def generate_tokens(
    model: CausalDecoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    pick: Picker,
    *,
    eos_id: int | None = None,
    use_cache: bool = True,
    compile: bool = False,
    fused: bool = False,
    weights: str = "fp32",
    plan: DecodePlan | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the next token ids `(B,)` one step at a time, after the prompt idx `(B, T)` (long).

    With `eos_id`, a sequence that produced it keeps producing it (padding), and the iteration
    ends when every sequence has. The model runs in eval mode without autograd. `use_cache=False`
    recomputes the whole window at every step (the reference); `compile` runs the cached
    decoding step through torch.compile (worth it for long generations; the first call compiles);
    `fused` runs it as one C++ call (`attnlab.accel.fused`: pre-norm GPTs on the CPU; built on
    first use), its products reading the weights as `weights` says (`attnlab.accel.fused.WEIGHT_FORMATS`:
    fp32, bf16 or int8; the prompt then goes through the fused step too). `plan`: those three
    decided already (`attnlab.accel.plan.plan_decoding`, by the caller that loaded the model), in
    place of `compile`, `fused` and `weights`. The projections take the decoding routes
    (`attnlab.accel.for_decoding`, in place)."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ValueError(f"prompt must be a (B, T) tensor with T >= 1, got shape {tuple(idx.shape)}")
    for_decoding(model)
    block = model.config.block_size
    # Eval and inference mode are entered around each model call, never across a `yield`: the
    # caller's code runs between steps and must not inherit them (nor lose them when another
    # generator, suspended in between, exits its context out of order).
    new: list[torch.Tensor] = []  # the generated tokens (B,); the whole sequence only when the window slides
    if plan is None:
        plan = plan_decoding(model, fused=fused and use_cache, weights=weights, compile=compile and use_cache)
    elif not use_cache:
        plan = EAGER  # the fused and compiled steps write a cache
    step = _Step(model, plan)
    rolls = rolls_past_block(model)
    with _eval_mode(model):
        prompt = idx if rolls else idx[:, -block:]
        filled = prompt.size(1)  # positions written to the cache so far
        if use_cache:
            cache = model.new_cache(idx.size(0), block)
            logits = step.prefill(prompt, cache, block)
        else:
            cache = None
            logits = model(prompt, last_only=True)
    done = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
    for i in range(max_new_tokens):
        token = pick(logits[:, -1, :])
        if eos_id is not None:
            token = token.masked_fill(done, eos_id)
            done = done | (token == eos_id)
        yield token
        if i == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
            return  # no forward for logits nobody reads
        if cache is None or not rolls:  # kept for recomputing; a rolling cache never needs them
            new.append(token)
        if cache is not None and (filled < block or rolls):
            # A fused step is plain C++ over the weights: no autograd, no dropout to switch off.
            with contextlib.nullcontext() if step.fused_step is not None else _eval_mode(model):
                logits = step(token[:, None], cache, filled)
            filled += 1
        else:
            cache = None  # the window slides from here on
            seq = torch.cat([idx, torch.stack(new, dim=1)], dim=1)
            with _eval_mode(model):
                logits = model(seq, last_only=True) if rolls else step.window(seq[:, -block:])


def _collect(idx: torch.Tensor, tokens: Iterator[torch.Tensor]) -> torch.Tensor:
    new = list(tokens)
    return torch.cat([idx, torch.stack(new, dim=1)], dim=1) if new else idx


def greedy(
    model: CausalDecoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_id: int | None = None,
    use_cache: bool = True,
    compile: bool = False,
    fused: bool = False,
    weights: str = "fp32",
) -> torch.Tensor:
    """Extend idx `(B, T)` with the most likely token at each step -> `(B, T + N)`, N <= max_new_tokens.
    The options are `generate_tokens`'."""
    options = dict(eos_id=eos_id, use_cache=use_cache, compile=compile, fused=fused, weights=weights)
    tokens = generate_tokens(model, idx, max_new_tokens, greedy_picker(), **options)
    return _collect(idx, tokens)


def sample(
    model: CausalDecoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    *,
    eos_id: int | None = None,
    use_cache: bool = True,
    compile: bool = False,
    fused: bool = False,
    weights: str = "fp32",
) -> torch.Tensor:
    """Extend idx `(B, T)` by sampling -> `(B, T + N)`, N <= max_new_tokens. temperature 0 is greedy.
    The options are `generate_tokens`'."""
    pick = sampling_picker(temperature, top_k, top_p, generator)
    options = dict(eos_id=eos_id, use_cache=use_cache, compile=compile, fused=fused, weights=weights)
    tokens = generate_tokens(model, idx, max_new_tokens, pick, **options)
    return _collect(idx, tokens)
