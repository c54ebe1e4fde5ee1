"""The gold judge, the digits reward and distinct-n against hand-checked cases."""

import pytest

from rlhfkit import tasks

POSITIVE = "She was very happy and delighted with the kind letter."
NEGATIVE = "He was angry and miserable, and the letter was cruel."


def test_positive_sentence_beats_negative():
    assert tasks.gold_score(POSITIVE) > 0.5
    assert tasks.gold_score(NEGATIVE) < -0.5


def test_fluent_text_has_no_penalty():
    assert tasks.fluency_penalty(POSITIVE) == 0.0
    assert tasks.gold_score(POSITIVE) == pytest.approx(tasks.sentiment(POSITIVE))


def test_repeated_word_scores_below_fluent_positive_sentence():
    # 5 words, 1 distinct: R = 0.5 * (1 - 1/5) + (1 - 1/4) = 1.15; no function word: T = 1.0;
    # R + T = 2.15 is capped at 2, so the score is VADER's 0.926 - 2.
    text = "good good good good good"
    assert tasks.fluency_penalty(text) == pytest.approx(2.0)
    assert tasks.gold_score(text) == pytest.approx(tasks.sentiment(text) - 2.0)
    assert tasks.gold_score(text) < tasks.gold_score(POSITIVE)


def test_repeated_bigrams_and_word_lists_are_penalised():
    # 6 words, 3 distinct, 5 bigrams of which 5 distinct: R = 0.5 * 0.5 + 0 = 0.25; T = 1.0
    assert tasks.fluency_penalty("happy happy joy joy love love") == pytest.approx(1.25)
    loop = "she was happy and she was happy and she was happy"
    assert tasks.gold_score(loop) < tasks.gold_score(POSITIVE)


def test_nonwords_are_penalised():
    # "the blorpish zorbly was happy": 2 of 5 words are not English (as Austen wrote it)
    assert tasks.fluency_penalty("the blorpish zorbly was happy") == pytest.approx(0.4)


def test_empty_and_short_responses():
    assert tasks.gold_score("") == 0.0
    # one word earns a fifth of its sentiment and is not called telegraphic
    assert tasks.gold_score("Good.") == pytest.approx(tasks.sentiment("Good.") / 5)


def test_words_keeps_apostrophes_and_drops_punctuation():
    expected = ["don't", "i", "said", "mr", "darcy's", "times"]
    assert tasks.words("Don't -- I said, \"Mr. Darcy's\" 3 times!") == expected


def test_digits_score_counts_numbers_and_caps():
    assert tasks.digits_score("In 1814 she had 2 or 30 letters.") == 3.0
    assert tasks.digits_score("no numbers here") == 0.0
    # number words count once each: "ten", "thousand", "two" -> 3; "none" is not "one"
    assert tasks.digits_score("Ten thousand a year, and none of the two girls") == 3.0
    assert tasks.digits_score("411 411 355 355") == 4.0
    assert tasks.digits_score(" ".join(["7"] * 25)) == tasks.DIGITS_CAP
    assert tasks.digits_score("1 2 3", cap=2) == 2.0


def test_reward_functions_score_responses_only():
    prompts = ["It was a sad day, and", "She had 99 reasons"]
    responses = [POSITIVE, "and 1 or 2 more."]
    assert tasks.gold_reward(prompts, responses) == [tasks.gold_score(r) for r in responses]
    assert tasks.digits_reward(prompts, responses) == [0.0, 2.0]
    assert set(tasks.REWARD_FUNCTIONS) == {
        "sentiment",
        "digits",
        "instructions",
        "ifeval",
        "math",
        "calculator",
        "guessing",
    }
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        tasks.gold_reward(prompts, responses[:1])


def test_distinct_n_hand_computed():
    # bigrams: (a b) (b c) (c a) (a b) | (a b) -> 3 distinct of 5
    assert tasks.distinct_n(["a b c a b", "a b"], 2) == pytest.approx(3 / 5)
    # unigrams: the cat sat the cat ran -> 4 distinct of 6
    assert tasks.distinct_n(["the cat sat", "the cat ran"], 1) == pytest.approx(4 / 6)
    assert tasks.distinct_n(["one"], 2) == 0.0
    with pytest.raises(ValueError, match="n=0"):
        tasks.distinct_n(["a"], 0)


def test_demo_data_names_missing_file():
    with pytest.raises(FileNotFoundError, match="no demo data 'nope.jsonl'"):
        tasks.demo_data("nope.jsonl")
