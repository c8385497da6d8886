"""Text in, text out: prompt encoding, incremental detokenisation and stop strings."""

from collections.abc import Iterable, Iterator, Sequence

import torch

from attnlab.accel.plan import EAGER, DecodePlan
from attnlab.data.tokenizers import Tokenizer
from attnlab.decode.sampling import Picker, generate_tokens
from attnlab.decode.speculative import Speculation, speculative_generate
from attnlab.errors import UserError
from attnlab.models.protocols import CausalDecoder


def encode_prompt(tokenizer: Tokenizer, prompt: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The prompt as ids `(1, T)`. An empty prompt starts from the end-of-text token, or a newline."""
    if prompt:
        ids = tokenizer.encode(prompt)
    elif tokenizer.eos_id is not None:
        ids = [tokenizer.eos_id]
    else:
        try:
            ids = tokenizer.encode("\n")
        except UserError:
            raise UserError("the prompt is empty and this tokenizer has no start token; pass --prompt TEXT") from None
    return torch.tensor([ids], dtype=torch.long, device=device)


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of text could be the start of a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                longest = max(longest, n)
                break
    return longest


class TextPieces:
    """Token ids in, text out, one token at a time: `add` returns the text that can no longer
    change, and whether a stop string has ended the text.

    Byte-level tokens can end inside a UTF-8 character, and a stop string can span tokens, so a
    piece is only released once it can no longer change; the text ends before the first stop
    string. The end-of-text token is the caller's to watch (`finish` releases what is held back).
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]  # an empty stop string would end every completion at once
        self.ids: list[int] = []
        self.emitted = 0  # characters released so far

    def add(self, token_id: int) -> tuple[str, bool]:
        """The new stable text after token_id, and True when a stop string ended the text there."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        hits = [text.find(s, max(0, self.emitted - len(s))) for s in self.stop]
        hits = [h for h in hits if h >= 0]
        if hits:
            piece = text[self.emitted : max(self.emitted, min(hits))]
            self.emitted += len(piece)
            return piece, True
        # An incomplete UTF-8 sequence decodes as U+FFFD: wait for its other bytes. What could
        # start a stop string is held back from the complete characters before it.
        stable = text.rstrip("\ufffd")
        safe = len(stable) - _held_back(stable, self.stop)
        piece = text[self.emitted : max(self.emitted, safe)]
        self.emitted += len(piece)
        return piece, False

    def finish(self) -> str:
        """What was held back, once no token will follow; the first bytes of a character that
        the text ended inside (a max_tokens cut) are dropped rather than sent as U+FFFD."""
        text = self.tokenizer.decode(self.ids).rstrip("\ufffd")
        piece = text[self.emitted :]
        self.emitted = len(text)
        return piece


def stream_text(
    model: CausalDecoder,
    tokenizer: Tokenizer,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    pick: Picker,
    *,
    stop: Sequence[str] = (),
    plan: DecodePlan = EAGER,
    speculation: Speculation | None = None,
) -> Iterator[str]:
    """Yield the continuation of one prompt `(1, T)` as text pieces, as the tokens come (see
    `TextPieces`). `plan` says how the decoding step runs (`attnlab.accel.plan.plan_decoding`:
    compiled, fused, which weights); `speculation` drafts tokens for the step to check
    (`attnlab.decode.speculative`: PyTorch's or, with a fused plan, the fused one; not compiled).
    """
    eos = tokenizer.eos_id
    if speculation is not None:
        tokens = speculative_generate(model, prompt_ids, max_new_tokens, pick, speculation, eos_id=eos, plan=plan)
    else:
        tokens = generate_tokens(model, prompt_ids, max_new_tokens, pick, eos_id=eos, plan=plan)
    yield from token_text(tokenizer, (int(token[0]) for token in tokens), stop)


def token_text(tokenizer: Tokenizer, tokens: Iterable[int], stop: Sequence[str] = ()) -> Iterator[str]:
    """The text of one sequence's new token ids as pieces (`TextPieces`), until the end-of-text
    token or a stop string; the tokens after those are not drawn."""
    pieces = TextPieces(tokenizer, stop)
    for token_id in tokens:
        if token_id == tokenizer.eos_id:
            break
        piece, stopped = pieces.add(token_id)
        if piece:
            yield piece
        if stopped:
            return
    piece = pieces.finish()
    if piece:
        yield piece


def complete(
    model: CausalDecoder,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int,
    pick: Picker,
    *,
    stop: Sequence[str] = (),
    speculation: Speculation | None = None,
) -> str:
    """The continuation of `prompt` (without the prompt), ending before any stop string; with
    `speculation`, drafted and checked (`attnlab.decode.speculative`), the same text or law."""
    device = next(model.parameters()).device
    ids = encode_prompt(tokenizer, prompt, device)
    return "".join(stream_text(model, tokenizer, ids, max_new_tokens, pick, stop=stop, speculation=speculation))
