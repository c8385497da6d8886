"""Metrics as pure functions of predictions and references; they know nothing of models.

Tasks choose which metric to report; this package is a leaf, importable from any layer.
"""

from attnlab.eval.bleu import BleuScore, bleu, bleu_lc_tok
from attnlab.eval.metrics import perplexity

__all__ = ["BleuScore", "bleu", "bleu_lc_tok", "perplexity"]
