"""Records: the dataclasses each kind of data becomes, and the validation of raw rows.

A raw row (a mapping from any source, see `sources`) is parsed by kind ("prompts",
"demonstrations", "comparisons", "candidates") into one record. A bad row raises `DataError` naming where
it came from (file and 1-based line, or 0-based row), the field and what was expected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlhfkit.errors import UsageError

KINDS = ("prompts", "demonstrations", "comparisons", "candidates")
FIELDS = ("prompt", "response", "chosen", "rejected", "responses", "ranking", "messages")
Message = dict[str, str]
Prompt = str | list[Message]


class DataError(UsageError):
    """A record that does not fit its kind; the message names file, line or row, and field."""


@dataclass(frozen=True)
class PromptRecord:
    """A prompt to generate from (PPO, GRPO, best-of-n): text or chat messages, and every other
    column of its row (a math problem's ``answer``, IFEval's ``instruction_id_list``), which
    reward functions receive by name."""

    prompt: Prompt
    columns: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Demonstration:
    """A prompt and the response to imitate (SFT)."""

    prompt: Prompt
    response: str


@dataclass(frozen=True)
class Comparison:
    """A prompt with a preferred and a dispreferred response (reward model, DPO)."""

    prompt: Prompt
    chosen: str
    rejected: str

    @property
    def best_first(self) -> list[str]:
        return [self.chosen, self.rejected]


@dataclass(frozen=True)
class Candidates:
    """A prompt with K >= 2 responses not yet compared (what people label, `rlhfkit label`)."""

    prompt: Prompt
    responses: list[str]


@dataclass(frozen=True)
class Ranking:
    """A prompt with K >= 2 responses; `ranking` lists response indices best first."""

    prompt: Prompt
    responses: list[str]
    ranking: list[int]

    @property
    def best_first(self) -> list[str]:
        return [self.responses[i] for i in self.ranking]


Record = PromptRecord | Demonstration | Comparison | Ranking | Candidates


def identical_responses(record: Record) -> bool:
    """Whether a comparison's chosen equals its rejected, or two of a ranking's responses are
    the same text: such a pair says nothing about which response is better."""
    if isinstance(record, Comparison):
        return record.chosen == record.rejected
    return isinstance(record, Ranking) and len(set(record.responses)) < len(record.responses)


# ---------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class _Row:
    """One raw row with where it came from and the column mapping, for error messages."""

    data: Mapping[str, Any]
    where: str
    columns: Mapping[str, str]

    def has(self, name: str) -> bool:
        # Tables give absent fields as null; treat both the same.
        return self.data.get(self.columns.get(name, name)) is not None

    def get(self, name: str) -> Any:
        if not self.has(name):
            raise self.error(name, f"is missing (the record has {self.fields()})")
        return self.data[self.columns.get(name, name)]

    def fields(self) -> list[str]:
        return sorted(k for k, v in self.data.items() if v is not None)

    def other_columns(self, *used: str) -> dict[str, Any]:
        """Every column of the row but those the record's ``used`` fields were read from."""
        taken = {self.columns.get(name, name) for name in used}
        return {key: value for key, value in self.data.items() if key not in taken}

    def error(self, name: str, problem: str) -> DataError:
        column = self.columns.get(name, name)
        label = f"'{name}'" if column == name else f"'{name}' (column '{column}')"
        return DataError(f"{self.where}: field {label} {problem}")


def _got(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str | Mapping):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return type(value).__name__


def _text(
    row: _Row, name: str, value: Any, item: str = "", what: str = "a non-empty string"
) -> str:
    if not (isinstance(value, str) and value.strip()):
        raise row.error(name, f"{item}must be {what}, got {_got(value)}")
    _check_utf8(row, name, value, item)
    return value


def _check_utf8(row: _Row, name: str, value: str, item: str = "") -> None:
    """A lone surrogate (legal in a JSON escape) is no character: no UTF-8 file, tokenizer or
    database can hold it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise row.error(name, f"{item}holds a lone surrogate, got {_got(value)}") from None


def _messages(row: _Row, name: str, value: Any) -> list[Message]:
    if not (isinstance(value, list) and value):
        raise row.error(name, f"must be a non-empty list of messages, got {_got(value)}")
    for i, m in enumerate(value):
        if not (
            isinstance(m, Mapping)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
        ):
            raise row.error(
                name, f"item {i} must be {{'role': str, 'content': str}}, got {_got(m)}"
            )
        _check_utf8(row, name, m["content"], f"item {i} ")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _prompt(row: _Row) -> Prompt:
    value = row.get("prompt")
    if isinstance(value, list):
        return _messages(row, "prompt", value)
    return _text(row, "prompt", value, what="a non-empty string or a list of messages")


def _answer(row: _Row, name: str, messages: list[Message]) -> str:
    """The content of a single assistant message (TRL's conversational response)."""
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        raise row.error(name, "as a message list must hold exactly one 'assistant' message")
    return _text(row, name, messages[0]["content"], item="'content' ")


def _response(row: _Row, name: str) -> str:
    value = row.get(name)
    if isinstance(value, list):
        return _answer(row, name, _messages(row, name, value))
    return _text(row, name, value)


def _conversation(row: _Row) -> tuple[list[Message], str]:
    """Split `messages` into the prompt messages and the final assistant answer."""
    messages = _messages(row, "messages", row.get("messages"))
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        raise row.error("messages", "must end with an 'assistant' message after the prompt")
    return messages[:-1], _answer(row, "messages", messages[-1:])


def _implicit_prompt(row: _Row) -> tuple[Prompt, str, str]:
    """Prompt shared by `chosen` and `rejected` when the record has no `prompt` field."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if isinstance(chosen, list) and isinstance(rejected, list):
        chosen, rejected = _messages(row, "chosen", chosen), _messages(row, "rejected", rejected)
        shared = 0
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        if shared == 0:
            raise row.error("prompt", "is missing and 'chosen'/'rejected' share no messages")
        return (
            chosen[:shared],
            _answer(row, "chosen", chosen[shared:]),
            _answer(row, "rejected", rejected[shared:]),
        )
    chosen, rejected = _text(row, "chosen", chosen), _text(row, "rejected", rejected)
    shared = os.path.commonprefix([chosen, rejected])
    space = re.search(r"\s+\S*$", shared)  # responses start at the last whitespace
    cut = space.start() if space else len(shared)
    if not shared[:cut].strip():
        raise row.error("prompt", "is missing and 'chosen'/'rejected' share no prefix")
    return chosen[:cut], _text(row, "chosen", chosen[cut:]), _text(row, "rejected", rejected[cut:])


def _responses(row: _Row) -> list[str]:
    responses = row.get("responses")
    if not isinstance(responses, list):
        raise row.error("responses", f"must be a list of at least 2 strings, got {_got(responses)}")
    if len(responses) < 2:
        raise row.error("responses", f"must hold at least 2 responses, got {len(responses)}")
    return [_text(row, "responses", r, item=f"item {i} ") for i, r in enumerate(responses)]


def _parse_candidates(row: _Row) -> Candidates:
    return Candidates(_prompt(row), _responses(row))


def _ranking(row: _Row) -> Ranking:
    prompt, texts = _prompt(row), _responses(row)
    order = row.get("ranking")
    if not (
        isinstance(order, list)
        and all(type(i) is int for i in order)
        and sorted(order) == list(range(len(texts)))
    ):
        raise row.error(
            "ranking",
            f"must be a permutation of 0..{len(texts) - 1} (response indices, best first), "
            f"got {order!r}",
        )
    return Ranking(prompt, texts, list(order))


def _parse_prompt(row: _Row) -> PromptRecord:
    if row.has("prompt"):
        return PromptRecord(_prompt(row), row.other_columns("prompt"))
    if row.has("messages"):
        messages = _messages(row, "messages", row.get("messages"))
        if messages[-1]["role"] == "assistant":  # a demonstration: the prompt precedes the answer
            messages = messages[:-1]
        if not messages:
            raise row.error("messages", "holds no prompt message before the assistant's answer")
        return PromptRecord(messages, row.other_columns("messages"))
    if row.has("chosen"):
        return PromptRecord(_implicit_prompt(row)[0], row.other_columns())
    raise row.error("prompt", f"is missing (the record has {row.fields()})")


def _parse_demonstration(row: _Row) -> Demonstration:
    if row.has("messages") and not row.has("prompt"):
        return Demonstration(*_conversation(row))
    return Demonstration(_prompt(row), _response(row, "response"))


def _parse_comparison(row: _Row) -> Comparison | Ranking:
    if row.has("responses") or row.has("ranking"):
        return _ranking(row)
    if not row.has("prompt") and row.has("chosen") and row.has("rejected"):
        return Comparison(*_implicit_prompt(row))
    return Comparison(_prompt(row), _response(row, "chosen"), _response(row, "rejected"))


_PARSERS: dict[str, Callable[[_Row], Record]] = {
    "prompts": _parse_prompt,
    "demonstrations": _parse_demonstration,
    "comparisons": _parse_comparison,
    "candidates": _parse_candidates,
}
