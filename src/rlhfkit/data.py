"""Data: a file or dataset -> validated records -> token ids -> padded (B, T) batches.

::

    load_records(source, kind)      .jsonl | .json | .parquet | save_to_disk dir | dir of files
                                    | hub dataset name
      -> PromptRecord | Demonstration | Comparison | Ranking        (validated text)
    encode_prompts / encode_demonstrations / encode_comparisons(records, tokenizer, length)
      -> token id lists + a TruncationReport for the trainer to log
    PromptCollator | SFTCollator | PairCollator                     (DataLoader collate_fn)
      -> padded LongTensors; `pad` is the one place that pads

Record formats follow TRL's dataset conventions (prompt/response, prompt/chosen/rejected,
"messages" conversations, an implicit prompt shared by chosen and rejected as in
Anthropic/hh-rlhf) plus InstructGPT's K-way rankings (Ouyang et al. 2022, sec. 3.5).
Where this module departs from TRL:

- Every record is validated when loaded. A bad one raises `DataError` naming the file, the
  1-based line (JSONL) or 0-based row (as `dataset[i]` indexes it), the field and what was
  expected; nothing is dropped.
- Rankings stay rankings (not pre-expanded into pairs); `PairCollator` lays every batch out
  rank-major so the pairwise loss and the K-way ranking loss come from one forward pass.
- An implicit string prompt ends before the last whitespace of the shared prefix, so
  responses keep whole words (" I think", GPT-2 style) instead of splitting one.
- Prompt and response are tokenised separately and concatenated, as generation sees them.
  A response always ends with EOS: it is cut after its first EOS (a chat template may write
  an end-of-turn newline after it, which generation never produces) or one is appended.

Chat records keep their messages until tokenisation. With a tokenizer chat template the prompt
is `apply_chat_template(prompt, add_generation_prompt=True)` and the response is what the
template adds for the assistant's answer. Without one, roles are rendered plainly:
"User: hi\\nAssistant:" then " hello" + EOS.

Truncation (at tokenisation only; `pad` never cuts): when prompt + response exceeds
`max_length`, the prompt keeps its end (the text next to the response) and the response its
start, each getting at least half the budget when both are long, so neither becomes empty.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label ignored by the loss (torch cross_entropy's default ignore_index)
KINDS = ("prompts", "demonstrations", "comparisons")
FIELDS = ("prompt", "response", "chosen", "rejected", "responses", "ranking", "messages")
Message = dict[str, str]
Prompt = str | list[Message]


class DataError(ValueError):
    """A record that does not fit its kind; the message names file, line or row, and field."""


@dataclass(frozen=True)
class PromptRecord:
    """A prompt to generate from (PPO, GRPO, best-of-n): text or chat messages."""

    prompt: Prompt


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
class Ranking:
    """A prompt with K >= 2 responses; `ranking` lists response indices best first."""

    prompt: Prompt
    responses: list[str]
    ranking: list[int]

    @property
    def best_first(self) -> list[str]:
        return [self.responses[i] for i in self.ranking]


Record = PromptRecord | Demonstration | Comparison | Ranking


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
    return value


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


def _ranking(row: _Row) -> Ranking:
    prompt, responses = _prompt(row), row.get("responses")
    if not (isinstance(responses, list) and len(responses) >= 2):
        raise row.error("responses", f"must be a list of at least 2 strings, got {_got(responses)}")
    texts = [_text(row, "responses", r, item=f"item {i} ") for i, r in enumerate(responses)]
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
        return PromptRecord(_prompt(row))
    if row.has("messages"):
        messages = _messages(row, "messages", row.get("messages"))
        if messages[-1]["role"] == "assistant":  # a demonstration: the prompt precedes the answer
            messages = messages[:-1]
        if not messages:
            raise row.error("messages", "holds no prompt message before the assistant's answer")
        return PromptRecord(messages)
    if row.has("chosen"):
        return PromptRecord(_implicit_prompt(row)[0])
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
}


# ---------------------------------------------------------------------------- sources

_SUFFIXES = (".jsonl", ".json", ".parquet")
_SPLIT_FILE = re.compile(r"^(train|test|validation|valid|dev|eval)([-_.]|$)")
Rows = Iterator[tuple[str, Any]]  # (where, raw row)


def _jsonl_rows(path: Path) -> Rows:
    with path.open(encoding="utf-8-sig") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} line {number}: malformed JSON ({e.msg})") from None
            yield f"{path} line {number}", row


def _json_rows(path: Path) -> Rows:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON Lines in a .json file, as `Dataset.to_json` writes
            yield from _jsonl_rows(path)
            return
        raise DataError(f"{path} line {e.lineno}: malformed JSON ({e.msg})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]  # {"data": [...]}, read by `load_dataset("json", field="data")`
    if not isinstance(data, list):
        raise DataError(
            f"{path}: expected a list of records or {{'data': [...]}}, got {_got(data)}"
        )
    yield from ((f"{path} row {i}", row) for i, row in enumerate(data))


def _parquet_rows(path: Path) -> Rows:
    import pyarrow.parquet as pq

    index = 0
    for batch in pq.ParquetFile(path).iter_batches():
        for row in batch.to_pylist():
            yield f"{path} row {index}", row
            index += 1


_READERS: dict[str, Callable[[Path], Rows]] = {
    ".jsonl": _jsonl_rows,
    ".json": _json_rows,
    ".parquet": _parquet_rows,
}


def _file_rows(path: Path) -> Rows:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix not in _READERS:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}, expected {_SUFFIXES}")
    return _READERS[path.suffix](path)


def _split_files(folder: Path, split: str) -> list[Path]:
    """Data files in `folder`; where names carry splits (train-0001.parquet), only `split`'s."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.suffix in _SUFFIXES and not any(s.startswith(".") for s in p.relative_to(folder).parts)
    )
    if not files:
        raise DataError(f"{folder}: no {', '.join(_SUFFIXES)} files")
    splits = {p: m.group(1) for p in files if (m := _SPLIT_FILE.match(p.name))}
    if not splits:
        return files
    chosen = [p for p in files if splits.get(p) == split]
    if not chosen:
        raise DataError(
            f"{folder}: no files for split '{split}' (splits: {sorted(set(splits.values()))})"
        )
    return chosen


def _dataset_rows(dataset: Any, where: str) -> Rows:
    return ((f"{where} row {i}", row) for i, row in enumerate(dataset))


def _saved_rows(folder: Path, split: str) -> Rows:
    import datasets  # imported lazily: it takes about a second

    dataset = datasets.load_from_disk(str(folder))
    if not isinstance(dataset, datasets.DatasetDict):
        return _dataset_rows(dataset, str(folder))
    if split not in dataset:
        raise DataError(f"{folder}: no split '{split}' (splits: {sorted(dataset)})")
    return _dataset_rows(dataset[split], f"{folder} split '{split}'")


def _hub_rows(name: str, split: str) -> Rows:
    import datasets

    return _dataset_rows(
        datasets.load_dataset(name, split=split), f"dataset '{name}' split '{split}'"
    )


def _source_rows(source: str | os.PathLike, split: str) -> Rows:
    path = Path(source)
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            return _saved_rows(path, split)
        return (row for file in _split_files(path, split) for row in _file_rows(file))
    if path.suffix in _SUFFIXES or path.exists():
        return _file_rows(path)
    return _hub_rows(str(source), split)


def _check_columns(columns: Mapping[str, str] | None) -> dict[str, str]:
    columns = dict(columns or {})
    for ours, theirs in columns.items():
        if ours not in FIELDS or not isinstance(theirs, str):
            raise ValueError(f"columns={columns!r}: keys must be among {FIELDS}, values strings")
    return columns


def _as_row(where: str, data: Any, columns: Mapping[str, str]) -> _Row:
    if not isinstance(data, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {_got(data)}")
    return _Row(data, where, columns)


def load_records(
    source: str | os.PathLike,
    kind: str,
    *,
    split: str = "train",
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> list[Record]:
    """Load and validate every record of `source` as `kind` ("prompts", "demonstrations",
    "comparisons"; comparisons yield `Comparison` or `Ranking`).

    `source` is a .jsonl/.json/.parquet file, a `save_to_disk` folder, a folder of data
    files (only `split`'s where file names carry splits), or a hub dataset name. `columns`
    maps our field names to the source's, e.g. {"prompt": "text"}. `limit` keeps the first
    records. "prompts" also accepts demonstration and comparison data (their prompts).
    Raises `DataError` on the first bad record, or if there are none.
    """
    if kind not in _PARSERS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit!r}: expected None or an integer >= 1")
    columns = _check_columns(columns)
    rows = islice(_source_rows(source, split), limit)
    records = [_PARSERS[kind](_as_row(where, data, columns)) for where, data in rows]
    if not records:
        raise DataError(f"{source}: no records")
    same = sum(isinstance(r, Comparison) and r.chosen == r.rejected for r in records)
    if same:
        logger.warning("%s: %d comparisons have chosen == rejected (no signal)", source, same)
    logger.info("loaded %d %s from %s", len(records), kind, source)
    return records


# ---------------------------------------------------------------------------- tokenisation


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
    """Prompt ids and K >= 2 response ids (each ending with EOS unless truncated), best first."""

    prompt_ids: list[int]
    response_ids: list[list[int]]


def _check_length(name: str, value: int, minimum: int) -> None:
    if not (isinstance(value, int) and value >= minimum):
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}")


def _eos_id(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token_id; responses must end with EOS")
    return tokenizer.eos_token_id


def _template(tokenizer: Any, messages: list[Message], prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


def _template_answer(tokenizer: Any, messages: list[Message], head: str, answer: str) -> str:
    full = _template(tokenizer, [*messages, {"role": "assistant", "content": answer}], False)
    if not full.startswith(head):
        raise ValueError("the chat template does not render the prompt as a prefix of the chat")
    return full[len(head) :]


def _render(prompt: Prompt, responses: list[str], tokenizer: Any) -> tuple[str, bool, list[str]]:
    """Prompt text, whether the tokenizer adds its special tokens (BOS) to it, response texts."""
    if isinstance(prompt, str):
        return prompt, True, responses
    if not getattr(tokenizer, "chat_template", None):
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in prompt]
        return "\n".join([*lines, "Assistant:"]), True, [" " + r for r in responses]
    head = _template(tokenizer, prompt, True)  # the template writes its own BOS
    return head, False, [_template_answer(tokenizer, prompt, head, r) for r in responses]


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
    prompts: list[Prompt], responses: list[list[str]], tokenizer: Any
) -> list[tuple[list[int], list[list[int]]]]:
    """Token ids of each prompt and of its responses (each ending with EOS)."""
    eos_id = _eos_id(tokenizer)
    rendered = [_render(p, rs, tokenizer) for p, rs in zip(prompts, responses, strict=True)]
    prompt_ids = _encode_prompt_texts(tokenizer, [(text, special) for text, special, _ in rendered])
    flat = iter(_token_ids(tokenizer, [t for _, _, texts in rendered for t in texts], False))
    return [
        (p, [_with_eos(next(flat), eos_id) for _ in texts])
        for p, (_, _, texts) in zip(prompt_ids, rendered, strict=True)
    ]


def _truncate(
    prompt: list[int], responses: list[list[int]], max_length: int, report: TruncationReport
) -> tuple[list[int], list[list[int]]]:
    """Fit prompt + each response in `max_length`: the prompt keeps its end, responses their
    start; a long prompt keeps at least half the budget, so does a long response."""
    longest = max(map(len, responses))
    keep_prompt = min(len(prompt), max(max_length - longest, max_length // 2))
    keep_response = max_length - keep_prompt  # >= 1 since max_length >= 2
    report.records += 1
    report.count(len(prompt), keep_prompt, prompt=True)
    for r in responses:
        report.count(len(r), min(len(r), keep_response), prompt=False)
    return prompt[len(prompt) - keep_prompt :], [r[:keep_response] for r in responses]


def _log(name: str, report: TruncationReport) -> None:
    truncated = report.truncated_prompts or report.truncated_responses
    logger.log(logging.WARNING if truncated else logging.INFO, "%s: %s", name, report)


def encode_prompts(
    records: Sequence[Record], tokenizer: Any, max_prompt_length: int, keep: str = "end"
) -> tuple[list[list[int]], TruncationReport]:
    """Prompt ids of each record, at most `max_prompt_length` of them.

    `keep="end"` cuts from the left, keeping the text next to the response (chat, questions);
    `keep="start"` keeps the opening of a text to be continued (TRL's IMDb sentiment task).
    """
    _check_length("max_prompt_length", max_prompt_length, 1)
    if keep not in ("end", "start"):
        raise ValueError(f"keep={keep!r}: expected 'end' or 'start'")
    texts = [_render(r.prompt, [], tokenizer)[:2] for r in records]
    report, prompts = TruncationReport(records=len(records)), []
    for ids in _encode_prompt_texts(tokenizer, texts):
        report.count(len(ids), min(len(ids), max_prompt_length), prompt=True)
        prompts.append(ids[-max_prompt_length:] if keep == "end" else ids[:max_prompt_length])
    _log("encode_prompts", report)
    return prompts, report


def encode_demonstrations(
    records: Sequence[Demonstration], tokenizer: Any, max_length: int
) -> tuple[list[SFTExample], TruncationReport]:
    """SFT examples: prompt + response + EOS, loss only on the response (InstructGPT step 1)."""
    _check_length("max_length", max_length, 2)
    encoded = _encode([r.prompt for r in records], [[r.response] for r in records], tokenizer)
    report, examples = TruncationReport(), []
    for prompt, responses in encoded:
        prompt, (response,) = _truncate(prompt, responses, max_length, report)
        examples.append(SFTExample([*prompt, *response], [IGNORE_INDEX] * len(prompt) + response))
    _log("encode_demonstrations", report)
    return examples, report


def encode_comparisons(
    records: Sequence[Comparison | Ranking], tokenizer: Any, max_length: int
) -> tuple[list[PreferenceExample], TruncationReport]:
    """Prompt ids and best-first response ids per comparison or ranking (reward model, DPO)."""
    _check_length("max_length", max_length, 2)
    encoded = _encode([r.prompt for r in records], [r.best_first for r in records], tokenizer)
    report = TruncationReport()
    examples = [PreferenceExample(*_truncate(p, rs, max_length, report)) for p, rs in encoded]
    _log("encode_comparisons", report)
    return examples, report


# ---------------------------------------------------------------------------- batches


def pad(
    seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad integer sequences to (B, T) long ids and a (B, T) long mask (1 = real token).

    The one place that pads. It never truncates: that happens at tokenisation.
    """
    if side not in ("right", "left"):
        raise ValueError(f"side={side!r}: expected 'right' or 'left'")
    if not seqs:
        raise ValueError("pad needs at least one sequence")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros_like(ids)  # (B, T)
    for row, seq in enumerate(seqs):
        if len(seq) == 0:
            continue
        values = torch.as_tensor(seq)
        if values.dim() != 1 or values.is_floating_point() or values.dtype == torch.bool:
            raise ValueError(f"pad: sequence {row} must be 1-D integer ids, got {values.dtype}")
        cols = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[row, cols] = values
        mask[row, cols] = 1
    return ids, mask


@dataclass(frozen=True)
class PromptCollator:
    """Prompt id lists -> left-padded `query` (B, Tq) and `query_mask` (B, Tq)."""

    pad_id: int

    def __call__(self, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        query, query_mask = pad(prompts, self.pad_id, side="left")  # (B, Tq)
        return {"query": query, "query_mask": query_mask}


@dataclass(frozen=True)
class SFTCollator:
    """`SFTExample`s -> right-padded `input_ids`, `attention_mask`, `labels` (-100 on pad)."""

    pad_id: int

    def __call__(self, examples: Sequence[SFTExample]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad([e.input_ids for e in examples], self.pad_id)  # (B, T)
        labels, _ = pad([e.labels for e in examples], IGNORE_INDEX)  # (B, T)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@dataclass(frozen=True)
class PairCollator:
    """`PreferenceExample`s (N of them) -> one right-padded batch of R prompt+response rows.

    Rows are rank-major: the N best responses, then the N second-best, and so on (for pairs:
    rows [0, N) chosen, [N, 2N) rejected, R = 2N). `group` (R,) and `rank` (R,) say which
    example and place each row is; `ranked_scores` turns row scores into (N, K) for the
    K-way ranking loss. `labels` are -100 on prompt and padding (DPO's response log-probs).
    """

    pad_id: int

    def __call__(self, examples: Sequence[PreferenceExample]) -> dict[str, Any]:
        rows, group, rank = [], [], []
        for k in range(max(len(e.response_ids) for e in examples)):
            for g, e in enumerate(examples):
                if k < len(e.response_ids):
                    rows.append((e.prompt_ids, e.response_ids[k]))
                    group.append(g)
                    rank.append(k)
        input_ids, attention_mask = pad([[*p, *r] for p, r in rows], self.pad_id)  # (R, T)
        labels, _ = pad([[IGNORE_INDEX] * len(p) + r for p, r in rows], IGNORE_INDEX)  # (R, T)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "group": torch.tensor(group, dtype=torch.long),  # (R,)
            "rank": torch.tensor(rank, dtype=torch.long),  # (R,)
            "pair_count": len(examples),
        }


def ranked_scores(
    scores: torch.Tensor, group: torch.Tensor, rank: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row scores (R,) of a `PairCollator` batch -> best-first (N, K) scores and valid mask."""
    shape = (int(group.max()) + 1, int(rank.max()) + 1)
    table = scores.new_zeros(shape)  # (N, K)
    valid = torch.zeros(shape, dtype=torch.bool, device=scores.device)  # (N, K)
    table[group, rank] = scores
    valid[group, rank] = True
    return table, valid
