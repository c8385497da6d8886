"""BLEU: hand-computed cases, agreement with sacrebleu called directly, case and tokenization."""

import math

import pytest
import sacrebleu

from attnlab.eval import BleuScore, bleu, bleu_lc_tok

HYPS = [
    "A man in a blue shirt is standing on a ladder.",
    "Two dogs run through the snow.",
    "A girl in a pink dress jumps into the water.",
]
REFS = [
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two dogs are running through the snow.",
    "A little girl in a pink dress is jumping into a pool.",
]


def test_identical_text_scores_100():
    assert bleu(REFS, REFS).score == pytest.approx(100.0)
    assert bleu_lc_tok(REFS, REFS) == pytest.approx(100.0)


def test_hand_computed_bleu():
    # 13a tokens: hyp "the cat sat on the mat today" (7), ref "the cat sat on the mat" (6).
    # Clipped n-gram precisions 6/7, 5/6, 4/5, 3/4; the hypothesis is longer, so no brevity penalty.
    expected = 100 * (6 / 7 * 5 / 6 * 4 / 5 * 3 / 4) ** 0.25
    assert bleu(["the cat sat on the mat today"], ["the cat sat on the mat"]).score == pytest.approx(expected)
    # Too short: all precisions are 1, the brevity penalty is exp(1 - 6/5).
    assert bleu(["the cat sat on the"], ["the cat sat on the mat"]).score == pytest.approx(100 * math.exp(-0.2))


def test_agrees_with_sacrebleu_called_directly():
    result = bleu(HYPS, REFS)
    assert isinstance(result, BleuScore)
    assert result.score == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert 10 < result.score < 90
    direct_lc = sacrebleu.corpus_bleu(HYPS, [REFS], lowercase=True, tokenize="intl").score
    assert bleu_lc_tok(HYPS, REFS) == pytest.approx(direct_lc)


def test_case_matters_only_for_cased_bleu():
    hyps, refs = ["A man is riding a horse on the beach."], ["a man is riding a horse on the beach."]
    assert bleu(hyps, refs).score < 90
    assert bleu_lc_tok(hyps, refs) == pytest.approx(100.0)


def test_lc_tok_splits_hyphens_like_spacy():
    # The tutorials' spaCy tokens split "t-shirt" into "t - shirt"; the intl tokenizer does too,
    # so detokenized and spaCy-tokenized text of the same sentence score 100 against each other.
    hyp, ref = ["A man in a red t-shirt walks."], ["a man in a red t - shirt walks ."]
    assert bleu_lc_tok(hyp, ref) == pytest.approx(100.0)
    assert sacrebleu.corpus_bleu(hyp, [ref], lowercase=True, tokenize="13a").score < 100


def test_signature_says_how_it_was_computed():
    sig = bleu(HYPS, REFS).signature
    assert "nrefs:1" in sig and "case:mixed" in sig and "tok:13a" in sig
    assert f"version:{sacrebleu.__version__}" in sig


@pytest.mark.parametrize("metric", [bleu, bleu_lc_tok])
def test_length_mismatch_raises(metric):
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        metric(HYPS[:2], REFS)


@pytest.mark.parametrize("metric", [bleu, bleu_lc_tok])
def test_empty_corpus_and_bare_strings_raise(metric):
    with pytest.raises(ValueError):
        metric([], [])
    with pytest.raises(TypeError):
        metric("a man", "a man")
