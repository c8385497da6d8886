"""ELECTRA: a generator corrupts the input, a discriminator finds the replaced tokens (Clark et al. 2020).

Reads like §3 ("Method", Figure 2) of the paper. A small masked-LM generator (a BERT) predicts the
tokens at the masked positions; a token is *sampled* from its softmax at each of them (not its
argmax), and the samples replace the masked positions of the original text. The discriminator (the
BERT encoder that fine-tuning keeps) reads that corrupted text and says, for every token, whether it
was replaced: label 1 where the token differs from the original, so a sample that happens to equal
the original counts as original (§3, "if the generator happens to generate the correct token,
that token is considered 'real' instead of 'fake'"). No gradient reaches the generator through the
samples: they are token ids, drawn from a detached softmax (§3: "we do not back-propagate the
discriminator loss through the generator").

Weight sharing (§3.2): the generator is 1/4 to 1/2 the discriminator's width (`generator_size`), and
the two share their embeddings, token and position alike (with the segments and the embeddings'
norm: google-research/electra builds both under the one `electra/embeddings` scope), at the
discriminator's width; the generator projects them to its own (`embeddings_project` in
`model/modeling.py`), and its masked-LM head maps back to the embeddings' width to decode with the
shared token matrix (`get_token_logits` in `run_pretraining.py`).

Shape legend: B batch, T time, C d_model (the discriminator's), V vocab, N masked positions.

References:
- Clark, Luong, Le, Manning 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than
  Generators", §3 and Appendix A (generator size 1/4 for ELECTRA-Small, λ = 50, 15% masked).
- google-research/electra `run_pretraining.py` (`get_generator_config`, `_get_fake_data`,
  `_get_discriminator_output`) and `pretrain/pretrain_helpers.py` (`mask`: 85% [MASK], 15% kept).
"""

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from attnlab.models.bert import Bert, BertConfig, BertEmbeddings, MaskedLMHead
from attnlab.nn import normal_init
from attnlab.nn.feedforward import pointwise


@dataclass(frozen=True)
class ElectraConfig(BertConfig):
    """The discriminator's shape (every field of `BertConfig`) and the generator's size relative to it.
    `head` and `n_labels` are the task's to set: ELECTRA's two heads are its own."""

    kind: str = "electra"
    """Always "electra": the generator and the discriminator together."""
    generator_size: float = 0.25
    """The generator's width as a share of the discriminator's: its d_model, d_ff and heads are this
    share of theirs (rounded; at least one head). The paper finds 1/4 to 1/2 best (§3.2, Figure 3);
    ELECTRA-Small uses 1/4."""
    generator_layers: float = 1.0
    """The generator's depth as a share of the discriminator's (google-research/electra's
    `generator_layers`; 1.0 in the paper's models)."""

    def __post_init__(self) -> None:
        if self.kind != "electra":
            raise ValueError(f"kind must be 'electra', got {self.kind!r}")
        for name in ("generator_size", "generator_layers"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        self.discriminator_config()  # BertConfig checks every field it shares
        try:
            self.generator_config()
        except ValueError as e:
            raise ValueError(
                f"generator_size {self.generator_size} and generator_layers {self.generator_layers} give "
                f"a generator that cannot be built: {e}"
            ) from None

    def discriminator_config(self) -> BertConfig:
        """The discriminator: a BERT of these fields, with no head of its own (the replaced-token
        head is `ReplacedTokenHead`), so that fine-tuning loads it as any encoder."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(BertConfig)}
        return BertConfig(**(values | {"kind": "bert", "head": "none", "n_labels": 0}))

    def generator_config(self) -> BertConfig:
        """The generator: the discriminator's config at `generator_size` of its width and
        `generator_layers` of its depth, with the masked-LM head. Its own embedding table goes unused
        (`Electra` gives it the shared one), so it has no factorized embedding width."""
        s = self.generator_size
        return dataclasses.replace(
            self.discriminator_config(),
            d_model=max(1, round(self.d_model * s)),
            d_ff=max(1, round(self.d_ff * s)),
            n_heads=max(1, round(self.n_heads * s)),
            n_layers=max(1, round(self.n_layers * self.generator_layers)),
            embedding_dim=None,
            head="mlm",
        )


class SharedEmbeddings(nn.Module):
    """The generator's input layer: the discriminator's embeddings (the same module: token, position
    and segment tables and their norm) projected from C to the generator's width (an identity when
    the two are as wide). ids and segments `(B, T)` long -> `(B, T, C_g)`."""

    def __init__(self, shared: BertEmbeddings, d_model: int, width: int) -> None:
        super().__init__()
        self.shared = shared
        self.proj = nn.Linear(d_model, width) if width != d_model else nn.Identity()

    def forward(self, ids: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
        return self.proj(self.shared(ids, segments))


class ReplacedTokenHead(nn.Module):
    """The discriminator's output (`_get_discriminator_output`; transformers'
    `ElectraDiscriminatorPredictions`): a dense layer C -> C, the activation, a dense layer C -> 1.
    Hidden states `(B, T, C)` -> the logit that each token was replaced `(B, T)`."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.act = pointwise(config.activation)
        self.out = nn.Linear(config.d_model, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.dense(hidden))).squeeze(-1)


@dataclass
class ElectraOutput:
    """One step of ELECTRA on a batch."""

    generator_logits: torch.Tensor
    """`(N, V)`: the generator's scores at the masked positions, in row-major order."""
    corrupted: torch.Tensor
    """`(B, T)` long: the original ids with the generator's samples at the masked positions."""
    replaced: torch.Tensor
    """`(B, T)` bool: the discriminator's labels, True where `corrupted` differs from the original."""
    discriminator_logits: torch.Tensor
    """`(B, T)`: the discriminator's logit that each token was replaced."""


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row drawn from softmax(logits) by inverting its cumulative distribution with a
    given uniform: logits `(N, V)`, uniforms `(N,)` in [0, 1) -> ids `(N,)` long. Token i is drawn
    when cdf[i-1] <= u < cdf[i], which happens with probability softmax(logits)[i]; a token of
    probability 0 is never drawn. The uniforms come with the batch (drawn by the trainer's seeded
    generator), so a resumed run corrupts its batches as the first run did. No gradient: the ids are
    integers, and the softmax is taken of detached logits.
    Example: logits [[0, 0]] (1/2 each), u [0.7] -> [1]."""
    probs = torch.softmax(logits.detach().float(), dim=-1)  # (N, V)
    cdf = probs.cumsum(dim=-1)
    cdf = cdf / cdf[:, -1:]  # the last entry exactly 1, so u < 1 always finds a token
    return torch.searchsorted(cdf, uniforms.float().unsqueeze(-1), right=True).squeeze(-1)  # (N,)


class Electra(nn.Module):
    """The generator and the discriminator, their embeddings shared (§3.2). `forward` runs one
    pre-training step's models: the generator at the masked positions, the samples put in, the
    discriminator on the result (`ElectraOutput`). Only `discriminator` is kept for fine-tuning
    (`attnlab.tasks.encoder.load_pretrained`)."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.config = config
        self.discriminator = Bert(config.discriminator_config())
        generator = config.generator_config()
        self.generator = Bert(generator)
        shared = self.discriminator.embeddings
        # The generator's own embeddings and head are replaced by ones over the shared tables.
        self.generator.embeddings = SharedEmbeddings(shared, config.d_model, generator.d_model)
        self.generator.head = MaskedLMHead(generator, shared.token)
        self.replaced_head = ReplacedTokenHead(config)
        # normal_init on the new layers alone: applied to the model it would redraw the shared
        # tables, the position table's sinusoidal start (`position_init`) among them.
        for module in (self.generator.embeddings.proj, self.generator.head.dense, self.generator.head.norm):
            module.apply(normal_init)
        nn.init.zeros_(self.generator.head.decoder.bias)
        self.replaced_head.apply(normal_init)

    def forward(
        self, inputs: torch.Tensor, originals: torch.Tensor, chosen: torch.Tensor, uniforms: torch.Tensor
    ) -> ElectraOutput:
        """inputs `(B, T)` long: the generator's input (the masked text); originals `(B, T)` long:
        the text before masking; chosen `(B, T)` bool: the masked positions; uniforms `(B, T)` in
        [0, 1): the draws that sample the generator's tokens (those at chosen positions are used)."""
        generator_logits = self.generator(inputs, chosen=chosen)  # (N, V)
        sampled = sample_tokens(generator_logits, uniforms[chosen])  # (N,), no gradient
        corrupted = originals.masked_scatter(chosen, sampled)  # (B, T)
        hidden = self.discriminator.encode(corrupted)  # (B, T, C)
        return ElectraOutput(generator_logits, corrupted, corrupted != originals, self.replaced_head(hidden))
