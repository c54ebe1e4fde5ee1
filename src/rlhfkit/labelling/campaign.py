"""What a labelling lead steers, on the campaign's database (`store.py`'s tables).

- **Assignment** (`assign`): tasks given to named labellers only, with the number of votes
  each task needs (its overlap) chosen per task; the other tasks go to anyone. `rlhfkit label
  assign` gives a share of the tasks, or the tasks named, to a list of labellers in turn.
- **Pausing** (`set_paused`): no labeller is given a new task until the lead resumes.
- **Check tasks** (`set_gold`): a task with a known answer (its gold ranking), which every
  labeller judges once; each labeller's accuracy on them (`accuracy`) is the share of their
  pairwise judgments that agree with the gold ones (`agreement.pair_labels`: a ranking of K is
  its K(K-1)/2 pairs, a tie or "all bad" a tie on each pair).
- **Review** (`review_queue`, `decide`): the tasks whose votes disagree on some pair of
  responses (but the check tasks), and the admin's decision on a task (a ranking, "tie", "bad" or "discard", with a
  note), kept beside the votes: `label export` writes it with the task's records and, with
  `aggregate: majority`, uses it in place of the votes' majority. A decided ranking can make
  the task a check task at once.
- **Seeing the work** (`task_rows`): each task with its votes (who, what, rating, flag, the
  seconds it took), its decision and gold, filtered by labeller or by what the lead looks for.

The web app calls these for the admin (`app.py`); nothing here imports torch.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlhfkit.labelling.agreement import pair_labels
from rlhfkit.labelling.store import Store, Vote, VoteError, is_paused

DECISIONS = ("rank", "tie", "bad", "discard")
# What the admin's task list can show: every task, or those a lead looks for.
TASK_FILTERS = ("all", "review", "flagged", "gold", "decided")


@dataclass(frozen=True)
class Decision:
    """The admin's decision on a task: `ranking` (response indices best first) for 'rank';
    'tie' (all equally good), 'bad' (all bad) or 'discard' (not usable as data) otherwise."""

    task_id: int
    choice: str
    ranking: list[int] | None
    note: str | None
    decided: float

    def as_dict(self) -> dict[str, Any]:
        return {"choice": self.choice, "ranking": self.ranking, "note": self.note}


def gold_vote(task_id: int, ranking: list[int]) -> Vote:
    """The gold answer (``ranking`` of every response) of check task ``task_id`` as a vote, to
    compare labellers' votes with."""
    return Vote("gold", task_id, "gold", len(ranking), "rank", ranking, None, None, 0.0)


def disagree(votes: Sequence[Vote]) -> bool:
    """Whether some two of `votes` (on one task) judge a pair of responses differently."""
    seen: dict[tuple[int, int], str] = {}
    for vote in votes:
        for pair, label in pair_labels(vote).items():
            if seen.setdefault(pair, label) != label:
                return True
    return False


class Campaign:
    """The lead's steering of the campaign in `store` (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _rows(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        with self.store.transaction("DEFERRED") as db:
            return db.execute(sql, parameters).fetchall()

    # ----------------------------------------------------------------------- assignment
    def assign(
        self, task_ids: Sequence[int], labellers: Sequence[str], overlap: int | None = None
    ) -> None:
        """Give each task of `task_ids` to `labellers` only (replacing an earlier assignment),
        needing `overlap` votes (None: the server's `labels_per_task`). An empty `labellers`
        gives the tasks back to anyone."""
        with self.store.transaction() as db:
            for task_id in task_ids:
                _assign(db, task_id, labellers, overlap)

    def assign_in_turn(
        self, task_ids: Sequence[int], labellers: Sequence[str], overlap: int
    ) -> dict[str, list[int]]:
        """Give each task to `overlap` of `labellers`, in turn (task 1 to the first `overlap`,
        the next to the ones after them, ...), so that every labeller gets as many tasks;
        returns each labeller's tasks."""
        if not 1 <= overlap <= len(labellers):
            raise ValueError(f"overlap {overlap}: expected 1 to {len(labellers)} labellers")
        given: dict[str, list[int]] = {name: [] for name in labellers}
        with self.store.transaction() as db:  # all of them or none
            for n, task_id in enumerate(task_ids):
                names = [labellers[(n * overlap + i) % len(labellers)] for i in range(overlap)]
                _assign(db, task_id, names, overlap)
                for name in names:
                    given[name].append(task_id)
        return given

    def unassigned_share(self, share: float, seed: int) -> list[int]:
        """A random `share` of the tasks given to no one yet (drawn with `seed`), by id."""
        rows = self._rows(
            "SELECT id FROM tasks t WHERE NOT EXISTS "
            "(SELECT 1 FROM assignments a WHERE a.task_id = t.id) ORDER BY id"
        )
        ids = [row["id"] for row in rows]
        return sorted(random.Random(seed).sample(ids, round(share * len(ids))))

    def assignments(self) -> dict[int, list[str]]:
        """The labellers each assigned task is given to, by task id."""
        rows = self._rows("SELECT task_id, labeller FROM assignments ORDER BY task_id, labeller")
        given: dict[int, list[str]] = defaultdict(list)
        for row in rows:
            given[row["task_id"]].append(row["labeller"])
        return dict(given)

    def assigned(self) -> dict[str, int]:
        """How many tasks are given to each labeller by name."""
        rows = self._rows(
            "SELECT labeller, count(*) AS n FROM assignments GROUP BY labeller ORDER BY labeller"
        )
        return {row["labeller"]: row["n"] for row in rows}

    # -------------------------------------------------------------------------- pausing
    def set_paused(self, paused: bool) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO settings (key, value) VALUES ('paused', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                ("1" if paused else "0",),
            )

    def paused(self) -> bool:
        with self.store.transaction("DEFERRED") as db:
            return is_paused(db)

    # ---------------------------------------------------------------------- check tasks
    def set_gold(self, task_id: int, ranking: list[int] | None) -> None:
        """Make task `task_id` a check task with the known `ranking` (response indices best
        first), or (None) an ordinary task again."""
        with self.store.transaction() as db:
            _check_task(db, task_id, ranking)
            gold = json.dumps(ranking) if ranking is not None else None
            db.execute("UPDATE tasks SET gold = ? WHERE id = ?", (gold, task_id))

    def gold(self) -> dict[int, list[int]]:
        """The known ranking of each check task, by task id."""
        rows = self._rows("SELECT id, gold FROM tasks WHERE gold NOT NULL")
        return {row["id"]: json.loads(row["gold"]) for row in rows}

    def accuracy(self, votes: Sequence[Vote] | None = None) -> dict[str, dict[str, Any]]:
        """Each labeller's agreement with the check tasks' gold: the pairwise judgments they
        made on them (`judgments`), how many match the gold (`correct`), the share
        (`accuracy`) and the check tasks they judged (`tasks`)."""
        truths = {
            task: pair_labels(gold_vote(task, ranking)) for task, ranking in self.gold().items()
        }
        votes = self.store.votes() if votes is None else votes
        scores: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"tasks": 0, "judgments": 0, "correct": 0}
        )
        for vote in votes:
            if vote.task_id not in truths or vote.choice == "skip":
                continue
            truth, said = truths[vote.task_id], pair_labels(vote)
            score = scores[vote.labeller]
            score["tasks"] += 1
            score["judgments"] += len(said)
            score["correct"] += sum(label == truth[pair] for pair, label in said.items())
        for score in scores.values():
            score["accuracy"] = (
                score["correct"] / score["judgments"] if score["judgments"] else None
            )
        return dict(sorted(scores.items()))

    # --------------------------------------------------------------------------- review
    def decide(
        self,
        task_id: int,
        choice: str,
        ranking: list[int] | None = None,
        note: str | None = None,
        as_gold: bool = False,
    ) -> Decision:
        """Record the admin's decision on `task_id` (replacing an earlier one); with
        `as_gold`, a decided ranking also makes the task a check task."""
        if choice not in DECISIONS:
            raise VoteError(f"decision {choice!r} is not one of {', '.join(DECISIONS)}", 422)
        if (choice == "rank") != (ranking is not None):
            raise VoteError("a 'rank' decision, and only it, takes a ranking", 422)
        note = (note or "").strip() or None
        decided = time.time()
        with self.store.transaction() as db:
            _check_task(db, task_id, ranking)
            db.execute(
                "INSERT INTO decisions (task_id, choice, ranking, note, decided) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET choice = "
                "excluded.choice, ranking = excluded.ranking, note = excluded.note, "
                "decided = excluded.decided",
                (task_id, choice, json.dumps(ranking) if ranking else None, note, decided),
            )
            if as_gold and ranking is not None:
                db.execute("UPDATE tasks SET gold = ? WHERE id = ?", (json.dumps(ranking), task_id))
        return Decision(task_id, choice, ranking, note, decided)

    def decisions(self) -> dict[int, Decision]:
        """Every decision of the admin by task id."""
        rows = self._rows("SELECT * FROM decisions ORDER BY task_id")
        return {
            row["task_id"]: Decision(
                row["task_id"],
                row["choice"],
                json.loads(row["ranking"]) if row["ranking"] else None,
                row["note"],
                row["decided"],
            )
            for row in rows
        }

    def review_queue(self, votes: Sequence[Vote] | None = None) -> list[int]:
        """The tasks whose votes disagree on some pair of responses and that the admin has
        not decided yet, by id; not the check tasks, whose answer is known."""
        settled = self.decisions().keys() | self.gold().keys()
        return [
            task_id
            for task_id, task_votes in _by_task(self.store.votes() if votes is None else votes)
            if task_id not in settled and disagree(task_votes)
        ]

    # ------------------------------------------------------------------- seeing the work
    def task_rows(self, labeller: str | None = None, show: str = "all") -> list[dict[str, Any]]:
        """Each task that has votes (all tasks for `show='gold'` and 'decided'), with its
        votes, decision and gold; only the tasks `labeller` voted on, if given, and those
        `show` asks for (`TASK_FILTERS`): to review (the votes disagree, the admin has not
        decided, not a check task), that have a flag, that are check tasks, that the admin decided."""
        if show not in TASK_FILTERS:
            raise ValueError(f"show={show!r}: expected one of {', '.join(TASK_FILTERS)}")
        tasks, votes = self.store.tasks(), self.store.votes()
        decisions, gold = self.decisions(), self.gold()
        by_task = dict(_by_task(votes))
        rows = []
        for task_id, task in tasks.items():
            task_votes = by_task.get(task_id, [])
            if labeller is not None and all(v.labeller != labeller for v in task_votes):
                continue
            split = disagree(task_votes)
            wanted = {
                "all": bool(task_votes),
                "review": split and task_id not in decisions and task_id not in gold,
                "flagged": any(v.flag for v in task_votes),
                "gold": task_id in gold,
                "decided": task_id in decisions,
            }
            if wanted[show]:
                decision = decisions.get(task_id)
                rows.append(
                    {
                        "task": task,
                        "votes": task_votes,
                        "disagree": split,
                        "decision": decision.as_dict() if decision else None,
                        "gold": gold.get(task_id),
                    }
                )
        return rows


def _assign(db: Any, task_id: int, labellers: Sequence[str], overlap: int | None) -> None:
    _check_task(db, task_id)
    db.execute("DELETE FROM assignments WHERE task_id = ?", (task_id,))
    db.executemany(
        "INSERT INTO assignments (task_id, labeller) VALUES (?, ?)",
        [(task_id, name) for name in dict.fromkeys(labellers)],
    )
    db.execute("UPDATE tasks SET overlap = ? WHERE id = ?", (overlap, task_id))


def _by_task(votes: Sequence[Vote]) -> list[tuple[int, list[Vote]]]:
    grouped: dict[int, list[Vote]] = defaultdict(list)
    for vote in votes:
        grouped[vote.task_id].append(vote)
    return sorted(grouped.items())


def _check_task(db: Any, task_id: int, ranking: Any = None) -> None:
    """A `VoteError` unless task `task_id` exists and `ranking`, if given, orders its
    responses."""
    row = db.execute("SELECT k FROM tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None:
        raise VoteError(f"no task {task_id}", 404)
    if ranking is not None:
        _check_ranking(ranking, row["k"])


def _check_ranking(ranking: Any, k: int) -> None:
    if not (
        isinstance(ranking, list)
        and all(type(i) is int for i in ranking)
        and sorted(ranking) == list(range(k))
    ):
        raise VoteError(f"ranking {ranking!r} is not an order of the responses 0..{k - 1}", 422)
