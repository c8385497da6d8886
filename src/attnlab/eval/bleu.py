"""BLEU (Papineni et al. 2002) through sacrebleu (Post 2018), on plain detokenized text.

Two numbers, because papers and tutorials report two different things:

- `bleu`: sacrebleu's standard corpus BLEU, cased, its own 13a tokenization of detokenized text;
  the signature (`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...`) says exactly how it
  was computed, so the figure can be compared with any other sacrebleu figure with that signature.
- `bleu_lc_tok`: lowercased, tokenized BLEU, the figure the well-known Multi30k tutorials print
  (bentrevett/pytorch-seq2seq lowercases, tokenizes with spaCy and scores the tokens with
  torchtext's `bleu_score`). See its docstring for the tokenizer.

References: Papineni et al. 2002, "BLEU: a Method for Automatic Evaluation of Machine Translation";
Post 2018, "A Call for Clarity in Reporting BLEU Scores" (sacrebleu).
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BleuScore:
    """A corpus BLEU score in [0, 100] and the sacrebleu signature that says how it was computed."""

    score: float
    signature: str


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[str]]:
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references are sequences of sentences, not single strings")
    hyps, refs = list(hypotheses), list(references)
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references; give one reference per hypothesis")
    if not hyps:
        raise ValueError("BLEU of an empty corpus is undefined; give at least one hypothesis")
    return hyps, refs


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> BleuScore:
    """Corpus BLEU of detokenized, cased hypotheses against one reference each (sacrebleu defaults).

    Example: bleu(["A dog runs on the beach."], ["A dog runs on the beach."]).score ≈ 100.0. Corpus BLEU
    is 0 when no 4-gram matches anywhere (so also for a corpus of identical sentences under 4 tokens).
    """
    from sacrebleu.metrics import BLEU

    hyps, refs = _check(hypotheses, references)
    metric = BLEU()
    result = metric.corpus_score(hyps, [refs])
    return BleuScore(float(result.score), str(metric.get_signature()))


def bleu_lc_tok(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Lowercased, tokenized corpus BLEU, comparable to the Multi30k tutorials' figures.

    Those tutorials score lowercased spaCy tokens. spaCy is a large dependency, so both sides are
    instead lowercased and tokenized by sacrebleu's "intl" tokenizer (mteval-v14 international: every
    Unicode punctuation mark and symbol becomes its own token, except "." and "," inside numbers).
    On the Multi30k English references it yields spaCy's English tokens for nearly every sentence;
    the rest differ in apostrophes (spaCy "man 's", "does n't"; intl "man ' s", "doesn ' t") and in
    a few abbreviations ("u.s."), which move BLEU too little to matter. sacrebleu's default "13a"
    tokenizer was the other candidate, but it keeps hyphenated words ("t-shirt") and possessives
    ("man's") whole where spaCy splits them, and differs from spaCy more often (the comparison's
    figures: docs/tasks/translation.md).
    Unlike torchtext's `bleu_score` this uses sacrebleu's default exponential smoothing, which only
    matters when some n-gram order has no match at all (tiny corpora).
    """
    from sacrebleu.metrics import BLEU

    hyps, refs = _check(hypotheses, references)
    return float(BLEU(lowercase=True, tokenize="intl").corpus_score(hyps, [refs]).score)
