"""What decoding and training need from a model, whatever its family: the one statement of each
decoder interface, used in the signatures that take such a model.

`CausalDecoder`: a decoder-only language model as `attnlab.decode` steps it (greedy, sampling,
continuous batching, speculation, the fused C++ step of `attnlab.accel.fused`): the GPT
(`models/gpt.py`) and the cost study's GRU language model (`attnlab.studies.cost.models.RNNLM`).

`Seq2SeqModel`: an encoder–decoder. The Transformer (`models/seq2seq.py`) and the RNN baselines
(`models/rnn.py`) implement it, so one trainer, one greedy decoder and one beam search serve all
three (Vaswani et al. 2017; Cho et al. 2014; Bahdanau et al. 2015).

Token conventions of the shared vocabulary: `pad_id` pads both sides; a target sequence is
`<bos> y_1 ... y_n <eos>`; the decoder input is the target without its last token, the loss
target the target without its first.

Shape legend: B batch, S source length, T target length, V vocabulary.
"""

from typing import Any, Protocol

import torch


class ContextConfig(Protocol):
    """The part of a causal decoder's config that decoding reads."""

    block_size: int
    """The most positions the model was trained on: a cache's length, the window a prompt is cut to."""


class CausalDecoder(Protocol):
    """A decoder-only language model as decoding steps it (an `nn.Module` besides: put in eval mode,
    its parameters read for the device and dtype)."""

    config: ContextConfig

    def new_cache(self, batch_size: int, max_len: int | None = None) -> Any:
        """The state decoding carries for `batch_size` rows of at most `max_len` positions (default
        `config.block_size`), what `forward(..., cache=)` reads and advances: the GPT's
        `attnlab.nn.attention.ModelCache`, another family's own (the GRU's hidden state)."""
        ...

    def forward(
        self,
        idx: torch.Tensor,
        *,
        cache: Any = None,
        positions: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Next-token logits `(B, T, V)` for ids idx `(B, T)` (long); with
        `cache` (`new_cache`), idx holds only the new tokens, whose positions continue the cache's
        and advance it, or sit where `positions` says; `last_only`: the last position's logits
        alone, `(B, 1, V)` (`attnlab.models.gpt.GPT.forward` has the details)."""
        ...


class DecoderState(Protocol):
    """Everything a decoder carries between steps: encoder output, source mask, caches."""

    def select(self, index: torch.Tensor, *, same_source: bool = False) -> None:
        """Keep and reorder batch rows in place: index `(B',)` long into the current batch.

        Beam search uses it to expand each sentence to its beams (`repeat_interleave`) and to follow
        the surviving hypotheses after each step. `same_source=True` promises that every new row
        comes from a row of the same source sentence, so what depends on the source alone (encoder
        output, its projections, the source mask) may stay where it is: only the decoder's own
        state moves. That saves copying the whole memory at every step.
        """
        ...


class Seq2SeqModel(Protocol):
    pad_id: int

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits `(B, T, V)` for source ids `(B, S)` and decoder input ids `(B, T)`."""
        ...

    def start(self, src: torch.Tensor, max_len: int) -> DecoderState:
        """Encode src `(B, S)` once and prepare to decode up to `max_len` target tokens."""
        ...

    def step(self, tokens: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Feed the previous target tokens `(B,)`; return next-token logits `(B, V)`; advance state."""
        ...

    def cross_attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Source–target alignment weights `(B, T, S)` (rows sum to 1 over real source tokens)."""
        ...
