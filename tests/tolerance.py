"""How far apart two float32 computations of one quantity may be when they differ only in the order
of their sums: the bound every comparison of a C++ or oneDNN path with PyTorch's states.

The derivation. Every product, attention score and norm is a sum s = a_1 b_1 + ... + a_n b_n.
Evaluated in float32 (unit roundoff u = 2^-24) in any order, any blocking and any vector width,
with or without fused multiply-adds, its computed value satisfies

    |fl(s) - s| <= gamma_n * sum_i |a_i b_i|,    gamma_n = n u / (1 - n u)

(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 3.5). That worst case needs
every rounding error to fall the same way; rounding errors that are independent and of mean zero
give, with probability at least 1 - 2 exp(-lambda^2 / 2), lambda sqrt(n) u in place of gamma_n
(Higham and Mary, "A new approach to probabilistic rounding error analysis", SISC 2019, Thm. 2.4).
lambda = 6 makes a false alarm rarer than 1 in 10^7 for each compared value.

The magnitude sum_i |a_i b_i| is not |s|: terms of mixed signs cancel. For terms of random signs,
|s| is about sqrt(n) times a term's typical size while sum_i |a_i b_i| is n times it, so
sum_i |a_i b_i| ~ sqrt(n) |s|; 1 is added to |s|, the size of what a normalisation hands the next
product, for values that cancel to near zero. One sum then errs by at most lambda n u (1 + |s|), and
two evaluations of it, each that close to the exact value, differ by twice that.

A network chains `depth` such sums (a Transformer layer: q/k/v, scores, weighted values, output
projection, two feed-forward products, two norms). Each adds its own rounding, of the order of
its own values; residual connections and normalisations keep an earlier error from growing
(a well-conditioned network, which is what the tests build), so the errors add up:

    |got - want| <= 2 * depth * lambda * n * u * (1 + |want|)    for every value,

with n the longest sum in the chain (`assert_float32_close`: atol and rtol both that factor).
What this allows is rounding, and nothing of the size of a
real mistake: a key read from the wrong position or a term left out changes values by a fraction
of their own size, orders of magnitude past this bound (tests/accel/test_tolerance.py shows both).
"""

import torch

UNIT_ROUNDOFF = 2.0**-24
"""float32's unit roundoff: half the distance from 1 to the next float32."""

LAMBDA = 6.0
"""The probabilistic bound's confidence parameter (a false alarm below 1 in 10^7 per value)."""


def float32_factor(reduction: int, depth: int = 1) -> float:
    """2 depth lambda n u: the largest difference two float32 evaluations of one computation may
    show, `depth` chained sums of at most `reduction` terms each, per unit of a value's size
    (module docstring)."""
    if reduction < 1 or depth < 1:
        raise ValueError(f"reduction and depth count terms and sums: got {reduction} and {depth}")
    return 2.0 * depth * LAMBDA * reduction * UNIT_ROUNDOFF


def layer_depth(n_layers: int) -> int:
    """The chained sums of a pre-norm Transformer stack and its head: per layer two norms, q/k/v,
    the scores, the weighted values, the output projection and the feed-forward's two products;
    then the final norm and the head."""
    return 8 * n_layers + 2


def assert_float32_close(got: torch.Tensor, want: torch.Tensor, *, reduction: int, depth: int = 1) -> None:
    """`got` equals `want` up to float32 rounding of `depth` chained sums of at most `reduction`
    terms: |got - want| <= factor * (1 + |want|) for every value (`float32_factor`)."""
    factor = float32_factor(reduction, depth)
    torch.testing.assert_close(
        got, want, atol=factor, rtol=factor, msg=lambda m: f"{m}\n(float32 bound: n={reduction}, depth={depth})"
    )


def gpt_sums(config) -> dict[str, int]:
    """`assert_float32_close`'s reduction and depth for a GPT's step (`attnlab.models.GPTConfig`):
    the longest sum is the feed-forward's (or the attention's over a full block)."""
    return {
        "reduction": max(config.d_model * config.ffn_mult, config.block_size),
        "depth": layer_depth(config.n_layers),
    }


def decoder_sums(config) -> dict[str, int]:
    """`assert_float32_close`'s reduction and depth for an encoder–decoder's decoder step
    (`attnlab.models.Seq2SeqConfig`), given the same encoder memory: per layer three norms and two
    attentions of four sums each, then the feed-forward's two products; the final norm, the head."""
    reduction = max(config.d_ff, config.d_model, config.max_len)
    return {"reduction": reduction, "depth": 13 * config.n_decoder_layers + 2}
