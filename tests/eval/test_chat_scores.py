"""The instruction mix's scores on hand-made replies: BLEU as sacrebleu computes it directly, the
accuracies counted by hand here, a tagging reply that does not parse (or tags other words) scoring
all its sentence's words wrong."""

import pytest
import sacrebleu

from attnlab.data import arithmetic
from attnlab.data.chat_mix import conversation, format_tags
from attnlab.eval.chat_scores import SCORERS, prompt, score, stated_number, table, tagged_right


def lines(task: str, examples: list[tuple[str, str]]) -> list[dict]:
    return [conversation(task, e) for e in examples]


def test_translation_is_sacrebleus_corpus_bleu_of_the_replies():
    refs = ["A dog runs on the beach.", "Two men are playing chess in a park.", "A girl in a red coat jumps."]
    replies = ["A dog runs on the beach .", "  Two men play chess in the park.\n", "A child jumps."]
    got = score("translation", replies, lines("translation", [("x", r) for r in refs]))
    want = sacrebleu.corpus_bleu([r.strip() for r in replies], [refs])
    assert got.score == pytest.approx(want.score, abs=1e-9) and 0 < got.score < 100
    assert got.n == 3 and got.note.startswith("nrefs:1|case:mixed")


def test_sentiment_accuracy_takes_the_label_in_any_case_with_final_punctuation():
    refs = ["positive", "negative", "positive", "negative", "positive"]
    replies = ["positive", " Negative.\n", "neutral", "positive", "It is positive"]
    right = [True, True, False, False, False]  # "It is positive" is a sentence, not the label
    got = score("sentiment", replies, lines("sentiment", [("x", r) for r in refs]))
    assert got.score == pytest.approx(100 * sum(right) / len(right)) and got.n == 5


def test_upos_accuracy_counts_words_and_a_reply_that_does_not_parse_loses_its_sentence():
    words = [["I", "run", "."], ["and/or", "the", "cat"], ["Dogs", "bark"], ["Hi"]]
    tags = [["PRON", "VERB", "PUNCT"], ["CCONJ", "DET", "NOUN"], ["NOUN", "VERB"], ["INTJ"]]
    gold = [format_tags(w, t) for w, t in zip(words, tags, strict=True)]
    replies = [
        "I/PRON run/NOUN ./PUNCT",  # 2 of 3
        gold[1],  # 3 of 3, a word with a slash
        "Dogs/NOUN",  # fewer words: all of its 2 wrong
        "Hi/GREETING",  # not a UPOS tag: does not parse
    ]
    got = score("tagging", replies, lines("tagging", [(" ".join(w), g) for w, g in zip(words, gold, strict=True)]))
    assert got.score == pytest.approx(100 * (2 + 3 + 0 + 0) / (3 + 3 + 2 + 1)) and got.n == 9
    assert "4 sentences; 1 replies unparseable, 1 tagging other words" in got.note
    assert tagged_right("cats/NOUN bark/VERB", "Dogs/NOUN bark/VERB") == (0, 2, False)  # other words
    with pytest.raises(ValueError):
        tagged_right("x/NOUN", "not a tagging reply")


def test_arithmetic_reads_the_last_number_of_the_final_reply():
    problems = [arithmetic.Problem("*", 347, 12, "q"), arithmetic.Problem("-", 900, 101, "q")] * 2
    replies = ["The answer is 4164.", "The answer is 799", "347 * 12 = 4,164", "799 or 800"]
    right = [True, True, True, False]
    for task, form in (("arithmetic", arithmetic.with_tool), ("arithmetic-direct", arithmetic.direct)):
        got = score(task, replies, [form(p) for p in problems])
        assert got.score == pytest.approx(100 * sum(right) / len(right)) and got.task == task
    assert stated_number("no number") is None and stated_number("-3.5 then 12") == 12.0
    assert stated_number("The answer is 70.0") == arithmetic.Problem("/", 840, 12, "").answer


def test_the_prompt_is_what_comes_before_the_first_reply():
    line = arithmetic.with_tool(arithmetic.Problem("+", 100, 200, "What is it?"))
    assert [m["role"] for m in prompt(line)] == ["system", "user"]


def test_replies_must_match_the_conversations_and_the_table_shows_every_task():
    with pytest.raises(ValueError):
        score("sentiment", ["positive"], [])
    scores = [SCORERS["sentiment"](["positive"], ["positive"]), SCORERS["arithmetic"](["1"], ["2"])]
    text = table(scores)
    assert text.splitlines()[0].split() == ["task", "metric", "score", "n", "note"]
    assert "sentiment" in text and "100.00" in text and "0.00" in text
