"""The math task: arithmetic word problems with a checked answer, and their rewards.

Follows the accuracy reward of TRL (``trl.rewards.accuracy_reward``) and open-r1
(``open_r1.rewards.accuracy_reward``): the gold answer and the response are both parsed with
Hugging Face's Math-Verify (``math_verify.parse``) and compared with ``math_verify.verify``, so
"42", "42.0", "$42$", "1,234" and "\\boxed{42}" all read as the numbers they are. How the final
answer is found follows the GSM8K and DeepSeekMath habit of reading what the response states
last: the prompts (``assets/data/math``, made by ``scripts/make_math_problems.py``) ask for the
final answer as a number on the last line after "Answer:", so

- where the response has "Answer:" (any letter case, markdown ``**`` allowed), its final answer
  is what follows the last "Answer:" on that line (on the next non-empty line where that line
  holds nothing more), read by Math-Verify: the rightmost number or expression there, so
  "Answer: 12 + 7 = 19" reads 19 and "Answer: 42 apples." reads 42;
- otherwise Math-Verify's own extraction over the whole response decides, in its order: a
  ``\\boxed{}`` answer, "final answer is ...", "answer ...", then the last number or
  expression in the text.

``math_format_reward`` is the optional format reward (as open-r1's ``format_reward`` beside its
accuracy reward): 1.0 where the response's last non-empty line is "Answer: <number>", else 0.

Departures:

- TRL and open-r1 read only LaTeX (``try_extract_without_anchor=False``, boxed first): a model
  trained to write ``\\boxed{}``. A 135M model asked in plain words answers in plain words,
  so we read plain numbers too (``ExprExtractionConfig``), with the asked "Answer:" line first.
- An answer in words ("Answer: nineteen") reads as nothing and scores 0: the prompt asks for
  a number.
- TRL returns ``None`` (no reward) where the gold answer does not parse; here that is a
  ``ValueError`` naming the answer: the gold answers are ours, and one that does not parse is
  bad data (``check_math_prompt`` finds it when the data loads).
- No timeout. Math-Verify's timeouts use ``signal.alarm``, which only works in the main thread:
  a reward computed in a worker thread raises. So parsing and comparing run with the timeout
  off, the same in any thread, and what the timeout was for, stopping a comparison that would
  run for ever ("Answer: 9^9^9^9" makes ``verify`` compute a power tower), is done by checking
  a candidate answer before ``verify`` sees it: only numbers, symbols, sums, products and
  integer powers up to the 1000th (``_harmless``); anything else (a power tower, a factorial,
  a function) scores 0. Math-Verify's warning that the timeout is off is filtered from its
  loggers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlhfkit.tasks.completions import completion_text

ANSWER_LABEL = re.compile(r"(?:\*\*)?\banswer\b(?:\*\*)?\s*:(?:\*\*)?", re.IGNORECASE)
"""The asked label of a final answer: "Answer:", "answer :", "**Answer:**", "**Answer**:"."""
NUMBER = r"[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
FORMAT_LINE = re.compile(
    rf"^\s*(?:\*\*)?answer(?:\*\*)?\s*:(?:\*\*)?\s*(?:\*\*)?{NUMBER}(?:\*\*)?\s*[.!]?\s*$",
    re.IGNORECASE,
)
"""The last line of a response in the asked form: "Answer: 42", "Answer: 1,234.", "**Answer:** 42"."""
EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
"""What Math-Verify reads a response's final answer as: LaTeX (a boxed answer first) or a plain
number or expression."""
MAX_POWER = 1000
"""The largest exponent a candidate answer may hold, nested exponents multiplied
(``_harmless``): 123456**1000 is quick to compare, 9**9**9 is not."""


class _TimeoutOffWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimeoutOffWarning())


def _parse(text: str) -> list:
    # no timeout (module docstring); only parsed values, no string fallback
    return parse(
        text,
        extraction_config=list(EXTRACTION),
        fallback_mode="no_fallback",
        parsing_timeout=None,
    )


def parse_gold(answer: Any) -> list:
    """Math-Verify's reading of a gold answer ("42"); a ValueError where it is no number."""
    if isinstance(answer, bool) or not isinstance(answer, (str, int)):
        raise ValueError(f"math answer {answer!r}: not a string of a number")
    parsed = _parse(str(answer))
    if not parsed or not isinstance(parsed[0], sympy.Basic) or not parsed[0].is_number:
        raise ValueError(f"math answer {answer!r}: Math-Verify reads no number in it")
    return parsed


def final_answer_text(response: str) -> str:
    """The part of ``response`` that states its final answer: what follows the last "Answer:"
    on its line (or the next non-empty line, where that line holds nothing more), or the whole
    response where it has no "Answer:"."""
    labels = list(ANSWER_LABEL.finditer(response))
    if not labels:
        return response
    rest = response[labels[-1].end() :]
    lines = [line for line in rest.split("\n") if line.strip()]
    first = rest.split("\n", 1)[0]
    if first.strip():
        return first
    return lines[0] if lines else ""


def _harmless(value: Any, budget: int = MAX_POWER) -> bool:
    """Whether ``verify`` can compare ``value`` quickly: a string, or a sympy value built of
    numbers, symbols, sums, products, relations and sets, with integer powers whose exponents,
    multiplied along any nesting, stay within ``budget`` (a division is a power of -1)."""
    if isinstance(value, str):
        return True
    if not isinstance(value, sympy.Basic):
        return False
    if isinstance(value, (sympy.Function, sympy.core.function.Application)):
        return False
    if isinstance(value, sympy.Pow):
        exponent = value.exp
        if not exponent.is_Integer or abs(int(exponent)) > budget:
            return False
        return _harmless(value.base, budget // max(1, abs(int(exponent))))
    return all(_harmless(arg, budget) for arg in value.args)


def answer_matches(response: str, gold: list) -> bool:
    """Whether the final answer of ``response`` (``final_answer_text``) equals the parsed gold
    answer, by Math-Verify."""
    parsed = _parse(final_answer_text(response))
    if not parsed or not all(_harmless(value) for value in parsed):
        return False
    return bool(verify(gold, parsed, timeout_seconds=None))


def _check_lengths(completions: Sequence, column: Sequence, name: str) -> None:
    if len(completions) != len(column):
        raise ValueError(
            f"math reward: {len(completions)} completions but {len(column)} {name} values"
        )


def math_reward(
    completions: Sequence[str | Sequence[Mapping[str, Any]]], answer: Sequence[Any], **kwargs
) -> list[float]:
    """The math task's accuracy reward, TRL's way (``answer`` is the data's column): 1.0 where
    a completion's final answer equals its ``answer``, else 0.0 (module docstring). A gold
    answer that Math-Verify reads no number in is a ValueError."""
    _check_lengths(completions, answer, "answer")
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        gold_parsed = parse_gold(gold)
        rewards.append(1.0 if answer_matches(completion_text(completion), gold_parsed) else 0.0)
    return rewards


def has_answer_line(response: str) -> bool:
    """Whether the last non-empty line of ``response`` is "Answer: <number>" (``FORMAT_LINE``)."""
    lines = [line for line in response.split("\n") if line.strip()]
    return bool(lines) and FORMAT_LINE.match(lines[-1]) is not None


def math_format_reward(
    completions: Sequence[str | Sequence[Mapping[str, Any]]], **kwargs
) -> list[float]:
    """The math task's format reward, TRL's way: 1.0 where a completion ends with the asked
    line "Answer: <number>", else 0.0; right or wrong, the answer is not checked."""
    return [1.0 if has_answer_line(completion_text(c)) else 0.0 for c in completions]


def check_math_prompt(prompt: Any, columns: Mapping[str, Any]) -> str | None:
    """What is wrong with a record of the math task, for the data's load-time check: its
    ``answer`` column is missing or Math-Verify reads no number in it; None where it is fine."""
    if "answer" not in columns or columns["answer"] is None:
        return "the math task needs an 'answer' column (the final answer as a number)"
    try:
        parse_gold(columns["answer"])
    except ValueError as e:
        return str(e)
    return None
