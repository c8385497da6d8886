"""Language-modelling metrics."""

import math


def perplexity(mean_nll: float) -> float:
    """exp of the mean negative log-likelihood per token (nats). Example: perplexity(math.log(4)) == 4."""
    return math.exp(mean_nll) if mean_nll < 700 else math.inf
