"""The instructions task: each constraint's check, the parser of every phrasing, the guard, the
reward by name, and the prompt generator (scripts/make_instruction_prompts.py)."""

import itertools
import json
import re
from pathlib import Path

import pytest
import torch

from helpers import load_script
from rlhfkit import tasks
from rlhfkit.data import PromptRecord, load_records
from rlhfkit.experience.scorer_loading import build_scorer, reward_function_scorer
from rlhfkit.experience.scorers import ScoreError, ScoreInput
from rlhfkit.labelling.export import write_jsonl
from rlhfkit.tasks.instructions import (
    HELDOUT_KINDS,
    KINDS,
    TOPICS,
    TRAINING_KINDS,
    Constraint,
    check_instructions_prompt,
    constraint_results,
    guard_reason,
    instruction_score,
    instructions_reward,
    parse_constraints,
    phrase,
    sentences,
    stem,
    topics_in,
    unasked_case_reward,
    unasked_shapes,
    words,
)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_instruction_prompts.py"
COVERAGE_SCRIPT = SCRIPT.with_name("constraint_coverage.py")
LETTER_CASE_SCRIPT = SCRIPT.with_name("make_letter_case_demonstrations.py")
CHAT = (
    "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\nuser\n"
    "{}\nassistant\n"
)


@pytest.fixture(scope="module")
def generator():
    return load_script(SCRIPT)


# ------------------------------------------------------------------------------ the checks

WELL_KNOWN = "It's a well-known, rainy day."  # 5 words: "It's", "well-known" are one each

CHECKS = [
    # (kind, n, word, response, met)
    ("max_words", 5, None, WELL_KNOWN, True),
    ("max_words", 5, None, "It's a very well-known, rainy day.", False),
    ("max_words", 2, None, "Rain -- rain !!", True),  # punctuation alone is no word
    ("min_words", 5, None, WELL_KNOWN, True),
    ("min_words", 5, None, "Rain, rain, go away!", False),
    ("sentences", 2, None, "Rain fell all night. The streets shone!", True),
    ("sentences", 2, None, "Dr. Smith walked home. It rained on fruit, e.g. on pears.", True),
    ("sentences", 2, None, 'He said "Stay." Then he left.', True),
    ("sentences", 2, None, "The tea cost 3.5 pounds. That is cheap.", True),
    ("sentences", 2, None, "Sunrise\nThe sky turns orange.", True),  # a line is a sentence
    ("sentences", 2, None, "It rained. Then it stopped. Then the sun came out.", False),
    ("sentences", 2, None, "Well... maybe. Or not.", False),  # an ellipsis ends one
    ("paragraphs", 2, None, "Rain fell.\n\nThe sun came out.", True),
    ("paragraphs", 2, None, "Rain fell.\n  \nThe sun came out.\n\n\n", True),
    ("paragraphs", 2, None, "Rain fell.\nThe sun came out.", False),
    ("paragraphs", 2, None, "One.\n\nTwo.\n\nThree.", False),
    ("bullets", 3, None, "- apples\n* pears\n• plums", True),
    ("bullets", 3, None, "Here are three:\n  - apples\n  - pears\n  - plums", True),
    ("bullets", 3, None, "1. apples\n2. pears\n3. plums", False),  # numbers are no bullets
    ("bullets", 3, None, "-apples\n- pears\n- plums", False),  # a marker needs a space
    ("bullets", 2, None, "**Fruit**\n- apples\n- pears", True),  # bold is no bullet
    ("bullets", 3, None, "- apples\n- pears\n- ", False),  # an item needs a word
    ("numbered", 2, None, "1. Apples are sweet.\n2) Pears are soft.", True),
    ("numbered", 2, None, "- Apples are sweet.\n- Pears are soft.", False),
    ("numbered", 2, None, "1. Apples\n2. Pears\n3. Plums", False),
    ("lowercase", None, None, "it's 5 o'clock, time for tea!", True),
    ("lowercase", None, None, "It's time for tea.", False),
    ("lowercase", None, None, "123 !!", False),  # no letters, so no lowercase
    ("uppercase", None, None, "RAIN FALLS AT 5 AM, AGAIN!", True),
    ("uppercase", None, None, "RAIN FALLS at 5 AM.", False),
    ("uppercase", None, None, "42", False),
    ("no_commas", None, None, "Apples and pears and plums.", True),
    ("no_commas", None, None, "Apples, pears.", False),
    ("start_word", None, "today", '"Today, the sun shines."', True),
    ("start_word", None, "today", "today's weather is fine", True),  # a possessive counts
    ("start_word", None, "today", "Yesterday it rained today.", False),
    ("end_word", None, "books", "I love my books.", True),
    ("end_word", None, "books", "It is all about 'Books'!\"", True),
    ("end_word", None, "books", "I love books so much.", False),
    ("end_word", None, "books", "My favourite shop sells booksellers.", False),
    ("keyword", 2, "river", "The river is wide. The river's bank is steep.", True),
    ("keyword", 2, "river", "River, RIVER!", True),
    ("keyword", 1, "river", "The riverbank and the rivers.", False),  # whole words only
    ("keyword", 3, "river", "The river and the river.", False),
    ("forbidden_word", None, "river", "The stream is calm by the riverbank.", True),
    ("forbidden_word", None, "river", "The River is calm.", False),
    ("quotes", None, None, '"Rain falls."', True),
    ("quotes", None, None, "  “Rain falls.”  \n", True),
    ("quotes", None, None, '"Rain" falls.', False),
    ("quotes", None, None, '""', False),
    ("title", None, None, "<<Rainy Days>>\nRain falls.", True),
    ("title", None, None, "<< >> Rain falls.", False),
    ("title", None, None, "<Rainy Days> Rain falls.", False),
    ("postscript", None, None, "Rain falls.\n\nP.S. Bring an umbrella.", True),
    ("postscript", None, None, "rain falls.\np.s. bring an umbrella.", True),
    ("postscript", None, None, "Rain falls. P.S. bring an umbrella.", False),  # not a line
    ("postscript", None, None, "Rain falls.\nP.S.", False),  # nothing after it
]


@pytest.mark.parametrize(("kind", "n", "word", "response", "met"), CHECKS)
def test_each_check_on_met_and_missed_responses(kind, n, word, response, met):
    assert Constraint(kind, n, word).met(response) is met


def test_every_kind_has_a_response_that_meets_it_and_one_that_misses_it():
    outcomes = {(kind, met) for kind, _, _, _, met in CHECKS}
    assert outcomes == {(kind, met) for kind in KINDS for met in (True, False)}


def test_words_and_sentences():
    assert words(WELL_KNOWN) == ["it's", "a", "well-known", "rainy", "day"]
    assert words("Don’t stop -- 42 times!") == ["don't", "stop", "42", "times"]
    assert sentences("Mr. Darcy smiled. Mrs. Bennet, i.e. his aunt, did not!") == [
        "Mr. Darcy smiled.",
        "Mrs. Bennet, i.e. his aunt, did not!",
    ]


def test_kinds_held_out_and_trained_partition_the_kinds():
    assert len(TRAINING_KINDS) >= 12 and len(HELDOUT_KINDS) >= 3
    assert set(TRAINING_KINDS) | HELDOUT_KINDS == set(KINDS)
    assert not set(TRAINING_KINDS) & HELDOUT_KINDS


# ----------------------------------------------------------------------------------- parsing


def example(kind: str, phrasing: str) -> Constraint:
    """A constraint with the parameters ``phrasing`` states."""
    has_number = re.search(r"\{(n|below|count|times)\}", phrasing)
    numbers = {"{count}": 3, "{times}": 2}
    n = next((v for slot, v in numbers.items() if slot in phrasing), 24) if has_number else None
    return Constraint(kind, n, "river" if "{word}" in phrasing else None)


PHRASINGS = [(kind.name, p) for kind in KINDS.values() for p in kind.phrasings]


@pytest.mark.parametrize(("kind", "phrasing"), PHRASINGS)
def test_every_phrasing_parses_back_to_its_kind_and_parameters(kind, phrasing):
    constraint = example(kind, phrasing)
    text = phrase(phrasing, constraint)
    if phrasing[0].isupper():  # a sentence follows the task sentence
        stated = f"Describe a river. {text}"
    else:  # a fragment joins it, after a comma or a space
        stated = f"Describe a river{'' if text.startswith(',') else ' '}{text}."
    for prompt in (stated, CHAT.format(stated), stated.upper(), stated.replace(" ", "\n  ")):
        assert parse_constraints(prompt) == [constraint], prompt


def test_numbers_as_digits_or_words_and_the_bound_of_under():
    assert parse_constraints("Describe a rainy morning in under 25 words.") == [
        Constraint("max_words", 24)
    ]
    assert parse_constraints("Use no more than 25 words.") == [Constraint("max_words", 25)]
    assert parse_constraints("Reply with exactly 3 sentences.") == [Constraint("sentences", 3)]
    assert parse_constraints("Use the word “rain” at least 4 times. Answer in all caps.") == [
        Constraint("keyword", 4, "rain"),
        Constraint("uppercase"),
    ]


def test_the_judge_reads_how_people_ask_beyond_what_the_generator_writes():
    question = "Do you like a cat or a dog? Answer in one sentence."
    assert parse_constraints(question) == [Constraint("sentences", 1)]
    assert instruction_score(question, "I like dogs, because they are loyal and playful.") == 1
    assert instruction_score(question, "I like dogs. They are loyal and playful.") == 0
    assert parse_constraints("Explain tides in 3 sentences.") == [Constraint("sentences", 3)]


def each_word(kind: str, n: int | None, *quoted: str) -> list[Constraint]:
    """One constraint of ``kind`` for each word: what a list of quoted words states."""
    return [Constraint(kind, n, w) for w in quoted]


# A hand-written prompt for every judge-only phrasing (a test below holds the table to that):
# (prompt, the constraints it states, in order).
UNDERSTOOD = [
    ("Describe a river in fewer than 30 words.", [Constraint("max_words", 29)]),
    ("Answer with less than 50 words.", [Constraint("max_words", 49)]),
    ("Describe a river in no more than 30 words.", [Constraint("max_words", 30)]),
    ("Your answer should be at most 40 words long.", [Constraint("max_words", 40)]),
    ("Describe a cat. Keep it under 20 words.", [Constraint("max_words", 19)]),
    ("Describe a river in 30 words or fewer.", [Constraint("max_words", 30)]),
    ("Write 25 words or less about a cat.", [Constraint("max_words", 25)]),
    ("Describe a river using up to 30 words.", [Constraint("max_words", 30)]),
    ("Describe a river with a maximum of 40 words.", [Constraint("max_words", 40)]),
    ("Describe a river. Limit your answer to 60 words.", [Constraint("max_words", 60)]),
    ("Your response should contain at least 40 words.", [Constraint("min_words", 40)]),
    ("Write not less than 60 words about a cat.", [Constraint("min_words", 60)]),
    ("Describe a river in more than 50 words.", [Constraint("min_words", 51)]),
    ("Describe a river in 50 words or more.", [Constraint("min_words", 50)]),
    ("Describe a river with a minimum of 80 words.", [Constraint("min_words", 80)]),
    ("Explain tides in one sentence.", [Constraint("sentences", 1)]),
    ("Explain tides in a single sentence.", [Constraint("sentences", 1)]),
    ("Write two sentences about a cat.", [Constraint("sentences", 2)]),
    ("Tell me about tides. Respond using exactly four sentences.", [Constraint("sentences", 4)]),
    ("Explain tides. Your answer should be one sentence.", [Constraint("sentences", 1)]),
    ("Describe a river in 3 paragraphs.", [Constraint("paragraphs", 3)]),
    ("Write two paragraphs about a cat.", [Constraint("paragraphs", 2)]),
    ("Describe a river. Break it into three paragraphs.", [Constraint("paragraphs", 3)]),
    ("Summarize the plot in 4 bullet points.", [Constraint("bullets", 4)]),
    ("Your response should contain 3 bullet points.", [Constraint("bullets", 3)]),
    ("Name some birds. Answer with a bullet list of five points.", [Constraint("bullets", 5)]),
    ("Give two reasons to exercise as a bulleted list.", [Constraint("bullets", 2)]),
    ("List three fruits in bullet points.", [Constraint("bullets", 3)]),
    ("Explain how to boil pasta as a numbered list of 4 steps.", [Constraint("numbered", 4)]),
    ("Explain how to bake bread in 5 numbered steps.", [Constraint("numbered", 5)]),
    ("Give me three tips for sleeping well, as a numbered list.", [Constraint("numbered", 3)]),
    ("Describe the moon in lowercase.", [Constraint("lowercase")]),
    ("Describe the moon. Reply in lower case only.", [Constraint("lowercase")]),
    ("Describe the moon. No capital letters at all.", [Constraint("lowercase")]),
    ("Describe the moon and don't capitalize anything.", [Constraint("lowercase")]),
    ("Describe the moon in all caps.", [Constraint("uppercase")]),
    ("Describe the moon in capital letters.", [Constraint("uppercase")]),
    ("Describe the moon. Answer in uppercase letters only.", [Constraint("uppercase")]),
    ("In your entire response, refrain from the use of any commas.", [Constraint("no_commas")]),
    ("Describe the moon without commas.", [Constraint("no_commas")]),
    ("Describe the moon. Don't use commas.", [Constraint("no_commas")]),
    ("Describe the moon. No commas.", [Constraint("no_commas")]),
    ("Describe the moon. Avoid using commas.", [Constraint("no_commas")]),
    (
        "Describe the moon. Open your response with the word 'tonight'.",
        [Constraint("start_word", None, "tonight")],
    ),
    (
        "Describe the moon. Start with the word 'tonight'.",
        [Constraint("start_word", None, "tonight")],
    ),
    ("Your reply should begin with the word “look”.", [Constraint("start_word", None, "look")]),
    ("The first word of the response should be 'look'.", [Constraint("start_word", None, "look")]),
    (
        "Describe the moon. Conclude it with the word 'night'.",
        [Constraint("end_word", None, "night")],
    ),
    ("Describe the moon and end with the word 'night'.", [Constraint("end_word", None, "night")]),
    (
        "Describe the moon. The answer must end with the word 'night'.",
        [Constraint("end_word", None, "night")],
    ),
    ("The last word of your reply should be 'night'.", [Constraint("end_word", None, "night")]),
    (
        "Finish your response with this exact phrase 'peace'.",
        [Constraint("end_word", None, "peace")],
    ),
    ("Describe the moon. Use the word 'silver'.", [Constraint("keyword", 1, "silver")]),
    (
        "Describe the moon. Mention the words 'tide' and 'night'.",
        each_word("keyword", 1, "tide", "night"),
    ),
    (
        "Describe the moon. Use the word 'silver' in your answer.",
        [Constraint("keyword", 1, "silver")],
    ),
    (
        "Describe the moon. Make sure to use the word 'silver'.",
        [Constraint("keyword", 1, "silver")],
    ),
    (
        "Make sure the keyword 'silver' appears at least twice.",
        [Constraint("keyword", 2, "silver")],
    ),
    (
        "Describe the moon. Don't use the word 'cheese'.",
        [Constraint("forbidden_word", None, "cheese")],
    ),
    (
        "Never say the words 'cheese', 'rock' and 'dust'.",
        each_word("forbidden_word", None, "cheese", "rock", "dust"),
    ),
    (
        "Describe the moon. Do not mention the word 'cheese' in your reply.",
        [Constraint("forbidden_word", None, "cheese")],
    ),
    (
        "Describe the moon. Avoid using the word 'cheese'.",
        [Constraint("forbidden_word", None, "cheese")],
    ),
    (
        "Describe the moon without the word 'cheese'.",
        [Constraint("forbidden_word", None, "cheese")],
    ),
    (
        "Describe the moon. The word 'cheese' must not appear.",
        [Constraint("forbidden_word", None, "cheese")],
    ),
    ("Describe the moon. Put your whole answer in double quotes.", [Constraint("quotes")]),
    (
        "Describe the moon and give it a title in <<double angular brackets>>.",
        [Constraint("title")],
    ),
    ("Please explicitly add a postscript starting with P.S.", [Constraint("postscript")]),
    ("Describe the moon and add a P.S. at the end.", [Constraint("postscript")]),
    # two at once, and where phrasings meet: the one that starts first (and is longest) counts
    (
        "Describe the moon in lowercase and without commas.",
        [Constraint("lowercase"), Constraint("no_commas")],
    ),
    (
        "Describe the moon.\n- Use the word 'silver'.\n- Please answer in all caps.",
        [Constraint("keyword", 1, "silver"), Constraint("uppercase")],
    ),
    ("Use the word 'rain' at least twice.", [Constraint("keyword", 2, "rain")]),
    ("Do not use the word 'rain'.", [Constraint("forbidden_word", None, "rain")]),
]


@pytest.mark.parametrize(("prompt", "constraints"), UNDERSTOOD)
def test_the_judge_reads_its_judge_only_phrasings(prompt, constraints):
    for text in (prompt, CHAT.format(prompt), prompt.upper()):
        assert parse_constraints(text) == constraints, text


def test_every_judge_only_phrasing_has_an_example():
    for kind in KINDS.values():
        understood = kind.patterns()[len(kind.phrasings) :]
        for phrasing, pattern in zip(kind.understood, understood, strict=True):
            assert any(pattern.search(p) for p, _ in UNDERSTOOD), (kind.name, phrasing)


TASK = "Write a short poem about a river."
IFEVAL_WORDING = [
    # (IFEval's instruction class, its arguments, the constraints the judge reads in its text)
    ("NumberOfWords", {"num_words": 40, "relation": "at least"}, [Constraint("min_words", 40)]),
    ("NumberOfWords", {"num_words": 40, "relation": "less than"}, [Constraint("max_words", 39)]),
    ("BulletListChecker", {"num_bullets": 3}, [Constraint("bullets", 3)]),
    ("LowercaseLettersEnglishChecker", {}, [Constraint("lowercase")]),
    ("CapitalLettersEnglishChecker", {}, [Constraint("uppercase")]),
    ("CommaChecker", {}, [Constraint("no_commas")]),
    (
        "KeywordChecker",
        {"keywords": ["sun", "river"]},
        each_word("keyword", 1, "river", "sun"),
    ),
    (
        "KeywordFrequencyChecker",
        {"keyword": "river", "frequency": 3, "relation": "at least"},
        [Constraint("keyword", 3, "river")],
    ),
    (
        "ForbiddenWords",
        {"forbidden_words": ["sun", "water"]},
        each_word("forbidden_word", None, "sun", "water"),
    ),
    ("QuotationChecker", {}, [Constraint("quotes")]),
    ("TitleChecker", {}, [Constraint("title")]),
    ("PostscriptChecker", {"postscript_marker": "P.S."}, [Constraint("postscript")]),
    ("EndChecker", {"end_phrase": "peace"}, [Constraint("end_word", None, "peace")]),
    # what means something else than a kind of the judge, or that the judge cannot check
    ("NumberOfSentences", {"num_sentences": 5, "relation": "less than"}, []),  # a bound
    ("NumberOfSentences", {"num_sentences": 5, "relation": "at least"}, []),
    ("ParagraphChecker", {"num_paragraphs": 3}, []),  # paragraphs split by ***
    ("ParagraphFirstWordCheck", {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "so"}, []),
    ("KeywordFrequencyChecker", {"keyword": "river", "frequency": 3, "relation": "less than"}, []),
    ("PostscriptChecker", {"postscript_marker": "P.P.S"}, []),
    ("EndChecker", {"end_phrase": "Any other questions?"}, []),  # a phrase, not a word
]


@pytest.mark.parametrize(("name", "arguments", "constraints"), IFEVAL_WORDING)
def test_the_judge_reads_ifeval_s_own_wording_of_the_kinds_it_checks(name, arguments, constraints):
    from if_verifiable.ifeval import instructions as ifeval_instructions

    wording = getattr(ifeval_instructions, name)(name).build_description(**arguments)
    assert parse_constraints(f"{TASK} {wording}") == constraints, wording


@pytest.mark.parametrize(
    "prompt",
    [
        "How do you use the word 'affect' in a sentence?",
        "Why do people write in all caps?",
        "What is a bulleted list?",
        "Tell me about a cat. It has at least 3 words in its name.",
        "Explain why some people end every sentence with the word 'like'.",
        "Which words start with the word 'un'?",
        "Do not answer in lowercase.",  # a negation before it
        "Describe the moon, but never in capital letters.",
        "Describe the moon in fewer than 10 words per sentence.",  # not of the whole answer
        "Describe the moon in two or three sentences.",  # no one number
        "Give two or three reasons to exercise as a bulleted list.",
        "List some fruits as a bulleted list.",  # no number of bullets: none made up
        "Describe the moon in 50 words.",  # about 50, or exactly?
        "Describe the moon and add a postscript.",  # "P.S.", "PS:" or "Postscript:"?
        "Put your answer in quotes.",  # single or double?
    ],
)
def test_text_that_asks_for_nothing_the_judge_checks_states_no_constraint(prompt):
    assert parse_constraints(prompt) == []


def test_a_list_s_length_is_the_number_of_things_asked_for():
    prompt = "Give two reasons to exercise as a bulleted list."
    two = "- Exercise keeps your heart healthy.\n- A walk lifts your mood."
    assert instruction_score(prompt, two) == 1.0
    assert instruction_score(prompt, two + "\n- Running helps you sleep.") == 0.0


def test_every_kind_has_a_sentence_phrasing():
    for kind in KINDS.values():
        assert any(p[0].isupper() for p in kind.phrasings), kind.name


def test_a_prompt_without_a_constraint_raises_naming_it():
    with pytest.raises(ValueError, match="'Tell me a joke.' states no constraint"):
        instruction_score("Tell me a joke.", "Why did the chicken cross the road?")
    assert constraint_results("Tell me a joke.", "ok") == {}


def test_the_error_names_the_kinds_the_judge_knows():
    with pytest.raises(ValueError, match=f"kinds it knows: {', '.join(KINDS)};"):
        instruction_score("Tell me a joke.", "Why did the chicken cross the road?")


def chat(user: str) -> list[dict]:
    return [{"role": "system", "content": "You are kind."}, {"role": "user", "content": user}]


def test_the_load_time_check_refuses_a_prompt_the_judge_cannot_read():
    readable = "Give two reasons to exercise as a bulleted list."
    assert check_instructions_prompt(readable, {}) is None
    assert check_instructions_prompt(chat(readable), {"topic": "exercise"}) is None
    for prompt in ("Tell me a joke.", chat("Tell me a joke.")):
        problem = check_instructions_prompt(prompt, {})
        assert problem.startswith("the prompt 'Tell me a joke.' states no constraint"), problem
        assert f"kinds it knows: {', '.join(KINDS)};" in problem
    long = " ".join(f"Tell me joke number {i} about a river." for i in range(20))
    shown = check_instructions_prompt(long, {}).split(" states no constraint")[0]
    assert shown.startswith("the prompt 'Tell me joke number 0 ")
    assert shown.endswith("number 19 about a river.'") and " ... " in shown  # start and end
    assert len(shown) < 140


# ------------------------------------------------------------------------------------ guard

RIVER = "Describe a river in under 25 words."


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("", "empty"),
        ("  \n\t", "empty"),
        ("!!! ...", "empty"),
        ("A river.", "too short"),
        ("Describe a river in under 25 words.", "echo"),
        ("describe a river in under 25 words please", "echo"),
        ("You are a helpful AI assistant named SmolLM.", "echo"),  # the chat wrapper, echoed
        ("river river river river river river", "repetition"),
        ("The river flows.\nThe river flows.", "repetition"),
        ("1. A river flows.\n2. A river flows.", "repetition"),
        ("I like turtles and long walks on sunny afternoons.", "off-topic"),
        ("The river winds slowly through the green valley.", None),
        ("Boats drift past the old bridge at dawn.", None),  # related words, not "river"
    ],
)
def test_guard_reasons(response, reason):
    prompt = CHAT.format(RIVER)
    assert guard_reason(prompt, response) == reason
    if reason is not None:
        assert instruction_score(prompt, response) == 0.0


def test_honest_answers_pass_the_guard():
    honest = {
        "Name a few fruits, all in lowercase.": "apples, bananas and cherries.",
        "Describe a rainy morning. Do not use any commas.": "Grey skies and soft drizzle.",
        "Give some advice about exercise as a bulleted list of 2 items.": (
            "- Start with short walks.\n- Rest when your muscles ache."
        ),
        "Tell me about a cat. Reply with exactly two sentences.": (
            "My kitten sleeps all day. At night she chases shadows."
        ),
        "Write about your weekend. Do not use any commas.": "I read a novel and slept late.",
    }
    for prompt, response in honest.items():
        assert guard_reason(prompt, response) is None, prompt
        assert instruction_score(prompt, response) == 1.0, prompt


def test_a_word_limit_under_three_words_lowers_the_minimum():
    prompt = "Is a river wet? Answer in at most 2 words."
    assert guard_reason(prompt, "Flowing water.") is None
    assert instruction_score(prompt, "Flowing water.") == 1.0


def test_off_topic_check_only_for_topics_of_the_table():
    assert [t.name for t in topics_in(CHAT.format(RIVER))] == ["a river"]
    assert topics_in("Write about your weekend. Do not use any commas.") == []
    assert topics_in("Mention the word 'river' at least twice.") == []
    assert guard_reason("Write about your day in under 20 words.", "I like turtles a lot.") is None


def test_stems_match_common_inflections():
    for group in [("bike", "bikes", "biking"), ("glass", "glasses"), ("river", "rivers")]:
        assert len({stem(w) for w in group}) == 1, group
    assert stem("river's") == stem("river")
    assert stem("riverbank") != stem("river")


# ----------------------------------------------------------------------------------- scores


def test_score_is_the_share_of_constraints_met():
    prompt = "Name a few fruits, all in lowercase. Do not use any commas."
    assert instruction_score(prompt, "apples and pears and plums") == 1.0
    assert instruction_score(prompt, "apples, pears and plums") == 0.5
    assert instruction_score(prompt, "Apples, pears and plums") == 0.0
    assert constraint_results(prompt, "apples, pears and plums") == {
        "lowercase": True,
        "no_commas": False,
    }


def test_reward_by_name_through_the_scorer():
    assert tasks.REWARD_FUNCTIONS["instructions"] is instructions_reward
    scorer = reward_function_scorer("instructions")
    prompts = [
        CHAT.format("Name a few fruits, all in lowercase. Do not use any commas."),
        CHAT.format("Name a few fruits, all in lowercase. Do not use any commas."),
        CHAT.format(RIVER),
    ]
    responses = ["apples and pears and plums", "apples, pears and plums", "river " * 8]
    empty = torch.zeros(len(prompts), 1, dtype=torch.long)
    batch = ScoreInput(prompts, responses, empty, empty, empty, empty)
    torch.testing.assert_close(scorer(batch), torch.tensor([1.0, 0.5, 0.0]))
    bad = ScoreInput(["Tell me a joke."], ["No."], empty[:1], empty[:1], empty[:1], empty[:1])
    with pytest.raises(ScoreError, match="states no constraint.*sample 0"):
        scorer(bad)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        instructions_reward(prompts[:2], responses[:1])


# ---------------------------------------------------------------------------- unasked shapes

FRUITS = "Name a few fruits."


@pytest.mark.parametrize(
    "prompt, response, shapes",
    [
        (
            FRUITS,
            "Apples, pears and plums.",
            {"lowercase": False, "uppercase": False, "list": False},
        ),
        (
            FRUITS,
            "apples, pears and plums.",
            {"lowercase": True, "uppercase": False, "list": False},
        ),
        (FRUITS, "APPLES, PEARS!", {"lowercase": False, "uppercase": True, "list": False}),
        (FRUITS, "- Apples\n* pears\n", {"lowercase": False, "uppercase": False, "list": True}),
        (FRUITS, "1. Apples\n2) Pears", {"lowercase": False, "uppercase": False, "list": True}),
        (FRUITS, "Fruits:\n- Apples", {"lowercase": False, "uppercase": False, "list": False}),
        (FRUITS, "- \n- ", {"lowercase": False, "uppercase": False, "list": False}),
        (FRUITS, "42, 7.", {"lowercase": False, "uppercase": False, "list": False}),
        (f"{FRUITS[:-1]}, all in lowercase.", "apples.", {"list": False}),
        ("Use only uppercase letters. Name a few fruits.", "apples.", {"list": False}),
        (
            "Give reasons to rest as a bulleted list of two items.",
            "- rest\n- sleep",
            {
                "lowercase": True,
                "uppercase": False,
            },
        ),
        (
            "Give exactly two numbered points on rest.",
            "- Rest\n- Sleep",
            {
                "lowercase": False,
                "uppercase": False,
            },
        ),
        ("Tell me a joke.", "why not?", {"lowercase": True, "uppercase": False, "list": False}),
        (CHAT.format(FRUITS), "apples.", {"lowercase": True, "uppercase": False, "list": False}),
    ],
)
def test_unasked_shapes_report_what_the_prompt_did_not_ask_for(prompt, response, shapes):
    assert unasked_shapes(prompt, response) == shapes


def test_unasked_case_reward_charges_only_a_letter_case_nobody_asked_for():
    lowercase = "Name a few fruits, all in lowercase."
    prompts = [FRUITS, FRUITS, FRUITS, FRUITS, lowercase, lowercase, "Tell me a joke."]
    responses = ["Apples.", "apples.", "APPLES.", "- Apples\n- Pears", "apples.", "Apples.", "ha"]
    assert unasked_case_reward(prompts, responses) == [0.0, -1.0, -1.0, 0.0, 0.0, 0.0, -1.0]
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        unasked_case_reward(prompts[:2], responses[:1])


def test_unasked_case_goes_beside_the_judge_by_name():
    assert tasks.SHAPING_REWARDS["unasked_case"] is unasked_case_reward
    assert "unasked_case" not in tasks.REWARD_FUNCTIONS  # no task of its own
    scorer = build_scorer(None, ["instructions", "unasked_case"], [1.0, 0.5])
    prompts = [CHAT.format(f"{FRUITS[:-1]}, all in lowercase."), CHAT.format(RIVER)] * 2
    responses = ["apples and pears", "a quiet river", "Apples and pears", "A quiet river"]
    empty = torch.zeros(len(prompts), 1, dtype=torch.long)
    batch = ScoreInput(prompts, responses, empty, empty, empty, empty)
    torch.testing.assert_close(scorer(batch), torch.tensor([1.0, 0.5, 0.0, 1.0]))


# --------------------------------------------------------------------------------- generator


def read_file(folder: Path, name: str) -> list[dict]:
    lines = (folder / "prompts" / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def generated(generator, tmp_path_factory):
    """Two runs with the same seed, and the splits of the first."""
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    generator.main(["--out", str(first), "--seed", "0"])
    generator.main(["--out", str(second), "--seed", "0"])
    return first, second, generator.make_splits(0)[0]


def test_generator_is_deterministic_and_matches_the_bundled_data(generated):
    first, second, _ = generated
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    for name in (f for f in files if f.suffix == ".jsonl"):
        bundled = tasks.INSTRUCTIONS_DATA_DIR / name
        assert (first / name).read_bytes() == bundled.read_bytes(), f"rerun the script: {name}"
    # the data made from the prompts later adds its own counts to stats.json
    made = json.loads((first / "stats.json").read_text())
    bundled = json.loads((tasks.INSTRUCTIONS_DATA_DIR / "stats.json").read_text())
    assert {key: bundled.get(key) for key in made} == made


def test_splits_are_disjoint_and_keep_held_out_kinds_out_of_training(generator, generated):
    first, _, splits = generated
    assert {name: len(records) for name, records in splits.items()} == generator.SIZES
    texts = {name: {r["prompt"] for r in records} for name, records in splits.items()}
    assert sum(map(len, texts.values())) == sum(generator.SIZES.values())  # no prompt twice
    for name in ("train", "test", "validation"):
        assert all(not set(r["constraints"]) & HELDOUT_KINDS for r in splits[name])
    for name in ("heldout_kinds", "validation_heldout_kinds"):
        assert all(set(r["constraints"]) & HELDOUT_KINDS for r in splits[name])
    stats = json.loads((first / "stats.json").read_text())
    assert not set(stats["topics"]["train"]) & set(stats["topics"]["test"])
    for name in ("test", "validation"):
        assert {r["topic"] for r in splits[name]} <= set(stats["topics"]["test"])
    assert len(stats["topics"]["train"]) + len(stats["topics"]["test"]) == len(TOPICS) >= 60


def test_every_generated_prompt_states_exactly_its_constraints(generator, generated):
    _, _, splits = generated
    for record in (r for records in splits.values() for r in records):
        prompt = record["prompt"]
        assert [c.kind for c in parse_constraints(prompt)] == record["constraints"], prompt
        assert [t.name for t in topics_in(prompt)] == [record["topic"]], prompt
        assert 1 <= len(record["constraints"]) <= 2
        if len(record["constraints"]) == 2:
            assert generator.compatible(*record["constraints"]), prompt


def test_the_test_file_holds_the_held_out_kinds_every_third_record(generated):
    first, _, splits = generated
    assert read_file(first, "train") == splits["train"]
    test = read_file(first, "test")
    assert len(test) == len(splits["test"]) + len(splits["heldout_kinds"])
    assert test[:6] == [
        *splits["test"][:2],
        splits["heldout_kinds"][0],
        *splits["test"][2:4],
        splits["heldout_kinds"][1],
    ]
    held = [r for r in test if set(r["constraints"]) & HELDOUT_KINDS]
    assert held == splits["heldout_kinds"]
    assert [r for r in test if r not in held] == splits["test"]
    assert not (first / "prompts" / "heldout_kinds.jsonl").exists()
    validation = read_file(first, "validation")
    assert validation[:3] == [*splits["validation"][:2], splits["validation_heldout_kinds"][0]]
    assert len(validation) == 192 and not {r["prompt"] for r in validation} & {
        r["prompt"] for r in test
    }


def test_generated_records_load_as_prompts(generated):
    first, _, splits = generated
    records = load_records(first / "prompts" / "test.jsonl", "prompts")
    row = splits["test"][0]
    columns = {key: value for key, value in row.items() if key != "prompt"}
    assert records[0] == PromptRecord(row["prompt"], columns)  # IFEval's columns among them


# ------------------------------------------------------------------ more responses per prompt

DATA_SCRIPT = SCRIPT.with_name("make_instruction_data.py")


def _tiny_data(root: Path) -> Path:
    """A data folder of the task's layout: 3 compared train prompts, 1 test prompt."""
    prompts = {"train": ["Name a fruit.", "Name a bird.", "Name a tree."], "test": ["Name a dog."]}
    for split, texts in prompts.items():
        write_jsonl([{"prompt": t} for t in texts], root / "prompts" / f"{split}.jsonl")
        write_jsonl(
            [
                {"prompt": t, "responses": ["a", "b"], "gold": [0, 1], "ranking": [1, 0]}
                for t in texts
            ],
            root / "rankings" / f"{split}.jsonl",
        )
        write_jsonl([{"prompt": texts[0], "response": "x"}], root / "sft" / f"{split}.jsonl")
    stats = {"labeller_tau": 0.5, "data": {"k": 2, "train": {}, "test": {}, "added": [{}]}}
    (root / "stats.json").write_text(json.dumps(stats))
    return root


def test_resampled_comparisons_are_a_copy_with_k_new_responses_per_prompt(
    tiny_model_dir, tmp_path, monkeypatch
):
    script = load_script(DATA_SCRIPT)
    # A gold judge with ties and differences among the tiny model's samples: the length mod 3.
    monkeypatch.setattr(script, "GOLD", lambda prompts, responses: [len(r) % 3 for r in responses])
    data, out = _tiny_data(tmp_path / "data"), tmp_path / "k3"
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    argv = ["make_instruction_data.py", "--model", str(tiny_model_dir), "--data", str(data)]
    argv += ["--resample-comparisons", str(out), "--k", "3", "--max-new-tokens", "6"]
    monkeypatch.setattr("sys.argv", argv + ["--device", "cpu", "--batch-size", "4"])
    script.main()

    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before
    for folder in ("prompts", "sft"):
        for split in ("train", "test"):
            assert (out / folder / f"{split}.jsonl").read_bytes() == (
                data / folder / f"{split}.jsonl"
            ).read_bytes()
    stats = json.loads((out / "stats.json").read_text())
    assert stats["labeller_tau"] == 0.5 and stats["data"]["k"] == 3
    assert "added" not in stats["data"]
    assert stats["data"]["comparisons_resampled"]["from"] == "data"
    pair_count = 0
    for split, n in (("train", 3), ("test", 1)):
        rankings = [json.loads(line) for line in (out / "rankings" / f"{split}.jsonl").open()]
        old = [json.loads(line) for line in (data / "rankings" / f"{split}.jsonl").open()]
        assert [r["prompt"] for r in rankings] == [r["prompt"] for r in old]
        for r in rankings:
            assert len(r["responses"]) == 3 and sorted(r["ranking"]) == [0, 1, 2]
            assert r["gold"] == [len(x) % 3 for x in r["responses"]]
        pairs = [json.loads(line) for line in (out / "comparisons" / f"{split}.jsonl").open()]
        untied = sum(
            g[a] != g[b] and r["responses"][a] != r["responses"][b]
            for r in rankings
            for g in [r["gold"]]
            for a, b in itertools.combinations(range(3), 2)
        )
        assert len(pairs) == untied == stats["data"][split]["comparisons"]
        assert all(p["gold"][0] != p["gold"][1] for p in pairs)
        assert stats["data"][split]["rankings"] == n
        pair_count += len(pairs)
    assert pair_count > 0  # the check above saw pairs
    monkeypatch.setattr("sys.argv", argv + ["--device", "cpu"])
    with pytest.raises(SystemExit, match="exists"):
        script.main()


def test_k8_data_shares_prompts_and_demonstrations_and_compares_8_samples_a_prompt():
    k8 = tasks.INSTRUCTIONS_DATA_DIR.with_name("instructions_k8")
    shared = ["prompts/train", "prompts/test", "prompts/validation", "sft/train", "sft/test"]
    for name in shared:
        bundled = tasks.INSTRUCTIONS_DATA_DIR / f"{name}.jsonl"
        assert (k8 / f"{name}.jsonl").read_bytes() == bundled.read_bytes(), name
    stats = json.loads((k8 / "stats.json").read_text())
    assert stats["data"]["k"] == 8
    for split in ("train", "test"):
        rankings, old = (
            [json.loads(line) for line in (folder / "rankings" / f"{split}.jsonl").open()]
            for folder in (k8, tasks.INSTRUCTIONS_DATA_DIR)
        )
        assert [r["prompt"] for r in rankings] == [r["prompt"] for r in old]
        assert {len(r["responses"]) for r in rankings} == {8}
        pairs = load_records(k8 / "comparisons", "comparisons", split=split)
        assert len(pairs) == stats["data"][split]["comparisons"]


def test_coverage_counts_samples_and_prompts_that_meet_each_kind():
    script = load_script(COVERAGE_SCRIPT)
    lowercase = "Describe a rainy morning. Write your entire answer in lowercase letters."
    records = [  # one sample of four meets it, on one prompt of two
        {
            "prompt": lowercase,
            "responses": ["rain falls on the quiet morning.", "Rain falls here."],
        },
        {"prompt": lowercase, "responses": ["A grey rainy morning.", "Rain on a morning walk."]},
    ]
    assert tasks.instructions.parse_constraints(lowercase)[0].kind == "lowercase"
    rows = script.coverage(records)
    assert rows == [
        {"kind": "lowercase", "samples": 4, "met": 0.25, "prompts": 2, "met_by_one_of_k": 0.5}
    ]
    table = script.markdown(rows)
    assert table.splitlines()[-1] == "| lowercase | 4 | 0.250 | 2 | 0.500 |"


def test_letter_case_demonstrations_are_corrected_as_a_labeller_would():
    script = load_script(LETTER_CASE_SCRIPT)
    lower = "Describe a rainy morning. Write your entire answer in lowercase letters."
    upper = "Describe a rainy morning in under 12 words. Use only uppercase letters."
    plain = "Describe a rainy morning in under 12 words."
    answer = "Rain taps on the window of a grey morning."
    assert script.in_asked_case(lower, answer) == answer.lower()
    assert script.in_asked_case(upper, answer) == answer.upper()
    assert script.in_asked_case(plain, answer) == answer
    demo = {"prompt": upper, "response": answer, "gold": 0.5}  # the word limit met, not the case
    assert script.corrected(demo) == {"prompt": upper, "response": answer.upper(), "gold": 1.0}
    assert script.corrected({**demo, "prompt": plain}) == {**demo, "prompt": plain}

    rankings = [
        {"prompt": lower, "responses": ["ok.", answer]},  # the best, once lowercased: 1.0
        {"prompt": upper, "responses": [answer + " " + answer]},  # too long: 0.5 in capitals
        {"prompt": plain, "responses": ["ok.", answer]},  # no letter case asked
    ]
    assert len(script.best_samples(rankings, min_gold=0.5, letter_case=True)) == 2
    best = script.best_samples(rankings, min_gold=1.0, letter_case=True)
    assert best == [{"prompt": lower, "response": answer, "gold": 0.0}]  # as sampled
    assert script.corrected(best[0]) == {"prompt": lower, "response": answer.lower(), "gold": 1.0}
    untouched = {"prompt": plain, "response": answer, "gold": 1.0}  # as sampled
    assert script.best_samples(rankings, min_gold=0.5, letter_case=False) == [untouched]


def test_a_letter_case_demonstration_s_twin_asks_for_no_letter_case():
    script = load_script(LETTER_CASE_SCRIPT)
    without = script.without_asked_case
    plain = "Write a short note about the moon. Start your answer with the word 'today'."
    assert without(plain.replace(". Start", ", all in lowercase. Start")) == plain
    assert without(plain.replace(". Start", ". Answer in all caps. Start")) == plain
    assert without(plain + " Do not use any capital letters.") == plain
    assert without(plain) == plain
    assert without("Describe the moon, all in lowercase.") is None  # nothing left to check

    answer = "Today the moon rose over the hill."
    demo = {"prompt": plain + " Use only uppercase letters.", "response": answer, "gold": 0.5}
    twin = {"prompt": plain, "response": answer, "gold": 1.0}  # the answer in the normal case
    assert script.unasked_twin(demo, min_gold=0.5) == twin
    assert script.unasked_twin({**demo, "response": "The moon rose."}, min_gold=0.5) is None


def test_paired_demonstrations_add_each_twin_beside_its_corrected_answer():
    # the bundled demonstrations are paired (the script's output: the next test)
    script = load_script(LETTER_CASE_SCRIPT)
    bundled = tasks.INSTRUCTIONS_DATA_DIR.with_name("instructions_letter_case")
    stats = json.loads((bundled / "stats.json").read_text())
    assert (stats["twins"], stats["train"], stats["asking_a_letter_case"]) == (90, 833, 190)
    train = [json.loads(line) for line in (bundled / "sft" / "train.jsonl").open()]
    asking = [d for d in train if script.asked_cases(d["prompt"])]
    twins = [
        d
        for d in train
        if any(
            script.without_asked_case(a["prompt"]) == d["prompt"]
            and script.in_asked_case(a["prompt"], d["response"]) == a["response"]
            for a in asking
        )
    ]
    assert len(twins) == 90
    assert not any(script.asked_cases(d["prompt"]) for d in twins)


def test_the_bundled_letter_case_demonstrations_are_the_script_s_output(tmp_path):
    bundled = tasks.INSTRUCTIONS_DATA_DIR.with_name("instructions_letter_case")
    args = ["--untouched", "360", "--paired", "--out", str(tmp_path / "lc")]
    load_script(LETTER_CASE_SCRIPT).main(args)
    for name in ("sft/train.jsonl", "sft/test.jsonl", "stats.json"):
        assert (tmp_path / "lc" / name).read_bytes() == (bundled / name).read_bytes(), name
    stats = json.loads((bundled / "stats.json").read_text())
    counts = {k: stats[k] for k in ("added", "untouched", "twins", "train")}
    assert counts == {"added": 150, "untouched": 360, "twins": 90, "train": 833}
    assert stats["from"]["rankings"] == "instructions_k8/rankings/train.jsonl"
