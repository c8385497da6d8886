"""What a request asks of decoding, as plain data: how its tokens are picked, its penalties, the
tokens a grammar allows, the scores it reports.

Nothing here imports PyTorch: continuous batching's scheduler (`attnlab.decode.scheduler`), which
knows no model and no tensor, holds sequences made of these; `attnlab.decode.sampling` applies
them to logits.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: this module runs without PyTorch
    import torch

Picker = Callable[[Any], Any]
"""logits `(B, V)` (a tensor) -> token ids `(B,)` (a long tensor): `attnlab.decode.sampling`'s
`greedy_picker`, `sampling_picker`."""


@dataclass(frozen=True)
class Penalties:
    """OpenAI's penalties and logit bias for one sequence, applied to its logits before a token
    is picked (OpenAI's "Frequency and presence penalties" guide):

        logits[j] -= c[j] * frequency + (c[j] > 0) * presence + ...; logits[j] += bias[j]

    where c[j] counts token j among the tokens generated so far (not the prompt's)."""

    presence: float = 0.0
    frequency: float = 0.0
    bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), each id once

    @property
    def active(self) -> bool:
        """Whether they change any logit (all zero: the row is left as it is)."""
        return self.presence != 0 or self.frequency != 0 or any(b != 0 for _, b in self.bias)


class TokenMask(Protocol):
    """A constraint on one sequence's tokens, such as a grammar its text must follow
    (`attnlab.serve.structured`): before each pick, the tokens that may come next; after it, the
    token taken. The sampler never sees a forbidden token: its logit is -inf."""

    def allowed(self, vocab: int) -> "torch.Tensor":
        """The tokens that may come next, a bool `(vocab,)` on the CPU (True: allowed)."""
        ...

    def accept(self, token: int) -> None:
        """Take the token picked (one that `allowed` allowed)."""
        ...

    @property
    def finished(self) -> bool:
        """Whether nothing but the end may follow: the sequence stops here."""
        ...


@dataclass(frozen=True)
class TokenScore:
    """A token's log-probability under the model, and the `top` most likely tokens at its
    position with theirs, most likely first: OpenAI's `logprobs` of one token."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


__all__ = ["Penalties", "Picker", "TokenMask", "TokenScore"]
