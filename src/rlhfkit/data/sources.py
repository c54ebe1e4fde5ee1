"""Sources: .jsonl / .json / .parquet files, folders of them, `save_to_disk` folders and hub
datasets -> raw rows -> validated records (`load_records`).

Each raw row travels with where it came from (file and 1-based line, or 0-based row as
`dataset[i]` indexes it) so that a `DataError` can name it. Files are read as UTF-8; a byte
that is not names its line. A path that does not exist is taken for a hub dataset only if it
has the form of one (`name` or `owner/name`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from huggingface_hub.utils import HFValidationError, validate_repo_id

from rlhfkit.data.records import (
    _PARSERS,
    FIELDS,
    KINDS,
    DataError,
    Record,
    _got,
    _Row,
    identical_responses,
)

logger = logging.getLogger(__name__)

_SUFFIXES = (".jsonl", ".json", ".parquet")
_SPLIT_FILE = re.compile(r"^(train|test|validation|valid|dev|eval)([-_.]|$)")
Rows = Iterator[tuple[str, Any]]  # (where, raw row)
DEGENERATE = ("drop", "error")


def _decode(path: Path, data: bytes, line: int = 1) -> str:
    """`data` (from `line` of `path` on) as UTF-8 text, a byte order mark dropped."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line += before.count(b"\n")
        column = e.start - before.rfind(b"\n")  # 1-based
        raise DataError(
            f"{path} line {line}: byte {column} (0x{data[e.start]:02x}) is not UTF-8 text; "
            "save the file as UTF-8"
        ) from None


def _jsonl_rows(path: Path) -> Rows:
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = _decode(path, raw, number)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} line {number}: malformed JSON ({e.msg})") from None
            yield f"{path} line {number}", row


def _json_rows(path: Path) -> Rows:
    try:
        data = json.loads(_decode(path, path.read_bytes()))
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

    try:
        dataset = datasets.load_dataset(name, split=split)
    except (OSError, ValueError) as error:  # not on the hub, offline, no such split
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise DataError(
            f"{name}: no such file or directory, and as a hub dataset it does not load "
            f"({type(error).__name__}: {first_line}); give a .jsonl/.json/.parquet file, a "
            "folder of them, a `save_to_disk` folder, or a hub dataset name on a machine online"
        ) from error
    return _dataset_rows(dataset, f"dataset '{name}' split '{split}'")


def is_hub_name(name: str) -> bool:
    """Whether `name` has the form of a hub repository id ('name' or 'owner/name'), which a
    path such as 'runs/sft/final' has not."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _source_rows(source: str | os.PathLike, split: str) -> Rows:
    path = Path(source)
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            return _saved_rows(path, split)
        return (row for file in _split_files(path, split) for row in _file_rows(file))
    if path.suffix in _SUFFIXES or path.exists():
        return _file_rows(path)
    if not is_hub_name(str(source)):
        raise DataError(f"{source}: no such file or directory (nor a hub dataset name)")
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
    degenerate_comparisons: str = "drop",
    check: Callable[[Record], str | None] | None = None,
) -> list[Record]:
    """Load and validate every record of `source` as `kind` ("prompts", "demonstrations",
    "comparisons"; comparisons yield `Comparison` or `Ranking`).

    `source` is a .jsonl/.json/.parquet file, a `save_to_disk` folder, a folder of data
    files (only `split`'s where file names carry splits), or a hub dataset name. `columns`
    maps our field names to the source's, e.g. {"prompt": "text"}. `limit` keeps the first
    records. "prompts" also accepts demonstration and comparison data (their prompts).
    A comparison whose responses are identical (`identical_responses`) is dropped and counted
    in the log, or with `degenerate_comparisons="error"` raises `DataError`. `check` says what
    is wrong with a valid record that its user cannot take (a reward function's column it
    lacks), None where nothing is.
    Raises `DataError` on the first bad record, or if there are none.
    """
    if kind not in _PARSERS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit!r}: expected None or an integer >= 1")
    if degenerate_comparisons not in DEGENERATE:
        raise ValueError(
            f"degenerate_comparisons={degenerate_comparisons!r}: expected {DEGENERATE}"
        )
    columns = _check_columns(columns)
    rows = islice(_source_rows(source, split), limit)
    records = [(where, _PARSERS[kind](_as_row(where, data, columns))) for where, data in rows]
    for where, record in records if check is not None else ():
        problem = check(record)
        if problem:
            raise DataError(f"{where}: {problem}")
    if not records:
        raise DataError(f"{source}: no records")
    kept = _drop_degenerate(source, records, degenerate_comparisons == "error")
    logger.info("loaded %d %s from %s", len(kept), kind, source)
    return kept


def _drop_degenerate(
    source: str | os.PathLike, records: list[tuple[str, Record]], strict: bool
) -> list[Record]:
    """The records but the comparisons whose responses are identical: a pair of the same text
    carries no preference, its loss no gradient, and it counts against accuracy."""
    same = [where for where, record in records if identical_responses(record)]
    if same and strict:
        raise DataError(
            f"{same[0]}: the responses compared are identical, so the record says nothing "
            f"about which is better ({len(same)} such records in {source}); remove them, or "
            "set degenerate_comparisons='drop' to skip them"
        )
    if same:
        logger.warning(
            "%s: dropped %d of %d comparisons whose responses are identical (no preference), "
            "the first at %s",
            source,
            len(same),
            len(records),
            same[0],
        )
    kept = [record for _, record in records if not identical_responses(record)]
    if not kept:
        raise DataError(f"{source}: every comparison compares identical responses")
    return kept
