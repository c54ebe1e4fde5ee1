"""Encoding: records -> token ids, truncation counted in a `TruncationReport`, never hidden.

Chat records keep their messages until tokenisation. With a tokenizer chat template the prompt
is `apply_chat_template(prompt, add_generation_prompt=True)` and the response is what the
template adds for the assistant's answer. Without one, roles are rendered plainly:
"User: hi\\nAssistant:" then " hello" + EOS. A plain-string prompt is one user message to a
tokenizer with a template (an instruct model answers it as it was trained to), unless
`chat_template=False` asks for the raw text; without a template it is the raw text.

Truncation (at tokenisation only; `pad` never cuts): when prompt + response exceeds
`max_length`, the prompt keeps its end (the text next to the response) and the response its
start, each getting at least half the budget when both are long, so neither becomes empty.
Comparisons may first cut the prompt and each response to lengths of their own
(`max_prompt_length`, `max_response_length`: DPO's, in TRL's order).
An example longer than the context the tokenizer declares (`model_max_length`) stops the
run with the length option to lower, before any step could index past the model's positions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfkit.data.records import (
    Comparison,
    DataError,
    Demonstration,
    Message,
    Prompt,
    PromptRecord,
    Ranking,
    Record,
)
from rlhfkit.data.sources import load_records
from rlhfkit.errors import UsageError

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label ignored by the loss (torch cross_entropy's default ignore_index)
UNSET_CONTEXT = 1_000_000  # transformers' model_max_length when a tokenizer declares none: 1e30


@dataclass
class TruncationReport:
    """What tokenisation cut, for the trainer to log. No record is ever dropped."""

    records: int = 0
    truncated_prompts: int = 0
    truncated_responses: int = 0
    tokens_removed: int = 0

    def count(self, before: int, after: int, *, prompt: bool) -> None:
        if after < before:
            self.truncated_prompts += prompt
            self.truncated_responses += not prompt
            self.tokens_removed += before - after

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return (
            f"{self.records} records: {self.truncated_prompts} prompts and "
            f"{self.truncated_responses} responses truncated, {self.tokens_removed} tokens removed"
        )


@dataclass(frozen=True)
class SFTExample:
    """`labels` equal `input_ids` on response tokens (EOS included) and -100 on the prompt;
    unshifted, as Hugging Face models expect (logits at t predict labels at t + 1)."""

    input_ids: list[int]
    labels: list[int]


@dataclass(frozen=True)
class PreferenceExample:
    """Prompt ids and K >= 2 response ids (each ending with EOS unless truncated): best first,
    or, with `pairs`, in any order, ordered only by those (better, worse) index pairs (one
    prompt's comparisons, `group_by_prompt`)."""

    prompt_ids: list[int]
    response_ids: list[list[int]]
    pairs: tuple[tuple[int, int], ...] | None = None

    def preferences(self) -> list[tuple[int, int]]:
        """(better, worse) indices into `response_ids`: `pairs`, or every i < j of a ranking."""
        if self.pairs is not None:
            return list(self.pairs)
        k = len(self.response_ids)
        return [(i, j) for i in range(k) for j in range(i + 1, k)]


def group_by_prompt(examples: Sequence[PreferenceExample]) -> list[PreferenceExample]:
    """One example per distinct prompt: each of its distinct responses once, and the (better,
    worse) pairs of all its comparisons and rankings, in order of first appearance.

    InstructGPT's batching of a prompt's K-choose-2 comparisons (Ouyang et al. 2022, sec.
    3.5): a reward model then scores each response once per step instead of once per pair it
    is in (with every pair of K responses, K - 1 times fewer rows), and a response gets one
    gradient step per epoch instead of one per pair. A pair given twice counts twice.
    """
    groups: dict[tuple[int, ...], tuple[list[int], dict[tuple[int, ...], int], list]] = {}
    for example in examples:
        prompt, places, pairs = groups.setdefault(
            tuple(example.prompt_ids), (example.prompt_ids, {}, [])
        )
        index = [places.setdefault(tuple(r), len(places)) for r in example.response_ids]
        pairs.extend((index[b], index[w]) for b, w in example.preferences())
    return [
        PreferenceExample(prompt, [list(r) for r in places], tuple(pairs))
        for prompt, places, pairs in groups.values()
    ]


def _check_length(name: str, value: int, minimum: int) -> None:
    if not (isinstance(value, int) and value >= minimum):
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}")


def _check_context(name: str, value: int, longest: int, tokenizer: Any) -> None:
    """Refuse examples longer than the context the tokenizer declares: the model has no
    positions for their last tokens."""
    context = getattr(tokenizer, "model_max_length", None)
    if isinstance(context, int) and context < UNSET_CONTEXT and longest > context:
        raise UsageError(
            f"{name} = {value} lets examples reach {longest} tokens, more than the model's "
            f"context of {context} (its tokenizer's model_max_length): the model has no "
            f"positions past it. Set {name} to at most {context}"
        )


def _eos_id(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token_id; responses must end with EOS")
    return tokenizer.eos_token_id


def _template(
    tokenizer: Any, messages: list[Message], prompt: bool, tools: list[dict] | None = None
) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=prompt
    )


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tool schemas (``apply_chat_template``'s
    ``tools``): its source reads them."""
    return "tools" in str(getattr(tokenizer, "chat_template", None) or "")


def _template_answer(tokenizer: Any, messages: list[Message], head: str, answer: str) -> str:
    full = _template(tokenizer, [*messages, {"role": "assistant", "content": answer}], False)
    if not full.startswith(head):
        raise ValueError("the chat template does not render the prompt as a prefix of the chat")
    return full[len(head) :]


def _render(
    prompt: Prompt,
    responses: list[str],
    tokenizer: Any,
    chat_template: bool,
    tools: list[dict] | None = None,
) -> tuple[str, bool, list[str]]:
    """Prompt text, whether the tokenizer adds its special tokens (BOS) to it, response texts;
    ``tools`` (JSON schemas) go to a template that takes them."""
    templated = bool(getattr(tokenizer, "chat_template", None))
    if isinstance(prompt, str):
        if not (chat_template and templated):
            return prompt, True, responses
        prompt = [{"role": "user", "content": prompt}]
    if not templated:
        lines = [_plain_line(m) for m in prompt]
        return "\n".join([*lines, "Assistant:"]), True, [" " + r for r in responses]
    head = _template(tokenizer, prompt, True, tools)  # the template writes its own BOS
    return head, False, [_template_answer(tokenizer, prompt, head, r) for r in responses]


def _plain_line(message: Message) -> str:
    return f"{message['role'].capitalize()}: {message['content']}"


_ANSWER_MARK = "rlhfkit-answer"  # stands for an answer while a template renders the next turn


def encode_turn(messages: list[Message], tokenizer: Any) -> list[int]:
    """The ids that follow the policy's EOS in an episode to add ``messages`` (the
    environment's turn: a tool's result, the other side's reply) and open the assistant's
    next turn, rendered as the conversation's prompt was: the template's text after an
    answer (less the EOS the policy wrote) and for the messages, read off a rendering with
    and without them; without a template, "\\nTool: ..." lines and "\\nAssistant:"."""
    if not getattr(tokenizer, "chat_template", None):
        text = "\n" + "\n".join([*map(_plain_line, messages), "Assistant:"])
    else:
        before = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _ANSWER_MARK}]
        head = _template(tokenizer, before, False)
        full = _template(tokenizer, [*before, *messages], True)
        if not full.startswith(head):
            raise ValueError(
                "the chat template does not render a conversation as a prefix of its continuation"
            )
        after_answer = head[head.rindex(_ANSWER_MARK) + len(_ANSWER_MARK) :]
        eos = tokenizer.eos_token or ""
        text = after_answer.removeprefix(eos) + full[len(head) :]
    return _token_ids(tokenizer, [text], False)[0]


def _token_ids(tokenizer: Any, texts: list[str], special: bool) -> list[list[int]]:
    return list(tokenizer(texts, add_special_tokens=special)["input_ids"]) if texts else []


def _encode_prompt_texts(tokenizer: Any, texts: list[tuple[str, bool]]) -> list[list[int]]:
    ids: list[list[int]] = [[] for _ in texts]
    for special in (True, False):  # one batched tokenizer call per flag
        picked = [i for i, (_, s) in enumerate(texts) if s == special]
        for i, seq in zip(
            picked, _token_ids(tokenizer, [texts[i][0] for i in picked], special), strict=True
        ):
            ids[i] = seq
    for (text, _), seq in zip(texts, ids, strict=True):
        if not seq:
            raise DataError(f"prompt {text[:40]!r} tokenises to no tokens")
    return ids


def _with_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id) + 1] if eos_id in ids else [*ids, eos_id]


def _encode(
    prompts: list[Prompt], responses: list[list[str]], tokenizer: Any, chat_template: bool
) -> list[tuple[list[int], list[list[int]]]]:
    """Token ids of each prompt and of its responses (each ending with EOS)."""
    eos_id = _eos_id(tokenizer)
    rendered = [
        _render(p, rs, tokenizer, chat_template) for p, rs in zip(prompts, responses, strict=True)
    ]
    prompt_ids = _encode_prompt_texts(tokenizer, [(text, special) for text, special, _ in rendered])
    flat = iter(_token_ids(tokenizer, [t for _, _, texts in rendered for t in texts], False))
    return [
        (p, [_with_eos(next(flat), eos_id) for _ in texts])
        for p, (_, _, texts) in zip(prompt_ids, rendered, strict=True)
    ]


def _truncate(
    prompt: list[int],
    responses: list[list[int]],
    max_length: int,
    report: TruncationReport,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
) -> tuple[list[int], list[list[int]]]:
    """Fit prompt + each response in `max_length`: the prompt keeps its end, responses their
    start; a long prompt keeps at least half the budget, so does a long response. The prompt
    is first cut to `max_prompt_length` tokens and each response to `max_response_length`
    (None: no such cut)."""
    prompt_limit = min(len(prompt), max_prompt_length or len(prompt))
    response_limit = max_response_length or max(map(len, responses))
    longest = min(max(map(len, responses)), response_limit)
    keep_prompt = min(prompt_limit, max(max_length - longest, max_length // 2))
    keep_response = min(max_length - keep_prompt, response_limit)  # >= 1: max_length >= 2
    report.records += 1
    report.count(len(prompt), keep_prompt, prompt=True)
    for r in responses:
        report.count(len(r), min(len(r), keep_response), prompt=False)
    return prompt[len(prompt) - keep_prompt :], [r[:keep_response] for r in responses]


def _log(name: str, report: TruncationReport) -> None:
    truncated = report.truncated_prompts or report.truncated_responses
    logger.log(logging.WARNING if truncated else logging.INFO, "%s: %s", name, report)


def encode_prompts(
    records: Sequence[Record],
    tokenizer: Any,
    max_prompt_length: int,
    keep: str = "end",
    *,
    chat_template: bool = True,
    tools: list[dict] | None = None,
) -> tuple[list[list[int]], TruncationReport]:
    """Prompt ids of each record, at most `max_prompt_length` of them.

    `keep="end"` cuts from the left, keeping the text next to the response (chat, questions);
    `keep="start"` keeps the opening of a text to be continued (TRL's IMDb sentiment task).
    `chat_template`: see the module docstring. `tools`: JSON schemas for a template that
    takes them (`template_takes_tools`).
    """
    _check_length("max_prompt_length", max_prompt_length, 1)
    if keep not in ("end", "start"):
        raise ValueError(f"keep={keep!r}: expected 'end' or 'start'")
    texts = [_render(r.prompt, [], tokenizer, chat_template, tools)[:2] for r in records]
    report, prompts = TruncationReport(records=len(records)), []
    for ids in _encode_prompt_texts(tokenizer, texts):
        report.count(len(ids), min(len(ids), max_prompt_length), prompt=True)
        prompts.append(ids[-max_prompt_length:] if keep == "end" else ids[:max_prompt_length])
    longest = max(map(len, prompts), default=0)
    _check_context("max_prompt_length", max_prompt_length, longest, tokenizer)
    _log("encode_prompts", report)
    return prompts, report


def encode_demonstrations(
    records: Sequence[Demonstration],
    tokenizer: Any,
    max_length: int,
    *,
    chat_template: bool = True,
) -> tuple[list[SFTExample], TruncationReport]:
    """SFT examples: prompt + response + EOS, loss only on the response (InstructGPT step 1)."""
    _check_length("max_length", max_length, 2)
    prompts, responses = [r.prompt for r in records], [[r.response] for r in records]
    encoded = _encode(prompts, responses, tokenizer, chat_template)
    report, examples = TruncationReport(), []
    for prompt, responses in encoded:
        prompt, (response,) = _truncate(prompt, responses, max_length, report)
        examples.append(SFTExample([*prompt, *response], [IGNORE_INDEX] * len(prompt) + response))
    longest = max((len(e.input_ids) for e in examples), default=0)
    _check_context("max_length", max_length, longest, tokenizer)
    _log("encode_demonstrations", report)
    return examples, report


def encode_comparisons(
    records: Sequence[Comparison | Ranking],
    tokenizer: Any,
    max_length: int,
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    chat_template: bool = True,
) -> tuple[list[PreferenceExample], TruncationReport]:
    """Prompt ids and best-first response ids per comparison or ranking (reward model, DPO);
    the prompt cut to its last `max_prompt_length` tokens and each response to its first
    `max_response_length` (None: no such cut), then prompt + response to `max_length`."""
    _check_length("max_length", max_length, 2)
    limits = {"max_prompt_length": max_prompt_length, "max_response_length": max_response_length}
    for name, limit in limits.items():
        if limit is not None:
            _check_length(name, limit, 1)
    prompts, responses = [r.prompt for r in records], [r.best_first for r in records]
    encoded = _encode(prompts, responses, tokenizer, chat_template)
    report = TruncationReport()
    examples = [
        PreferenceExample(*_truncate(p, rs, max_length, report, *limits.values()))
        for p, rs in encoded
    ]
    longest = max((len(e.prompt_ids) + len(r) for e in examples for r in e.response_ids), default=0)
    _check_context("max_length", max_length, longest, tokenizer)
    _log("encode_comparisons", report)
    return examples, report


def encode_pairs(
    prompts: Sequence[Prompt],
    responses: Sequence[str],
    tokenizer: Any,
    max_length: int,
    *,
    chat_template: bool = True,
) -> tuple[list[list[int]], TruncationReport]:
    """prompt + response + EOS ids of each pair, as `encode_comparisons` encodes a response
    (a reward model scoring texts from another tokenizer); truncated like it, not logged: the
    caller decides what a cut is worth saying."""
    _check_length("max_length", max_length, 2)
    encoded = _encode(list(prompts), [[r] for r in responses], tokenizer, chat_template)
    report, ids = TruncationReport(), []
    for prompt, response_ids in encoded:
        prompt, (response,) = _truncate(prompt, response_ids, max_length, report)
        ids.append([*prompt, *response])
    return ids, report


@dataclass(frozen=True)
class PromptExample:
    """A prompt's token ids and the record they were encoded from (the prompt as written and
    the row's other columns, for reward functions)."""

    ids: list[int]
    record: PromptRecord


def load_prompts(
    source: str,
    split: str,
    tokenizer: Any,
    max_prompt_length: int,
    limit: int | None,
    *,
    chat_template: bool = True,
    check: Callable[[Record], str | None] | None = None,
) -> list[PromptExample]:
    """The first ``limit`` records of ``source`` (all for None), each with its ids
    left-truncated to ``max_prompt_length`` (``encode_prompts``); ``check`` as in
    ``load_records``."""
    records = load_records(source, "prompts", split=split, limit=limit, check=check)
    prompts, _ = encode_prompts(records, tokenizer, max_prompt_length, chat_template=chat_template)
    return [PromptExample(ids, record) for ids, record in zip(prompts, records, strict=True)]
