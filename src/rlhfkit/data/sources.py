"""Sources: .jsonl / .json / .parquet files, folders of them, `save_to_disk` folders and hub
datasets -> raw rows -> validated records (`load_records`).

Each raw row travels with where it came from (file and 1-based line, or 0-based row as
`dataset[i]` indexes it) so that a `DataError` can name it.
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

from rlhfkit.data.records import (
    _PARSERS,
    FIELDS,
    KINDS,
    Comparison,
    DataError,
    Record,
    _got,
    _Row,
)

logger = logging.getLogger(__name__)

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
