"""`rlhfkit label export`: the votes of a labelling database as training data.

A vote on a K = 2 task becomes a comparison (`prompt`, `chosen`, `rejected`), a vote on a
K > 2 task a ranking (`prompt`, `responses`, `ranking` = response indices best first), the
two formats `rlhfkit.data.load_records(path, "comparisons")` reads, so `rlhfkit rm` and
`rlhfkit dpo` train on the file as it is. Each record also carries where it came from:
`task_id`, `labellers`, `vote_ids`, and the `ratings` (1-7) and `flags` of those votes; and,
a column each, the task's `ties`, `bad` ("all are bad") and `skips` votes (each a list of the
labeller, vote id, rating and flag of such a vote), which the loaders ignore.

Ties, "all bad" votes and skips carry no preference: they make no record of their own (a
task that has only those has none). Every judgement stays traceable all the same: beside the
records, `<out>.votes.jsonl` holds every vote, one row each naming its task (prompt and
responses), its labeller, choice, ranking, rating, flag, time and the seconds it took,
the votes labellers changed among them (`replaced`: when); and the summary,
`<out>.summary.json`, counts every flag and rating by choice, lists every flagged vote and
the tasks that had a tie, an "all bad" vote or a skip (`tasks_by_choice`), and gives the
agreement between labellers (`agreement.py`). When a task has votes from several labellers,
`aggregate` chooses between writing every vote ("all") and one record per task ordered by
the pairwise majority of its votes ("majority", see `ExportConfig.aggregate`).

The records are written as JSON Lines (`format="jsonl"`), as a Parquet file ("parquet") or as
a `datasets.Dataset.save_to_disk` folder ("dataset"), the three forms `load_records` reads.
A table has one type per column (`table_schema`): a comparison's row has null `responses`
and `ranking`, a ranking's null `chosen` and `rejected` (the loaders read null as absent);
the prompts must all be strings or all chat messages, which JSON Lines alone can mix.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlhfkit.errors import UsageError, check_literals, disk_errors, require
from rlhfkit.labelling.agreement import agreement
from rlhfkit.labelling.campaign import Campaign, Decision
from rlhfkit.labelling.store import CHOICES, Store, Task, Vote

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger(__name__)

# The choices that prefer no response, and the column of a record that lists such votes.
NO_PREFERENCE = {"tie": "ties", "bad": "bad", "skip": "skips"}
# The file (or folder) name each format writes, as `ExportConfig.out` must end.
SUFFIXES = {"jsonl": ".jsonl", "parquet": ".parquet", "dataset": ""}


@dataclass
class ExportConfig:
    """Write the votes of a labelling database as comparisons and rankings (JSONL, Parquet or
    a `datasets` folder) for `rlhfkit rm` and `rlhfkit dpo`."""

    db: str = "runs/label/labels.db"
    """The labelling database (from `rlhfkit label prepare`)."""
    out: str = "runs/label/preferences.jsonl"
    """Where the records are written: a .jsonl file, a .parquet file or a folder, as `format`
    says. Beside it, its name followed by `.votes.jsonl`: every vote with its task; and by
    `.summary.json`: the counts, the flags and ratings, the agreement
    (runs/label/preferences.jsonl.summary.json)."""
    format: Literal["jsonl", "parquet", "dataset"] = "jsonl"
    """'jsonl' (JSON Lines), 'parquet' (one Parquet file) or 'dataset' (a folder written by
    `datasets.Dataset.save_to_disk`, which `datasets.load_from_disk` reads). Each is what
    `rlhfkit rm` and `rlhfkit dpo` read as `train_data`."""
    aggregate: Literal["all", "majority"] = "all"
    """Several labellers' votes on one task: 'all' writes every vote as its own record (the
    same prompt then appears once per labeller); 'majority' writes one record per task,
    response i before response j when more than half of the task's votes (ties included,
    skips not) rank i above j. A task where some pair of responses has no such majority (two
    labellers who disagree, a tie or "all bad" vote that splits them) or where the majorities
    form a cycle is left out and counted as `no_majority`."""

    def __post_init__(self) -> None:
        check_literals(self)
        require(self, "db", bool(self.db), "a database file")
        suffix = Path(self.out).suffix
        require(
            self,
            "out",
            suffix == SUFFIXES[self.format]
            if self.format != "dataset"
            else bool(self.out) and suffix not in (".jsonl", ".parquet"),
            f"a {SUFFIXES[self.format]} file path (format {self.format!r})"
            if self.format != "dataset"
            else "a folder path (format 'dataset'; not a .jsonl or .parquet file)",
        )


def _said(vote: Vote) -> dict[str, Any]:
    """Who gave a tie or a skip, and the rating and flag they gave with it."""
    return {"labeller": vote.labeller, "vote_id": vote.id, "rating": vote.rating, "flag": vote.flag}


def _record(
    task: Task,
    ranking: list[int],
    votes: list[Vote],
    task_votes: list[Vote],
    decision: Decision | None,
) -> dict[str, Any]:
    """One training record: a comparison for K = 2, a ranking for K > 2, from `votes`, with
    the tie and skip votes among `task_votes` (all of the task's) in a column each, and the
    admin's `decision` on the task."""
    if task.k == 2:
        record = {
            "prompt": task.prompt,
            "chosen": task.responses[ranking[0]],
            "rejected": task.responses[ranking[1]],
        }
    else:
        record = {"prompt": task.prompt, "responses": task.responses, "ranking": ranking}
    return {
        **record,
        "task_id": task.id,
        "labellers": [v.labeller for v in votes],
        "vote_ids": [v.id for v in votes],
        "ratings": [v.rating for v in votes],
        "flags": [v.flag for v in votes],
        **{
            column: [_said(v) for v in task_votes if v.choice == choice]
            for choice, column in NO_PREFERENCE.items()
        },
        "decision": decision.as_dict() if decision is not None else None,
    }


def majority_ranking(k: int, votes: list[Vote]) -> list[int] | None:
    """Responses ordered by the pairwise majority of `votes` (non-skip votes on one task):
    i before j when more than half of the votes rank i above j. None when some pair has no
    strict majority or the majorities are not an order (a cycle)."""
    wins: Counter[tuple[int, int]] = Counter()
    for vote in votes:
        if vote.choice == "rank":
            position = {r: p for p, r in enumerate(vote.ranking)}
            for i, j in combinations(range(k), 2):
                wins[(i, j) if position[i] < position[j] else (j, i)] += 1
    beaten: Counter[int] = Counter()  # how many responses each one beats
    for i, j in combinations(range(k), 2):
        if 2 * wins[(i, j)] > len(votes):
            beaten[i] += 1
        elif 2 * wins[(j, i)] > len(votes):
            beaten[j] += 1
        else:
            return None
    # Every pair is decided; the result is an order exactly when the numbers of responses
    # each one beats are K-1, ..., 1, 0 (a transitive tournament).
    order = sorted(range(k), key=lambda r: -beaten[r])
    if [beaten[r] for r in order] != list(range(k - 1, -1, -1)):
        return None
    return order


def export_records(
    tasks: dict[int, Task],
    votes: list[Vote],
    aggregate: str = "all",
    decisions: dict[int, Decision] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The training records of `votes` and the counts of what was left out and why. The
    admin's `decisions` go with their tasks' records; with 'majority' a decided task takes
    the decision's ranking (one of "tie", "bad" or "discard" makes no record)."""
    if aggregate not in ("all", "majority"):
        raise ValueError(f"aggregate={aggregate!r}: expected 'all' or 'majority'")
    decisions = decisions or {}
    by_task: dict[int, list[Vote]] = defaultdict(list)
    for vote in votes:
        by_task[vote.task_id].append(vote)
    records, no_majority, decided_out = [], 0, 0
    for task_id in sorted(by_task):
        task, task_votes = tasks[task_id], by_task[task_id]
        decision = decisions.get(task_id)
        if aggregate == "all":
            records += [
                _record(task, v.ranking, [v], task_votes, decision)
                for v in task_votes
                if v.choice == "rank"
            ]
            continue
        judged = [v for v in task_votes if v.choice != "skip"]
        if not judged:
            continue
        if decision is not None:
            ranking = decision.ranking
            decided_out += ranking is None
        else:
            ranking = majority_ranking(task.k, judged)
            no_majority += ranking is None
        if ranking is not None:
            records.append(_record(task, ranking, judged, task_votes, decision))
    summary = _summary(tasks, votes, records, aggregate)
    if aggregate == "majority":
        summary["left_out"]["no_majority"] = no_majority
        summary["left_out"]["decided_without_preference"] = decided_out
    summary["decided"] = len(decisions)
    return records, summary


def _summary(
    tasks: dict[int, Task], votes: list[Vote], records: list[dict[str, Any]], aggregate: str
) -> dict[str, Any]:
    """What an export holds and leaves out, the flags and ratings, the agreement."""
    choices = Counter(v.choice for v in votes)
    return {
        "aggregate": aggregate,
        "tasks": len(tasks),
        "tasks_with_votes": len({v.task_id for v in votes}),
        "votes": len(votes),
        "votes_by_choice": {c: choices[c] for c in CHOICES},
        "records": len(records),
        "comparisons": sum("chosen" in r for r in records),
        "rankings": sum("ranking" in r for r in records),
        "left_out": {choice: choices[choice] for choice in NO_PREFERENCE},
        "flags": _by_choice(votes, "flag"),
        "ratings": _by_choice(votes, "rating"),
        "flagged": [
            {"task_id": v.task_id, "choice": v.choice, **_said(v)} for v in votes if v.flag
        ],
        "tasks_by_choice": {
            choice: sorted({v.task_id for v in votes if v.choice == choice})
            for choice in NO_PREFERENCE
        },
        "agreement": agreement(votes).as_dict(),
    }


def _by_choice(votes: list[Vote], field: str) -> dict[str, dict[str, int]]:
    """How often each value of `field` (flag or rating) was given, per choice; keys as text
    (JSON's), most frequent first."""
    counts: dict[str, Counter[str]] = {c: Counter() for c in CHOICES}
    for vote in votes:
        value = getattr(vote, field)
        if value is not None:
            counts[vote.choice][str(value)] += 1
    return {c: dict(counts[c].most_common()) for c in CHOICES}


def summary_path(out: str | Path) -> Path:
    """Where `run_export` writes the summary of the records written to `out`: beside it,
    its whole name followed by `.summary.json` (an export to x.jsonl and one to x.parquet
    keep a summary each)."""
    out = Path(out)
    return out.with_name(out.name + ".summary.json")


def votes_path(out: str | Path) -> Path:
    """Where `run_export` writes every vote of the records written to `out`: beside it, its
    whole name followed by `.votes.jsonl`."""
    out = Path(out)
    return out.with_name(out.name + ".votes.jsonl")


def vote_rows(
    tasks: dict[int, Task],
    votes: list[Vote],
    decisions: dict[int, Decision] | None = None,
    gold: dict[int, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """Every vote (those that stand and those their labeller changed, `Vote.replaced`) as a
    row naming its task: the prompt, the responses, who chose what, the rating, the flag,
    when, the seconds from the task given to the vote, and the admin's decision on the task
    and its gold ranking (a check task's) beside. Ties, "all bad" votes and skips, which
    make no training record, are traceable here to their task."""
    decisions, gold = decisions or {}, gold or {}
    rows = []
    for vote in sorted(votes, key=lambda v: (v.task_id, v.created, v.id)):
        task = tasks[vote.task_id]
        rows.append(
            {
                "task_id": task.id,
                "prompt": task.prompt,
                "responses": task.responses,
                "vote_id": vote.id,
                "labeller": vote.labeller,
                "choice": vote.choice,
                "ranking": vote.ranking,
                "rating": vote.rating,
                "flag": vote.flag,
                "created": vote.created,
                "seconds": None if vote.seconds is None else round(vote.seconds, 3),
                "replaced": vote.replaced,
                "decision": decisions[task.id].as_dict() if task.id in decisions else None,
                "gold": gold.get(task.id),
            }
        )
    return rows


def write_jsonl(records: list[dict[str, Any]], path: Path) -> None:
    """Write `records` to `path` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(path)


def table_schema(records: list[dict[str, Any]]) -> pa.Schema:
    """One Arrow type per column of `records`, the columns in the order a record has them;
    the columns no record has (`responses` and `ranking` in an export of pairs) left out."""
    import pyarrow as pa

    said = pa.list_(  # a tie, "all bad" or skip: who, which vote, what they said (`_said`)
        pa.struct(
            [
                ("labeller", pa.string()),
                ("vote_id", pa.string()),
                ("rating", pa.int64()),
                ("flag", pa.string()),
            ]
        )
    )
    messages = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    chat = [isinstance(r["prompt"], list) for r in records]
    if any(chat) and not all(chat):
        raise UsageError(
            "the tasks' prompts are strings and chat messages, which one column of a table "
            "cannot hold both of: export them as JSON Lines (--format jsonl)"
        )
    types = {
        "prompt": messages if chat and chat[0] else pa.string(),
        "chosen": pa.string(),
        "rejected": pa.string(),
        "responses": pa.list_(pa.string()),
        "ranking": pa.list_(pa.int64()),
        "task_id": pa.int64(),
        "labellers": pa.list_(pa.string()),
        "vote_ids": pa.list_(pa.string()),
        "ratings": pa.list_(pa.int64()),
        "flags": pa.list_(pa.string()),
        **dict.fromkeys(NO_PREFERENCE.values(), said),
        "decision": pa.struct(
            [("choice", pa.string()), ("ranking", pa.list_(pa.int64())), ("note", pa.string())]
        ),
    }
    present = {key for r in records for key in r} if records else set(types)
    return pa.schema([(name, kind) for name, kind in types.items() if name in present])


def _table(records: list[dict[str, Any]]) -> pa.Table:
    import pyarrow as pa

    schema = table_schema(records)
    rows = [{name: r.get(name) for name in schema.names} for r in records]
    return pa.Table.from_pylist(rows, schema=schema)


def write_parquet(records: list[dict[str, Any]], path: Path) -> None:
    """Write `records` to the Parquet file `path` atomically."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    pq.write_table(_table(records), partial)
    partial.replace(path)


def write_dataset(records: list[dict[str, Any]], path: Path) -> None:
    """Write `records` as a `datasets.Dataset.save_to_disk` folder at `path`, replacing
    what is there only once the new folder is whole."""
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    datasets.Dataset(_table(records)).save_to_disk(str(partial))
    if path.exists():
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        path.replace(old)
        partial.replace(path)
        shutil.rmtree(old)
    else:
        partial.replace(path)


WRITERS = {"jsonl": write_jsonl, "parquet": write_parquet, "dataset": write_dataset}


def run_export(config: ExportConfig) -> Path:
    """The `rlhfkit label export` command: records to `config.out`, a summary beside it."""
    store = Store(config.db)
    try:
        tasks, votes, replaced = store.tasks(), store.votes(), store.replaced_votes()
        campaign = Campaign(store)
        decisions, gold = campaign.decisions(), campaign.gold()
        summary_extra = {"accuracy_on_check_tasks": campaign.accuracy(votes)}
    finally:
        store.close()
    records, summary = export_records(tasks, votes, config.aggregate, decisions)
    summary |= summary_extra
    out = Path(config.out)
    with disk_errors(out):  # the writers' own: pyarrow's, datasets'
        WRITERS[config.format](records, out)
    rows = vote_rows(tasks, votes + replaced, decisions, gold)
    write_jsonl(rows, votes_path(out))
    summary_file = summary_path(out)
    text = json.dumps(summary, indent=2) + "\n"
    with disk_errors(summary_file, len(text)):
        summary_file.write_text(text, encoding="utf-8")
    left_out = ", ".join(f"{n} {why}" for why, n in summary["left_out"].items())
    logger.info(
        "%d votes -> %d records (%d comparisons, %d rankings) in %s; left out: %s; "
        "%d flagged votes; summary in %s; every vote, each with its task, in %s",
        summary["votes"],
        summary["records"],
        summary["comparisons"],
        summary["rankings"],
        out,
        left_out,
        len(summary["flagged"]),
        summary_file,
        votes_path(out),
    )
    return out
