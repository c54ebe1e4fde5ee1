"""Built-in tasks of the embedded default: the gold judge of "continue the text, positively",
the seed's "digits" reward, the checkable instructions, a diversity metric, and the paths of
the bundled assets.

The sentiment task follows OpenAI's lm-human-preferences (Ziegler et al. 2019, "Fine-Tuning
Language Models from Human Preferences", the "sentiment" task) and TRL's IMDB example: a prompt
is the opening of a held-out sentence, the policy continues it, and the score says how positive
the continuation is. Departure: instead of a learned sentiment classifier we use the VADER
lexicon (Hutto & Gilbert 2014, PyPI ``vaderSentiment``), which is transparent and runs
anywhere, but is easy to game with word salad ("good good good good" scores 0.93). So the gold
judge adds fluency penalties, and those are what makes degenerate text lose:

    gold(text) = vader_compound(text) * min(1, n_words / 5) - min(2, R + N + T)

    R = 0.5 * (1 - distinct_1) + (1 - distinct_2)   repetition of words and word bigrams
    N = share of words not in the six novels' vocabulary (nor VADER's lexicon)   non-words
    T = 5 * max(0, 0.2 - share of function words)    telegraphic lists, "joy love happy"
                                                     (only from 3 words on)

with words as lower-cased ``[a-z]+('[a-z]+)?`` runs. Scale: in [-3, 1]; fluent text lies in
about [-1, 1] (a plainly positive sentence scores 0.5 to 0.9, a plainly negative one -0.5 to
-0.9); an empty response scores 0; "good good good good good" scores about -1.07, "happy joy love delighted
wonderful charming excellent" about 0.

The gold judge stands for the human labeller: training only sees it through the simulated
preference labels in ``assets/data/demo`` (see ``scripts/make_demo_data.py``), and evaluation
reports it as the "gold score".

The digits task is the user's own toy experiment: reward = how many numbers a continuation
contains, capped at ``DIGITS_CAP`` = 10 so that the optimum is reachable and the scale stays
small. A number is a maximal run of digits ("411") or an English cardinal word ("ten",
"thousand"; each word counts once). Departure from a digits-only count: Austen wrote numbers
as words, so the base model's samples rarely contain a digit but far more often a number word
(counts: docs/grpo.md, "Why the digits reward counts number words"); counting words gives the
learner a signal to start from. Degenerate "411 411 355 355 ..." or "ten ten two ten" text
maximises it; that is the point of the experiment (the KL penalty is what should stop it).

The instructions task ("instructions with checkable constraints", ``tasks/instructions.py``)
follows IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language Models")
and the verifiable rewards of Tulu 3's RLVR (Lambert et al. 2024): a prompt is a task sentence
plus one or two constraints a program can check ("in under 25 words", "all in lowercase"), and
the reward is the share of the constraints met, zeroed by a guard against empty, echoed,
repetitive or off-topic answers. Its prompts are in ``assets/data/instructions`` (see
``scripts/make_instruction_prompts.py``), and carry their constraints in IFEval's own
vocabulary too (columns ``instruction_id_list`` and ``kwargs``), which the ``ifeval`` reward
checks with IFEval's reference checkers (``tasks/ifeval.py``).

The math task (``tasks/math_problems.py``) is reinforcement learning from verifiable rewards
as the field writes it: arithmetic word problems with their ``answer`` column
(``assets/data/math``, from ``scripts/make_math_problems.py``), and the ``math`` reward, 1 where
the response's final answer equals it by Math-Verify, the verifier of TRL's and open-r1's
accuracy rewards. Its reward functions are written TRL's way, ``f(completions, answer,
**kwargs)``: they get the dataset's columns by name.
"""

from __future__ import annotations

import functools
import lzma
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

from rlhfkit.tasks import calculator, guessing, ifeval, instructions, math_problems
from rlhfkit.tasks.instructions import check_lengths

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
BASE_MODEL_DIR = ASSETS_DIR / "base"
CORPUS_DIR = ASSETS_DIR / "corpus"
DEMO_DATA_DIR = ASSETS_DIR / "data" / "demo"
INSTRUCTIONS_DATA_DIR = ASSETS_DIR / "data" / "instructions"
MATH_DATA_DIR = ASSETS_DIR / "data" / "math"

WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")  # keep in sync with scripts/build_corpus.py
NUMBER = re.compile(r"\d+")
_NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand million"
)
NUMBER_WORDS = frozenset(_NUMBER_WORDS.split())
DIGITS_CAP = 10
MIN_WORDS = 5  # fewer words than this earn only a share of the sentiment: no 1-word answers
MAX_PENALTY = 2.0
MIN_FUNCTION_SHARE = 0.2  # fluent English prose has 40-55% function words
_FUNCTION_WORDS = (
    "a an the and or but nor so yet if then than that this these those there here of in on at "
    "to for from by with without about into over under as is was were be been being am are has "
    "have had do does did not no i me my we us our you your he him his she her it its they them "
    "their who whom which what when where why how all any each some such very too can could "
    "will would shall should may might must"
)
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())


def demo_data(name: str) -> Path:
    """Path of a bundled demo data folder or file: ``demo_data("comparisons")`` (a folder
    with train.jsonl and test.jsonl, as ``data.load_records`` takes it) or
    ``demo_data("sft/test.jsonl")``. Folders: prompts, sft, comparisons, rankings."""
    path = DEMO_DATA_DIR / name
    if not path.exists():
        have = sorted(str(p.relative_to(DEMO_DATA_DIR)) for p in DEMO_DATA_DIR.rglob("*"))
        raise FileNotFoundError(f"no demo data {name!r} in {DEMO_DATA_DIR}; have {have}")
    return path


def words(text: str) -> list[str]:
    """Lower-cased words, apostrophes kept inside words ("don't"), punctuation dropped."""
    return WORD.findall(text.lower())


def _distinct_ratio(tokens: list[str], n: int) -> float:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Corpus-level distinct-n (Li et al. 2016): distinct word n-grams / all word n-grams over
    all texts; 0.0 when the texts hold no n-gram at all. Falls as a policy collapses."""
    if n < 1:
        raise ValueError(f"distinct_n: n={n}, allowed: n >= 1")
    grams = [tuple(ws[i : i + n]) for ws in map(words, texts) for i in range(len(ws) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


@functools.lru_cache(maxsize=1)
def _analyzer() -> SentimentIntensityAnalyzer:
    return SentimentIntensityAnalyzer()


@functools.lru_cache(maxsize=1)
def known_words() -> frozenset[str]:
    """Every word of the six novels plus VADER's lexicon: the judge's idea of a real word."""
    with lzma.open(CORPUS_DIR / "words.txt.xz", "rt", encoding="ascii") as f:
        corpus_words = {line.strip() for line in f if line.strip()}
    return frozenset(corpus_words | set(_analyzer().lexicon))


def sentiment(text: str) -> float:
    """VADER compound score of ``text``, in [-1, 1]."""
    return _analyzer().polarity_scores(text)["compound"]


def fluency_penalty(text: str) -> float:
    """R + N + T of the module docstring, capped at ``MAX_PENALTY``; 0.0 for fluent prose."""
    ws = words(text)
    if not ws:
        return 0.0
    repetition = 0.5 * (1.0 - _distinct_ratio(ws, 1)) + (1.0 - _distinct_ratio(ws, 2))
    vocab = known_words()
    nonwords = sum(w not in vocab for w in ws) / len(ws)
    function_share = sum(w in FUNCTION_WORDS for w in ws) / len(ws)
    # a reply of one or two words ("Indeed.") is short, not telegraphic: the length factor
    # of gold_score already handles it
    telegraphic = 5.0 * max(0.0, MIN_FUNCTION_SHARE - function_share) if len(ws) >= 3 else 0.0
    return min(MAX_PENALTY, repetition + nonwords + telegraphic)


def gold_score(text: str) -> float:
    """Gold judge of one continuation (formula and scale in the module docstring)."""
    length_factor = min(1.0, len(words(text)) / MIN_WORDS)
    return sentiment(text) * length_factor - fluency_penalty(text)


def digits_score(text: str, cap: int = DIGITS_CAP) -> float:
    """How many numbers ``text`` contains, capped at ``cap``: digit runs ("411", "1814") plus
    cardinal number words ("two", "thousand")."""
    count = len(NUMBER.findall(text)) + sum(w in NUMBER_WORDS for w in words(text))
    return float(min(cap, count))


def gold_reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Reward function of the sentiment task: ``gold_score`` of each response. The prompt is
    not scored: the policy is rewarded only for what it wrote."""
    check_lengths(prompts, responses)
    return [gold_score(r) for r in responses]


def digits_reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Reward function of the digits task: ``digits_score`` of each response."""
    check_lengths(prompts, responses)
    return [digits_score(r) for r in responses]


REWARD_FUNCTIONS = {
    "sentiment": gold_reward,
    "digits": digits_reward,
    "instructions": instructions.instructions_reward,
    "ifeval": ifeval.ifeval_reward,
    "math": math_problems.math_reward,
    "calculator": calculator.answer_reward,
    "guessing": guessing.solved,
}
"""The gold judge of each built-in task, by the task's name."""

SHAPING_REWARDS = {
    "unasked_case": instructions.unasked_case_reward,
    "math_format": math_problems.math_format_reward,
}
"""Reward functions that judge no task alone but go beside a judge's score, by name."""

BUNDLED_REWARDS = {**REWARD_FUNCTIONS, "gold": gold_reward, **SHAPING_REWARDS}
"""Every reward function rlhfkit ships, by the name ``reward_functions`` takes ("gold" is the
sentiment task's judge under its older name)."""

PROMPT_CHECKS: dict[str, Callable[[object, dict], str | None]] = {
    "instructions": instructions.check_instructions_prompt,
    "ifeval": ifeval.check_ifeval_prompt,
    "math": math_problems.check_math_prompt,
}
"""A bundled reward function's check of one prompt record, by its name: (prompt as written,
the row's other columns) -> what the function cannot take in it, or None. Run when the data
loads, so a prompt it cannot judge stops the run before any model loads."""


@dataclass(frozen=True)
class Breakdown:
    """How a task's gold score splits into parts that an evaluation reports one by one."""

    parts: Callable[[str, str], dict[str, bool]]
    """(prompt, response) -> whether the response meets each part the prompt asks for."""
    held_out: frozenset[str] = frozenset()
    """Parts that never appear in the training prompts."""
    unasked: Callable[[str, str], dict[str, bool]] | None = None
    """(prompt, response) -> for each shape the prompt does not ask for, whether the response
    takes it: side effects the gold score does not see."""


BREAKDOWNS = {
    "instructions": Breakdown(
        instructions.passed_constraints, instructions.HELDOUT_KINDS, instructions.unasked_shapes
    ),
}
