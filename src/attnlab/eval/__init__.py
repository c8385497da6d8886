"""Evaluation: metrics as pure functions of predictions and references (bleu, metrics, chat_scores),
which know nothing of models, and the evaluation of a loaded language model (language_model:
what is evaluated; perplexity: the strided sliding window over a text; harness: lm-evaluation-
harness's `LM`), which imports nothing above the models and decoding. Loading a model for them is
the studies' (`attnlab.studies.language_model`, `attnlab.studies.harness`).

Tasks choose which metric to report; the metrics are importable from any layer above the models.
"""

from attnlab.eval.bleu import BleuScore, bleu, bleu_lc_tok
from attnlab.eval.metrics import perplexity

__all__ = ["BleuScore", "bleu", "bleu_lc_tok", "perplexity"]
