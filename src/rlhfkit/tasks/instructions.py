"""The instructions task: prompts with constraints a program can check, and their gold judge.

In the spirit of IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language
Models"), whose instructions are "verifiable" ("answer in at least 300 words", "wrap your
answer in double quotes"), and of the verifiable rewards of Tulu 3's RLVR (Lambert et al.
2024), where a program, not a learned model, says whether a response met the prompt. A prompt
is a task sentence on an everyday topic plus one or two constraints, e.g. "Describe a rainy
morning in under 25 words." or "Name a few fruits, all in lowercase. Do not use any commas."

Each constraint kind (``KINDS``) has phrasings: templates whose slots are ``{n}`` (a number as
digits), ``{below}`` (digits, one more than the parameter: "under 25 words" means at most 24),
``{count}`` (a number word, "three", digits or "a single"), ``{times}`` ("once", "twice",
"three times") and ``{word}`` (a word, quoted as the generator writes it, or bare as IFEval
does). A phrasing that starts in lower case ("in under {below} words") is a fragment that the
prompt generator appends to the task sentence; the others are sentences.
``HELDOUT_KINDS`` never appear in the training prompts: they measure whether following
instructions carries over to kinds of constraint never rewarded.

A kind may also have phrasings the judge understands but the generator never writes
(``understood``), so the judge works on prompts written by hand: IFEval's own wording of the
kinds it checks ("Answer with less than 100 words.", "Include keywords ['river', 'sun'] in the
response.") and how people ask ("Answer in one sentence.", "Give two reasons to exercise as a
bulleted list."). Their templates may also hold groups of alternatives, "(answer|response)"
(one may be empty: "(entire |)"), and the slots ``{above}`` (digits, one less than the
parameter: "more than 50 words" means at least 51), ``{words}`` (quoted words joined by commas
or "and", or a list of them as IFEval writes it: one constraint each) and ``{things}`` (the
words a count is of, "two reasons to exercise": the items of a list); a kind's
``unstated_n`` is the number meant where a phrasing states none ("Use the word 'rain'.": at
least once). IFEval wording that means something else is left out: its sentence counts ("less
than 5 sentences") are bounds, not an exact count, its paragraphs are separated by ``***``,
not blank lines, and its postscript may start with "P.P.S". Nor is a number made up where a
prompt gives none: "as a bulleted list" alone states no number of bullets.

The parser turns every phrasing into a regular expression and searches it anywhere in the
prompt, because prompts reach reward functions as decoded text that may hold a chat template's
rendering ("system\\n...\\nuser\\nDescribe ...\\nassistant\\n"); letter case and the spacing
between words do not matter. Because the wording people use also turns up in text that asks
for nothing:

- a judge-only phrasing that is a sentence counts only where a sentence, a line or a clause
  starts, "Please" or a list marker aside ("How do you use the word 'affect'?" asks for no
  keyword), and one that ends in a period only where a clause ends: . ! , ; : ")", "and",
  "then" or a line's end ("Why do people write in all caps?" asks for no capitals);
- no phrasing counts that ends inside a word or right before "each", "per" or "or" ("under 10
  words per sentence"), nor one after a negation in its clause: "no", "not", "n't", "never",
  "without", "avoid", "refrain" ("Do not answer in lowercase", "no fewer than 50 words");
- where phrasings found overlap, the one that starts first (the longest of those) counts:
  "Use the word 'rain' at least twice." is not also "Use the word 'rain'."

Rules of the checks (the judge sees only the prompt text and the response):

- word: a run of letters or digits, with internal apostrophes or hyphens ("don't",
  "well-known"); punctuation alone is no word. "It's a well-known, rainy day." has 5 words.
- sentence: text up to ``.``, ``!`` or ``?`` (closing quotes or brackets may follow) before
  whitespace or the end, or up to a line break; pieces without a word do not count, so an
  unpunctuated line (a heading, a list item) is one sentence. A piece ending in one of the
  abbreviations Mr. Mrs. Ms. Dr. Prof. St. vs. e.g. i.e. runs on; other abbreviations ("U.S.")
  end a sentence.
- paragraphs: pieces separated by blank lines. Bullet items: lines starting with ``-``, ``*``
  or ``•`` and a space; numbered items: lines starting with "1." or "1)"; a list may have an
  introduction; bullets and numbered items do not count for each other.
- a given word (keyword, forbidden word, first and last word) matches a whole word, case
  aside, or its possessive ("river's"): neither "rivers" nor "riverbank" is "river". The first
  and last word are the first and last words of the response, whatever punctuation or quotes
  surround them.

The score of a response is the share of the prompt's constraints it meets, times a guard of 0
or 1 against meeting constraints by saying nothing (``guard_reason``): "Do not use any commas"
is met by "ok ok ok". The guard gives 0 to a response that is

- "empty": no word at all;
- "too short": under 3 words (or under the word limit, where the prompt asks for fewer);
- "echo": half or more of its word trigrams are in the prompt;
- "repetition": a line (list markers aside) written twice, or from 4 words on, fewer than half
  of its word bigrams distinct (Li et al. 2016's distinct-2);
- "off-topic": the prompt names a topic of ``TOPICS`` and the response uses none of that
  topic's words, compared after stripping "ing", "ed", "es", "s" and a final "e" (``stem``),
  a word also counting where it starts with a topic word of 4 letters or more ("snowflakes").
  The topic's words are the content words of its name plus a list of related words, so
  "Name a few fruits." accepts "Apple, banana and cherry." The judge knows only the topics
  of its table: for any other prompt this check is skipped. It errs towards passing: a
  response that talks about the topic in none of its listed words fails, but one that names
  a listed word in passing passes.

A prompt in which the parser finds no constraint is a ValueError, not a score: the judge is for
this task's prompts, and a silent 0 or 1 for any other would hide the mistake. The data's
load-time check (``check_instructions_prompt``) refuses such a prompt before a run starts,
naming it and the kinds the judge knows.

The judge scores only what a prompt asks for, so it never charges for a shape nobody asked
for: an answer all in lowercase meets every other kind as well as one in the normal case. A
policy trained on it learns lowercase where a prompt asks for it and may carry it over to the
prompts that do not. ``unasked_shapes`` says which shapes a response takes that its prompt did
not ask for (all lowercase, all capitals, a list), for an evaluation to report, and
``unasked_case_reward`` charges -1 for a letter case nobody asked for, a reward function to add
beside the judge (``reward_functions: [instructions, unasked_case]``) where that carry-over
matters. Lists are reported, not charged: a list is a fair answer to "Name a few fruits."
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfkit.tasks.completions import prompt_text

WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
NUMBER_NAMES = ("zero", "one", "two", "three", "four", "five")
NUMBER_NAMES += ("six", "seven", "eight", "nine", "ten")
MIN_WORDS = 3
ECHO_SHARE = 0.5  # this share of a response's word trigrams found in the prompt is an echo
MIN_DISTINCT_2 = 0.5
_ABBREVIATION = re.compile(r"(?:\b(?:mr|mrs|ms|dr|prof|st|vs)|\be\.g|\bi\.e)\.$", re.IGNORECASE)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|\n+")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_BULLET = re.compile(r"[ \t]*[-*•][ \t]+")
_NUMBERED = re.compile(r"[ \t]*\d+[.)][ \t]+")
_LIST_MARKER = re.compile(r"[ \t]*(?:[-*•]|\d+[.)])[ \t]+")
_POSTSCRIPT = re.compile(r"^\s*p\.\s?s\.[^\n]*?[^\W_]", re.IGNORECASE | re.MULTILINE)
_TITLE = re.compile(r"<<[^<>\n]*?[^\W_][^<>\n]*>>")
_OPENING_QUOTES, _CLOSING_QUOTES = '"“', '"”'


def words(text: str) -> list[str]:
    """The words of ``text`` (module docstring), lower-cased, curly apostrophes made straight."""
    return [w.lower().replace("’", "'") for w in WORD.findall(text)]


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (module docstring): pieces with a word, abbreviations joined."""
    pieces: list[str] = []
    for piece in _SENTENCE_BREAK.split(text.strip()):
        if pieces and _ABBREVIATION.search(pieces[-1]):
            pieces[-1] += " " + piece
        else:
            pieces.append(piece)
    return [p for p in pieces if words(p)]


def paragraphs(text: str) -> list[str]:
    """The pieces of ``text`` between blank lines that hold a word."""
    return [p for p in _PARAGRAPH_BREAK.split(text.strip()) if words(p)]


def _items(text: str, marker: re.Pattern) -> int:
    """How many lines start with ``marker`` and have a word after it."""
    matches = (marker.match(line) for line in text.splitlines())
    return sum(bool(m and words(m.string[m.end() :])) for m in matches)


def _is(token: str, word: str) -> bool:
    """Whether a word of a response is ``word`` or its possessive."""
    return token in (word, f"{word}'s")


def _occurrences(text: str, word: str) -> int:
    """How often ``word`` appears in ``text`` as a whole word or its possessive."""
    return sum(_is(token, word) for token in words(text))


# ------------------------------------------------------------------------------- constraints


@dataclass(frozen=True)
class Constraint:
    """One constraint of a prompt: its kind's name and parameters (``n``: a number of words,
    sentences, items or times; ``word``: the word asked for or forbidden, lower case)."""

    kind: str
    n: int | None = None
    word: str | None = None

    def met(self, response: str) -> bool:
        """Whether ``response`` meets this constraint."""
        return KINDS[self.kind].check(self, response)


@dataclass(frozen=True)
class Kind:
    """A kind of constraint: its phrasings (module docstring), those the judge only reads
    (``understood``: never written into generated prompts), its check, and the number a
    phrasing that states none means (``unstated_n``: "Use the word 'rain'." is at least once)."""

    name: str
    check: Callable[[Constraint, str], bool]
    phrasings: tuple[str, ...]
    understood: tuple[str, ...] = ()
    unstated_n: int | None = None

    def patterns(self) -> list[re.Pattern]:
        """The regular expressions that recognise the phrasings in a prompt."""
        written = [_pattern(p) for p in self.phrasings]
        return written + [_pattern(p, understood=True) for p in self.understood]


def _max_words(c: Constraint, response: str) -> bool:
    return len(words(response)) <= c.n


def _min_words(c: Constraint, response: str) -> bool:
    return len(words(response)) >= c.n


def _sentences(c: Constraint, response: str) -> bool:
    return len(sentences(response)) == c.n


def _paragraphs(c: Constraint, response: str) -> bool:
    return len(paragraphs(response)) == c.n


def _bullets(c: Constraint, response: str) -> bool:
    return _items(response, _BULLET) == c.n


def _numbered(c: Constraint, response: str) -> bool:
    return _items(response, _NUMBERED) == c.n


def _lowercase(c: Constraint, response: str) -> bool:
    return response == response.lower() and any(ch.isalpha() for ch in response)


def _uppercase(c: Constraint, response: str) -> bool:
    return response == response.upper() and any(ch.isalpha() for ch in response)


def _no_commas(c: Constraint, response: str) -> bool:
    return "," not in response and "，" not in response


def _start_word(c: Constraint, response: str) -> bool:
    tokens = words(response)
    return bool(tokens) and _is(tokens[0], c.word)


def _end_word(c: Constraint, response: str) -> bool:
    tokens = words(response)
    return bool(tokens) and _is(tokens[-1], c.word)


def _keyword(c: Constraint, response: str) -> bool:
    return _occurrences(response, c.word) >= c.n


def _forbidden_word(c: Constraint, response: str) -> bool:
    return _occurrences(response, c.word) == 0


def _quotes(c: Constraint, response: str) -> bool:
    text = response.strip()
    return (
        len(text) >= 2
        and text[0] in _OPENING_QUOTES
        and text[-1] in _CLOSING_QUOTES
        and bool(words(text[1:-1]))
    )


def _title(c: Constraint, response: str) -> bool:
    return _TITLE.search(response) is not None


def _postscript(c: Constraint, response: str) -> bool:
    return _POSTSCRIPT.search(response) is not None


_ANSWER = "(answer|response|reply)"  # how a judge-only phrasing names the response
# the word before a number of words: "Answer with at least 40 words." is a limit of the
# answer, "It has at least 3 words in its name." is not
_COUNT_LEAD = "(with|contain|contains|write|use|using|in|be|is|of|to|it) "
_WHOLE_ANSWER = (
    "(your entire |your whole |the entire |the whole |your |the |)(answer|response|reply|it)"
)
_LIST_VERB = "(Give|List|Name|Suggest|Share|Provide|Offer|Write|Describe|Explain)( me|)"
_QUOTED_WORDS = "(the |)(keywords|keyword|words|word) {words}"

KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "max_words",
            _max_words,
            (
                "in under {below} words",
                "using fewer than {below} words",
                "in at most {n} words",
                "Keep your answer under {below} words.",
                "Use no more than {n} words.",
            ),
            understood=(
                f"{_COUNT_LEAD}(less|fewer) than {{below}} words",  # IFEval: "Answer with ..."
                f"{_COUNT_LEAD}(no|not) more than {{n}} words",
                f"{_COUNT_LEAD}at most {{n}} words",
                f"{_COUNT_LEAD}under {{below}} words",
                f"{_COUNT_LEAD}{{n}} words or (fewer|less)",
                f"{_COUNT_LEAD}(a maximum of|up to) {{n}} words",
                f"(Limit|Keep) {_WHOLE_ANSWER} to {{n}} words",
            ),
        ),
        Kind(
            "min_words",
            _min_words,
            (
                "in at least {n} words",
                "Write at least {n} words.",
                "Your answer must be at least {n} words long.",
                "Use no fewer than {n} words.",
            ),
            understood=(
                f"{_COUNT_LEAD}at least {{n}} words",  # IFEval: "Answer with at least 40 words."
                f"{_COUNT_LEAD}(no|not) (fewer|less) than {{n}} words",
                f"{_COUNT_LEAD}more than {{above}} words",
                f"{_COUNT_LEAD}{{n}} words or more",
                f"{_COUNT_LEAD}a minimum of {{n}} words",
            ),
        ),
        Kind(
            "sentences",
            _sentences,
            (
                "in exactly {count} sentences",
                "Reply with exactly {count} sentences.",
                "Your answer must contain exactly {count} sentences.",
            ),
            understood=(
                "in {count} (sentence|sentences)",
                "(Answer|Reply|Respond|Write|Use) (with |using |)(exactly |){count} "
                "(sentence|sentences)",
                f"{_ANSWER} (must|should) be (exactly |){{count}} (sentence|sentences)",
            ),
        ),
        Kind(
            "paragraphs",
            _paragraphs,
            (
                "in {count} paragraphs separated by a blank line",
                "Write exactly {count} paragraphs, separated by blank lines.",
                "Split your answer into {count} paragraphs with a blank line between them.",
            ),
            understood=(
                "in {count} (paragraph|paragraphs)",
                "(Write|Use) (exactly |){count} (paragraph|paragraphs)",
                f"(Split|Divide|Break) {_WHOLE_ANSWER} into {{count}} paragraphs",
            ),
        ),
        Kind(
            "bullets",
            _bullets,
            (
                "as a bulleted list of {count} items",
                "Format your answer as exactly {count} bullet points.",
                "Use a bulleted list with exactly {count} items.",
            ),
            understood=(
                # IFEval: "Your answer must contain exactly 3 bullet points."
                "(contain|in|as|with|using|into|use|write|give) (exactly |){count} "
                "(bullet points|bullets)",
                "a (bulleted|bullet) list (of|with) (exactly |){count} (items|points|entries)",
                f"{_LIST_VERB} {{count}}{{things}}(,|) (as|in) "
                "(a bulleted list|a bullet list|a bullet-point list|bullet points|bullets).",
            ),
        ),
        Kind(
            "numbered",
            _numbered,
            (
                "as a numbered list of {count} items",
                "Format your answer as a numbered list with exactly {count} items.",
                "Give exactly {count} numbered points.",
            ),
            understood=(
                "a numbered list (of|with) (exactly |){count} (items|points|entries|steps)",
                "(in|as|with|into|give) (exactly |){count} numbered (items|points|steps)",
                f"{_LIST_VERB} {{count}}{{things}}(,|) (as|in) a numbered list.",
            ),
        ),
        Kind(
            "lowercase",
            _lowercase,
            (
                ", all in lowercase",
                "Write your entire answer in lowercase letters.",
                "Use only lowercase letters, no capitals at all.",
                "Do not use any capital letters.",
            ),
            understood=(
                # IFEval: "... in all lowercase letters. No capital letters are allowed."
                "in (all |)(lowercase|lower case|lower-case)( letters|)( only|).",
                "No capital letters( are allowed| allowed| at all|).",
                "(Do not|Don't|Don’t) capitalize (anything|any letters|any words).",
            ),
        ),
        Kind(
            "uppercase",
            _uppercase,
            (
                ", all in capital letters",
                "Write your entire answer in capital letters.",
                "Use only uppercase letters.",
                "Answer in all caps.",
            ),
            understood=(
                # IFEval: "Your entire response should be in English, and in all capital letters."
                "in (all |)(capital letters|capitals|caps|uppercase letters|uppercase|upper case|"
                "upper-case|block capitals|block letters)( only|).",
            ),
        ),
        Kind(
            "no_commas",
            _no_commas,
            (
                "without using any commas",
                "Do not use any commas.",
                "Avoid commas entirely.",
                "Your answer must not contain a single comma.",
            ),
            understood=(
                # IFEval: "In your entire response, refrain from the use of any commas."
                "refrain from (the use of|using) (any |)commas.",
                "without (using |)(any |)commas.",
                "(Do not|Don't|Don’t|Never) use (any |)commas.",
                "(Use no|No) commas( at all|).",
                "Avoid (using |)commas.",
            ),
        ),
        Kind(
            "start_word",
            _start_word,
            (
                "Start your answer with the word {word}.",
                "The first word of your answer must be {word}.",
                "Begin your reply with the word {word}.",
            ),
            understood=(
                f"(Start|Begin|Open) {_WHOLE_ANSWER} with the word {{word}}.",
                "(Start|Begin) with the word {word}.",
                f"(your|the) {_ANSWER} (must|should) (start|begin) with the word {{word}}.",
                f"The first word of (your|the) {_ANSWER} (must|should) be {{word}}.",
            ),
        ),
        Kind(
            "end_word",
            _end_word,
            (
                "End your answer with the word {word}.",
                "The last word of your answer must be {word}.",
                "Finish your reply with the word {word}.",
            ),
            understood=(
                f"(End|Finish|Conclude) {_WHOLE_ANSWER} with the word {{word}}.",
                "(End|Finish) with the word {word}.",
                f"(your|the) {_ANSWER} (must|should) (end|finish) with the word {{word}}.",
                f"The last word of (your|the) {_ANSWER} (must|should) be {{word}}.",
                # IFEval's end phrase, where it is one word: "Finish your response with this
                # exact phrase 'peace'. No other words should follow this phrase."
                f"Finish (your|the) {_ANSWER} with (this|the) exact (phrase|word) {{word}}.",
            ),
        ),
        Kind(
            "keyword",
            _keyword,
            (
                "Mention the word {word} at least {times}.",
                "Use the word {word} at least {times}.",
                "Include the word {word} at least {times} in your answer.",
            ),
            understood=(
                # IFEval: "Include keywords ['river', 'sun'] in the response."
                f"(Use|Include|Mention) {_QUOTED_WORDS}.",
                f"(Use|Include|Mention) {_QUOTED_WORDS} in (your|the) {_ANSWER}.",
                f"(Be sure|Make sure|Remember) to (use|include|mention) {_QUOTED_WORDS}.",
                # IFEval: "In your response, the word river should appear at least 3 times."
                "the (word|keyword) {word} (should appear|must appear|appears) at least {times}",
            ),
            unstated_n=1,
        ),
        Kind(
            "forbidden_word",
            _forbidden_word,
            (
                "without using the word {word}",
                "Do not use the word {word}.",
                "Avoid the word {word} entirely.",
                "Never use the word {word} in your answer.",
            ),
            understood=(
                # IFEval: "Do not include keywords ['river', 'sun'] in the response."
                f"(Do not|Don't|Don’t|Never) (use|include|mention|say) {_QUOTED_WORDS}.",
                f"(Do not|Don't|Don’t|Never) (use|include|mention|say) {_QUOTED_WORDS} in "
                f"(your|the) {_ANSWER}.",
                f"Avoid (using |){_QUOTED_WORDS}.",
                "without (using |)the (word|words) {words}.",
                "the (word|words|keyword|keywords) {words} (must not|should not|may not) "
                "(appear|be used)",
            ),
        ),
        Kind(
            "quotes",
            _quotes,
            (
                "Wrap your entire answer in double quotation marks.",
                "Put your whole reply inside double quotes.",
                "Enclose your entire answer in double quotes.",
            ),
            understood=(
                # IFEval: "Wrap your entire response with double quotation marks."
                f"(Wrap|Enclose|Put|Place) {_WHOLE_ANSWER} (in|with|inside|within|between) "
                "double (quotation marks|quotes).",
            ),
        ),
        Kind(
            "title",
            _title,
            (
                "Give your answer a title in double angular brackets, such as <<my title>>.",
                "Include a title in double angle brackets, like <<title>>.",
                "Add a title inside double angular brackets, for example <<a good day>>.",
            ),
            understood=(
                # IFEval: "Your answer must contain a title, wrapped in double angular brackets,
                # such as <<poem of joy>>."
                "a title(,|) (wrapped in|in|inside|within|enclosed in) (double angular brackets|"
                "double angle brackets|<<double angular brackets>>|<<double angle brackets>>)",
            ),
        ),
        Kind(
            "postscript",
            _postscript,
            (
                "At the end of your answer, add a postscript starting with P.S.",
                "End with a postscript that begins with P.S.",
                "Add a P.S. at the end of your reply.",
            ),
            understood=(
                # IFEval: "At the end of your response, please explicitly add a postscript
                # starting with P.S." (not its "P.P.S", which the check does not read)
                "a postscript (starting|beginning|that starts|that begins) with P.S.",
                "(add|include|write|end with|finish with) a (P.S.|PS)",
            ),
        ),
    )
}
HELDOUT_KINDS = frozenset({"forbidden_word", "quotes", "title", "postscript"})
TRAINING_KINDS = tuple(name for name in KINDS if name not in HELDOUT_KINDS)

# --------------------------------------------------------------------------------- phrasings

_NUMBER_NAME = "|".join(NUMBER_NAMES)
_QUOTED = rf"[\"'‘“]({WORD.pattern})[\"'’”]"
_SLOTS = {
    "n": r"(?P<n>\d+)",
    "below": r"(?P<below>\d+)",
    "above": r"(?P<above>\d+)",
    "count": rf"(?P<count>{_NUMBER_NAME}|\d+|a\s+single)",
    "times": rf"(?P<times>once|twice|(?:{_NUMBER_NAME}|\d+)\s+times)",
    "word": rf"[\"'‘“]?(?P<word>{WORD.pattern})[\"'’”]?",  # IFEval leaves it unquoted
    "words": rf"(?P<words>\[?{_QUOTED}(?:(?:\s*,\s*|\s*,?\s+and\s+){_QUOTED})*\]?)",
    # a few words after a count, the first not "or", "to" or "and" ("two or three reasons")
    "things": r"(?P<things>[ \t]+(?!(?:or|to|and)\b)[^\W\d_]+(?:[ \t'’-]+[^\W\d_]+){0,7}?)",
}
_SLOT = re.compile(r"\{(\w+)\}")
_ALTERNATIVES = re.compile(r"\(([^()]*)\)")
_TIMES = {"once": 1, "twice": 2}
# where a judge-only sentence may start: a text's or line's start, after a sentence, a clause
# ("Describe a cat, and use the word 'fur'.") or a list marker, with "Please" before it
_SENTENCE_START = (
    r"(?:^|(?<=[.!?:;,(])|(?<=[.!?][\"'”’)])|(?<=\band)|(?<=\bthen))[ \t]*"
    r"(?:(?:[-*•]|\d+[.)])[ \t]+)?(?:please,?[ \t]+)?"
)
_CLAUSE_END = r"(?=[ \t]*(?:[.!,;:)]|$|(?:and|then)\b))"
# no phrasing ends inside a word or right before "each", "per" or "or": "under 10 words per
# sentence" and "in lowercase or in capitals" ask for something else
_FREE_END = r"(?![^\W_])(?![ \t]+(?:each|per|or)\b)"
_CLAUSE_BREAK = re.compile(r"[.!?;:,\n]|\b(?:and|but|then|or)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:no|not|never|without|avoid|refrain)\b|n['’]t\b", re.IGNORECASE)


def _number_name(n: int) -> str:
    return NUMBER_NAMES[n] if 0 <= n < len(NUMBER_NAMES) else str(n)


def phrase(phrasing: str, constraint: Constraint) -> str:
    """``phrasing`` with its slots filled from ``constraint``: the text a prompt states."""
    values = {"word": f"'{constraint.word}'"}
    n = constraint.n
    if n is not None:
        times = {v: k for k, v in _TIMES.items()}.get(n, f"{_number_name(n)} times")
        values |= {"n": str(n), "below": str(n + 1), "count": _number_name(n), "times": times}
    return phrasing.format(**values)


def _spaced(text: str) -> str:
    """Literal text as a regular expression that takes any run of whitespace for a space."""
    return r"\s+".join(re.escape(part) for part in text.split(" "))


def _literal(text: str) -> str:
    """Literal text as a regular expression (``_spaced``) that takes a group "(a|b)" for any
    one of its alternatives."""
    parts = _ALTERNATIVES.split(text)
    return "".join(
        f"(?:{'|'.join(map(_spaced, part.split('|')))})" if i % 2 else _spaced(part)
        for i, part in enumerate(parts)
    )


@functools.cache
def _pattern(phrasing: str, understood: bool = False) -> re.Pattern:
    """A phrasing as a regular expression: its words in order from a word's start, any letter
    case and spacing, its slots as named groups; without the final period, and without the
    leading comma of a fragment, so a prompt may punctuate it its own way. A judge-only
    sentence must start a sentence, and a judge-only phrasing with a final period must end a
    clause (module docstring)."""
    text = phrasing.lstrip(", ")
    parts = _SLOT.split(text.rstrip("."))
    regex = "".join(_SLOTS[part] if i % 2 else _literal(part) for i, part in enumerate(parts))
    start = _SENTENCE_START if understood and text.lstrip("(")[0].isupper() else ""
    end = _CLAUSE_END if understood and text.endswith(".") else ""
    flags = re.IGNORECASE | re.MULTILINE
    return re.compile(rf"{start}(?P<phrasing>(?<![^\W_]){regex}{end}{_FREE_END})", flags)


def _number(text: str) -> int:
    """ "3" or "three" -> 3; "once" or "a single" -> 1, "twice" -> 2, "three times" -> 3."""
    head = text.split()[0].lower()
    if head == "a":
        return 1
    if head in _TIMES:
        return _TIMES[head]
    return int(head) if head.isdigit() else NUMBER_NAMES.index(head)


def _constraints(kind: Kind, match: re.Match) -> list[Constraint]:
    """The constraints one matched phrasing states: one, or one per word of ``{words}``."""
    slots = {k: v for k, v in match.groupdict().items() if k in _SLOTS and v is not None}
    n = kind.unstated_n
    if "below" in slots:
        n = int(slots["below"]) - 1
    elif "above" in slots:
        n = int(slots["above"]) + 1
    elif slots.keys() & {"n", "count", "times"}:
        n = _number(slots.get("n") or slots.get("count") or slots["times"])
    if "words" in slots:
        quoted = re.findall(_QUOTED, slots["words"])
        return [Constraint(kind.name, n, words(w)[0]) for w in quoted]
    word = words(slots["word"])[0] if "word" in slots else None
    return [Constraint(kind.name, n, word)]


def _negated(prompt: str, start: int) -> bool:
    """Whether a negation comes before ``start`` in its clause: "Do not write in lowercase"
    asks for no lowercase, "no fewer than 50 words" for no limit of fewer than 50."""
    clause = _CLAUSE_BREAK.split(prompt[:start])[-1]
    return _NEGATION.search(clause) is not None


def parse_constraints(prompt: str) -> list[Constraint]:
    """The constraints ``prompt`` states anywhere in its text (a chat template's wrapper and
    all), in the order they appear; one stated twice counts once."""
    return list(_parse(prompt))


@functools.lru_cache(maxsize=4096)
def _parse(prompt: str) -> tuple[Constraint, ...]:
    """``parse_constraints``, cached: a group of samples shares its prompt. A match after a
    negation, or overlapping one that starts before it, does not count (module docstring)."""
    matches = sorted(
        (
            (match, kind)
            for kind in KINDS.values()
            for pattern in kind.patterns()
            for match in pattern.finditer(prompt)
        ),
        key=lambda pair: (pair[0].start("phrasing"), -pair[0].end()),
    )
    found: list[Constraint] = []
    end = 0
    for match, kind in matches:
        start = match.start("phrasing")
        if start >= end and not _negated(prompt, start):
            found += _constraints(kind, match)
            end = match.end()
    return tuple(dict.fromkeys(found))


# ------------------------------------------------------------------------------------ topics


@dataclass(frozen=True)
class Topic:
    """An everyday topic of the prompts: its name as a prompt writes it ("a rainy morning"),
    related words (space-separated) that an answer on the topic is likely to use, and whether
    it names a category whose members a task can ask for ("Name a few fruits.")."""

    name: str
    related: str
    category: bool = False

    def stems(self) -> frozenset[str]:
        """The stems of the topic's words: its name's content words and the related words."""
        named = [w for w in words(self.name) if w not in _NAME_FUNCTION_WORDS]
        return frozenset(map(stem, named + self.related.split()))


_NAME_FUNCTION_WORDS = frozenset(
    {"a", "an", "the", "of", "in", "on", "at", "to", "and", "for", "with"}
)
_SUFFIXES = ("ing", "ed", "es", "s")
_MIN_STEM = 3
_MIN_PREFIX = 4


def stem(word: str) -> str:
    """A crude stem for comparing topic words, the same for a word's common inflections:
    drop a possessive "'s", then "ing", "ed", "es" or "s" while 3 letters remain (never the
    "s" of "ss": "glass"), then a final "e" ("bike", "bikes", "biking" -> "bik")."""
    word = word.lower().removesuffix("'s")
    stripped = True
    while stripped:
        stripped = False
        for suffix in _SUFFIXES:
            keeps = len(word) - len(suffix) >= _MIN_STEM and not word.endswith("ss")
            if word.endswith(suffix) and keeps:
                word, stripped = word[: -len(suffix)], True
                break
    return word[:-1] if word.endswith("e") and len(word) > _MIN_STEM else word


TOPICS: tuple[Topic, ...] = (
    Topic("a rainy morning", "rain umbrella cloud grey gray wet drizzle puddle sky skies storm"),
    Topic("a library", "book books read reading shelf shelves quiet librarian borrow study page"),
    Topic("exercise", "workout run running walk gym health healthy fit fitness muscle heart body"),
    Topic("a river", "water flow stream bank fish current boat bridge valley swim"),
    Topic("a cat", "kitten pet purr fur paw whisker whiskers mouse meow claw tail"),
    Topic("a bicycle", "bike ride riding wheel pedal cycling helmet tire tyre chain road"),
    Topic("the ocean", "sea wave water beach salt tide fish whale shore deep blue"),
    Topic("a birthday party", "cake candle gift present balloon friend celebrate guest song"),
    Topic("cooking pasta", "cook boil water sauce salt noodle spaghetti pot kitchen cheese tomato"),
    Topic("a garden", "plant flower soil seed grow water vegetable leaf leaves tree green"),
    Topic("a train journey", "travel station ticket rail seat window passenger trip"),
    Topic("a cup of coffee", "mug caffeine bean drink morning milk hot brew cafe espresso"),
    Topic("a snowy day", "snow cold winter white snowman ice frost flake sled freeze"),
    Topic("a dog", "puppy pet bark walk tail fetch loyal leash paw"),
    Topic("a mountain hike", "hiking trail peak climb summit view boot path forest"),
    Topic("a school day", "school class teacher student lesson learn homework friend desk"),
    Topic("a picnic", "basket sandwich blanket park food grass lunch outdoor outside sun"),
    Topic("the moon", "night sky star light orbit lunar full crater space"),
    Topic("a thunderstorm", "thunder storm lightning rain cloud loud wind flash sky"),
    Topic("baking bread", "bake oven dough flour yeast loaf knead crust smell"),
    Topic("a city park", "tree bench grass path walk playground pond bird green"),
    Topic("a restful night", "sleep bed rest dream tired pillow sleepy morning quiet"),
    Topic("a farmers market", "farmer fruit vegetable fresh stall local buy produce honey"),
    Topic("a campfire", "fire camp flame wood smoke marshmallow warm night story spark"),
    Topic("learning to swim", "swimming water pool float lesson kick breath stroke"),
    Topic("a museum visit", "art painting history exhibit gallery statue ticket guide"),
    Topic("a sunny beach", "sun sand sea wave swim towel shell warm ocean"),
    Topic("a bakery", "bread cake pastry baker oven cookie croissant smell fresh"),
    Topic("a winter coat", "warm cold jacket wool button zip pocket snow wear"),
    Topic("a vegetable soup", "carrot onion potato bowl broth hot pot spoon"),
    Topic("a road trip", "car drive driving travel map highway journey stop"),
    Topic("a rainforest", "forest tree rain jungle animal green bird monkey plant wet"),
    Topic("a new job", "work office colleague boss task career first day learn team"),
    Topic("a houseplant", "plant pot leaf leaves water soil green sunlight grow window"),
    Topic("a lighthouse", "light sea ship coast tower beam night rock keeper"),
    Topic("a kitchen", "cook cooking stove oven table food fridge knife meal"),
    Topic("autumn leaves", "leaf fall tree red orange yellow wind season crunch"),
    Topic("a violin", "music string bow play instrument sound note song orchestra"),
    Topic("a football match", "soccer game team goal ball player score fan win"),
    Topic("a chess game", "board piece king queen move pawn player win strategy"),
    Topic("a sunrise", "sun morning dawn light sky orange early horizon day"),
    Topic("a bus ride", "seat stop driver passenger ticket city window route"),
    Topic("a hot summer day", "sun heat warm sweat ice shade beach cool"),
    Topic("a grocery list", "shop shopping milk bread egg store buy food"),
    Topic("a family dinner", "meal table food eat talk parent kid plate"),
    Topic("a walk in the woods", "wood forest tree path leaf leaves bird quiet trail"),
    Topic("a friendly neighbour", "neighbor friend house street help kind door wave"),
    Topic("a village festival", "music dance food crowd celebration parade lights"),
    Topic("a lost umbrella", "rain wet find forget search bus handle"),
    Topic("a quiet evening", "calm night relax read tea sunset peace rest"),
    Topic("a pair of shoes", "shoe foot feet walk lace boot comfortable size"),
    Topic("a fishing trip", "fish boat lake rod catch bait water river"),
    Topic("a wedding", "bride groom marry dress ring love ceremony guest dance cake"),
    Topic("a science class", "experiment lab teacher student learn test chemistry physics"),
    Topic("a hot air balloon", "sky fly float basket view wind high"),
    Topic("an old bridge", "river stone cross arch water road history"),
    Topic("a snowman", "snow winter carrot cold build hat scarf ball white"),
    Topic("a zoo", "animal lion elephant monkey giraffe cage visit keeper tiger"),
    Topic("a lemonade stand", "lemon sell sugar drink cup sweet summer kid"),
    Topic("a rooftop garden", "roof plant city flower view green grow"),
    Topic(
        "fruits",
        "apple banana orange cherry grape pear mango strawberry berry lemon peach plum kiwi melon",
        category=True,
    ),
    Topic(
        "vegetables",
        "carrot potato tomato onion broccoli pea bean lettuce spinach pepper cabbage corn",
        category=True,
    ),
    Topic(
        "birds",
        "robin sparrow eagle owl crow parrot pigeon penguin duck swan feather wing fly",
        category=True,
    ),
    Topic(
        "musical instruments",
        "music piano guitar violin drum flute trumpet cello harp saxophone play",
        category=True,
    ),
    Topic("board games", "chess checkers monopoly scrabble dice card play player", category=True),
    Topic(
        "flowers", "rose tulip daisy lily sunflower orchid violet petal bloom garden", category=True
    ),
    Topic(
        "sports",
        "football soccer tennis basketball swimming running golf hockey volleyball baseball "
        "rugby cricket team ball game",
        category=True,
    ),
    Topic(
        "breakfast foods",
        "egg toast bread cereal pancake bacon porridge oatmeal yogurt fruit juice coffee",
        category=True,
    ),
    Topic(
        "farm animals",
        "cow pig sheep horse chicken goat duck hen barn donkey turkey",
        category=True,
    ),
    Topic(
        "colours",
        "colour color red blue green yellow orange purple pink black white brown grey gray",
        category=True,
    ),
    Topic(
        "tools in a toolbox",
        "hammer screwdriver wrench saw drill nail screw pliers tape",
        category=True,
    ),
    Topic(
        "summer activities",
        "swim beach hike hiking camp camping picnic cycling sun holiday vacation",
        category=True,
    ),
)


@functools.cache
def _topic_pattern(name: str) -> re.Pattern:
    return re.compile(rf"(?<![^\W_]){_literal(name)}(?![^\W_])", re.IGNORECASE)


def topics_in(prompt: str) -> list[Topic]:
    """The topics of ``TOPICS`` whose name ``prompt`` contains as whole words, any case."""
    return [topic for topic in TOPICS if _topic_pattern(topic.name).search(prompt)]


# ------------------------------------------------------------------------ the guard and score


def _ngrams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def _echoes(prompt: str, tokens: list[str]) -> bool:
    """Whether ``ECHO_SHARE`` or more of the response's word trigrams are in the prompt."""
    trigrams = _ngrams(tokens, 3)
    in_prompt = set(_ngrams(words(prompt), 3))
    return bool(trigrams) and sum(t in in_prompt for t in trigrams) >= ECHO_SHARE * len(trigrams)


def _line_words(line: str) -> tuple[str, ...]:
    """A line's words after its list marker, if any: "2. Apples" and "- apples" are alike."""
    marker = _LIST_MARKER.match(line)
    return tuple(words(line[marker.end() :] if marker else line))


def _repetitive(response: str, tokens: list[str]) -> bool:
    """A line with words written twice, or under ``MIN_DISTINCT_2`` of bigrams distinct."""
    bigrams = _ngrams(tokens, 2)
    if len(tokens) >= 4 and len(set(bigrams)) < MIN_DISTINCT_2 * len(bigrams):
        return True
    lines = [line for line in map(_line_words, response.splitlines()) if line]
    return len(set(lines)) < len(lines)


def _off_topic(prompt: str, tokens: list[str]) -> bool:
    """Whether the prompt names topics of ``TOPICS`` and the response uses none of their words:
    no word whose stem is a topic's stem or starts with one of 4 letters or more (compounds
    such as "snowflakes" and "riverbank" are on the topic)."""
    topics = topics_in(prompt)
    if not topics:
        return False
    wanted = frozenset().union(*(topic.stems() for topic in topics))
    prefixes = tuple(w for w in wanted if len(w) >= _MIN_PREFIX)
    return not any(s in wanted or s.startswith(prefixes) for s in map(stem, tokens))


def _guard(prompt: str, constraints: Sequence[Constraint], response: str) -> str | None:
    """``guard_reason`` with the prompt's constraints parsed."""
    tokens = words(response)
    limits = [c.n for c in constraints if c.kind == "max_words"]
    if not tokens:
        return "empty"
    if len(tokens) < min([MIN_WORDS, *limits]):
        return "too short"
    if _echoes(prompt, tokens):
        return "echo"
    if _repetitive(response, tokens):
        return "repetition"
    if _off_topic(prompt, tokens):
        return "off-topic"
    return None


def guard_reason(prompt: str, response: str) -> str | None:
    """Why the guard gives ``response`` 0 ("empty", "too short", "echo", "repetition" or
    "off-topic", the first that applies; rules in the module docstring), or None if it passes."""
    return _guard(prompt, _parse(prompt), response)


_SHOWN_CHARS = 120  # of a prompt in an error message: its start and end, the middle elided


def _no_constraint(prompt: str) -> str:
    """Why the judge cannot take ``prompt``: it names the prompt and the kinds the judge knows."""
    half = _SHOWN_CHARS // 2
    shown = prompt if len(prompt) <= _SHOWN_CHARS else f"{prompt[:half]} ... {prompt[-half:]}"
    return (
        f"the prompt {shown!r} states no constraint the 'instructions' judge can check (the "
        f"kinds it knows: {', '.join(KINDS)}; their phrasings: rlhfkit.tasks.instructions.KINDS)"
    )


def _constraints_of(prompt: str) -> tuple[Constraint, ...]:
    """The prompt's constraints; a ValueError where it states none: this judge is for its
    task's prompts, and scoring any other prompt would be a silent mistake."""
    constraints = _parse(prompt)
    if not constraints:
        raise ValueError(_no_constraint(prompt))
    return constraints


def check_instructions_prompt(
    prompt: str | Sequence[Mapping[str, Any]], columns: Mapping[str, Any]
) -> str | None:
    """What the judge cannot take in a prompt record, for the data's load-time check
    (``tasks.PROMPT_CHECKS``): a prompt, as written (a string, or chat messages: the text of
    the user's), in which it finds no constraint. None where it finds one; the judge reads no
    column."""
    text = prompt_text(prompt)
    return None if _parse(text) else _no_constraint(text)


def instruction_score(prompt: str, response: str) -> float:
    """The gold score of ``response``: the share of the prompt's constraints it meets, in
    [0, 1], or 0 where the guard fails it. Raises ValueError for a prompt without one."""
    constraints = _constraints_of(prompt)
    if _guard(prompt, constraints, response) is not None:
        return 0.0
    return sum(c.met(response) for c in constraints) / len(constraints)


def constraint_results(prompt: str, response: str) -> dict[str, bool]:
    """Whether ``response`` meets each kind of constraint the prompt states (a kind stated
    twice is met if both are), the guard aside: the per-kind pass rates of a report. Empty
    for a prompt without a constraint."""
    results: dict[str, bool] = {}
    for constraint in _parse(prompt):
        results[constraint.kind] = results.get(constraint.kind, True) and constraint.met(response)
    return results


def passed_constraints(prompt: str, response: str) -> dict[str, bool]:
    """``constraint_results`` with the guard: every kind counts as missed by a response the
    guard gives 0, as the score does (an empty answer meets "no commas" only vacuously)."""
    results = constraint_results(prompt, response)
    if results and guard_reason(prompt, response) is not None:
        return dict.fromkeys(results, False)
    return results


def check_lengths(prompts: Sequence[str], responses: Sequence[str]) -> None:
    """A reward function's arguments pair up: one response per prompt."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")


_CASE_KINDS = frozenset({"lowercase", "uppercase"})
_LIST_KINDS = frozenset({"bullets", "numbered"})


def unasked_shapes(prompt: str, response: str) -> dict[str, bool]:
    """For each shape the prompt does not ask for, whether ``response`` takes it: "lowercase"
    and "uppercase", every letter in that case (the checks of those kinds); "list", two or
    more lines that are bullet or numbered items. A prompt that asks for a letter case has
    neither letter-case key, one that asks for bullets or a numbered list has no "list" key.
    Any prompt will do: one without constraints asks for no shape."""
    asked = {c.kind for c in _parse(prompt)}
    shapes: dict[str, bool] = {}
    if not asked & _CASE_KINDS:
        shapes["lowercase"] = _lowercase(Constraint("lowercase"), response)
        shapes["uppercase"] = _uppercase(Constraint("uppercase"), response)
    if not asked & _LIST_KINDS:
        shapes["list"] = _items(response, _LIST_MARKER) >= 2
    return shapes


def unasked_case_reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """-1 for each response written all in lowercase or all in capitals where its prompt asks
    for no letter case (``unasked_shapes``), else 0."""
    check_lengths(prompts, responses)
    unasked = (unasked_shapes(p, r) for p, r in zip(prompts, responses, strict=True))
    return [-1.0 if s.get("lowercase") or s.get("uppercase") else 0.0 for s in unasked]


def instructions_reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Reward function of the instructions task: ``instruction_score`` of each response."""
    check_lengths(prompts, responses)
    return [instruction_score(p, r) for p, r in zip(prompts, responses, strict=True)]
