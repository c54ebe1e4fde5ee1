"""The labelling database: tasks, labellers, what each labeller was shown, and their votes.

One SQLite file holds a whole labelling campaign, so serving needs no model, and a copy of the
file is a backup. What keeps votes safe:

- Write-ahead log (`journal_mode=WAL`) with `synchronous=FULL`: readers never block the writer,
  and a transaction is on disk when COMMIT returns, so killing the server (or the machine)
  loses no vote that a labeller was told is saved.
- Every write is one transaction begun with `BEGIN IMMEDIATE` (the write lock is taken first,
  so two labellers' transactions queue instead of failing on a lock upgrade).
- A vote's primary key is the UUID its browser made when the task was shown. A retried
  submission finds its own row and gets the same answer back; a second, different vote by
  the same labeller on the same task is refused (`UNIQUE (task_id, labeller)`); a labeller
  can only vote on a task they were shown, and never overwrites anyone else's row.

Which task a labeller gets next (`next_task`): the one they were shown and have not answered
yet (one they took back to change first), else a task never shown to them that has fewer than
`labels_per_task` votes, or the task's own overlap (skips do not count); a task assigned to
named labellers goes to them only, a check task (gold) to everyone once, and a paused campaign
gives no new task (`campaign.py` steers these). Tasks that others are already working on come first, so that tasks reach their quota
one after the other; a task shown to someone who has not answered for `LEASE_SECONDS` no
longer counts as being worked on. When every open task is taken, the labeller still gets one
(an extra vote is harmless, an idle labeller is not). The order of the responses is shuffled
for each labeller, as InstructGPT's labelling interface did, and remembered: votes are stored
as response indices, whatever order the labeller saw.

With a quota (`serve --quota N`), a labeller is given no new task once they have judged N
(their skips not counted: a skip says they cannot judge, and the task goes to someone else).

A labeller the organiser disables (`set_disabled`) is signed out and cannot sign in again; the
tasks they were shown and had not answered go back to the others at once. Their votes stay.
A name is one labeller however it is spelt in case and Unicode form ("Eve", "EVE", "ｅｖｅ"
are "eve" if "eve" came first: `_known_name`), so a disabled labeller cannot come back under
another spelling, nor a labeller split their votes over two.

Serving imports this module, so it imports nothing of rlhfkit's ML side (no torch): the
serve process stays small and starts at once.
"""

from __future__ import annotations

import hashlib
import json
import random
import reprlib
import secrets
import sqlite3
import threading
import time
import unicodedata
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhfkit.errors import UsageError

if TYPE_CHECKING:
    from rlhfkit.data import Prompt

SCHEMA_VERSION = 3
LEASE_SECONDS = 30 * 60
CHOICES = ("rank", "tie", "bad", "skip")
MAX_NAME = 40
MAX_FLAG = 200

_SCHEMA = """
CREATE TABLE tasks (
    id INTEGER PRIMARY KEY,
    prompt TEXT NOT NULL,           -- JSON: a string, or a list of {"role", "content"} messages
    responses TEXT NOT NULL,        -- JSON: a list of K >= 2 strings
    k INTEGER NOT NULL CHECK (k >= 2),
    digest TEXT NOT NULL UNIQUE,    -- of prompt and responses: preparing twice adds nothing
    created REAL NOT NULL,
    gold TEXT,                      -- JSON: the known ranking of a check task, else NULL
    overlap INTEGER                 -- votes it needs (NULL: the server's labels_per_task)
);
CREATE TABLE labellers (
    name TEXT PRIMARY KEY,
    token_hash TEXT UNIQUE,         -- sha256 of the login token, NULL if none was issued
    created REAL NOT NULL,
    disabled INTEGER NOT NULL DEFAULT 0  -- 1: the organiser disabled them (no sign-in)
);
CREATE TABLE sessions (
    secret_hash TEXT PRIMARY KEY,   -- sha256 of the session cookie
    labeller TEXT NOT NULL REFERENCES labellers (name),
    created REAL NOT NULL
);
CREATE TABLE shown (
    task_id INTEGER NOT NULL REFERENCES tasks (id),
    labeller TEXT NOT NULL REFERENCES labellers (name),
    display TEXT NOT NULL,          -- JSON: response index shown in each slot
    shown_at REAL NOT NULL,
    PRIMARY KEY (task_id, labeller)
);
CREATE INDEX shown_by_labeller ON shown (labeller, task_id);
"""
_VOTES_TABLE = """
CREATE TABLE {name} (
    id TEXT PRIMARY KEY,            -- UUID made by the client: a retry finds its own row
    task_id INTEGER NOT NULL,
    labeller TEXT NOT NULL,
    choice TEXT NOT NULL CHECK (choice IN ('rank', 'tie', 'bad', 'skip')),
    ranking TEXT,                   -- JSON: response indices best first, for choice 'rank'
    rating INTEGER CHECK (rating BETWEEN 1 AND 7),
    flag TEXT,
    created REAL NOT NULL,
    UNIQUE (task_id, labeller),
    FOREIGN KEY (task_id, labeller) REFERENCES shown (task_id, labeller)
)"""
# A vote its labeller changed ("Change my last vote"), kept with the time it was replaced.
_REPLACED_VOTES_TABLE = """
CREATE TABLE replaced_votes (
    id TEXT PRIMARY KEY,
    task_id INTEGER NOT NULL,
    labeller TEXT NOT NULL,
    choice TEXT NOT NULL,
    ranking TEXT,
    rating INTEGER,
    flag TEXT,
    created REAL NOT NULL,
    replaced REAL NOT NULL
)"""
# The lead's steering (`campaign.py`): tasks given to named labellers only, the admin's
# decision on a task, campaign-wide settings (paused).
_CAMPAIGN_TABLES = [
    "CREATE TABLE assignments (task_id INTEGER NOT NULL REFERENCES tasks (id), "
    "labeller TEXT NOT NULL, PRIMARY KEY (task_id, labeller))",
    "CREATE TABLE decisions (task_id INTEGER PRIMARY KEY REFERENCES tasks (id), "
    "choice TEXT NOT NULL CHECK (choice IN ('rank', 'tie', 'bad', 'discard')), "
    "ranking TEXT, note TEXT, decided REAL NOT NULL)",
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
]
_SCHEMA += _VOTES_TABLE.format(name="votes") + ";"
_SCHEMA += ";".join([_REPLACED_VOTES_TABLE, *_CAMPAIGN_TABLES]) + ";"
# From each older schema version to the next: what a database made by an earlier rlhfkit
# needs. 1 -> 2: labellers can be disabled; a vote can say "all are bad" (SQLite cannot
# change a CHECK constraint, so the votes are copied into a table that has the new one).
# 2 -> 3: a changed vote is kept (replaced_votes); a task can be a check task with a known
# answer (gold) and need its own number of votes (overlap); the lead's tables.
_MIGRATIONS = {
    1: [
        "ALTER TABLE labellers ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0",
        _VOTES_TABLE.format(name="votes_2"),
        "INSERT INTO votes_2 (id, task_id, labeller, choice, ranking, rating, flag, created) "
        "SELECT id, task_id, labeller, choice, ranking, rating, flag, created FROM votes",
        "DROP TABLE votes",
        "ALTER TABLE votes_2 RENAME TO votes",
    ],
    2: [
        "ALTER TABLE tasks ADD COLUMN gold TEXT",
        "ALTER TABLE tasks ADD COLUMN overlap INTEGER",
        _REPLACED_VOTES_TABLE,
        *_CAMPAIGN_TABLES,
    ],
}
# SQLite's INTEGER: a task id outside it names no task (and would overflow the driver).
_INT64 = range(-(2**63), 2**63)
# Characters a name may not hold: controls, format characters (invisible: "ann" and
# "an\u200bn" would look alike), line and paragraph separators, surrogates.
_NOT_IN_NAMES = {"Cc", "Cf", "Zl", "Zp", "Cs"}


@dataclass(frozen=True)
class Task:
    """A prompt and the K >= 2 responses to compare or rank."""

    id: int
    prompt: Prompt
    responses: list[str]

    @property
    def k(self) -> int:
        return len(self.responses)


@dataclass(frozen=True)
class Shown:
    """A task as one labeller sees it: `display[slot]` is the response index in that slot;
    `previous`, their vote on it that they took back to change ("Change my last vote")."""

    task: Task
    display: list[int]
    previous: Vote | None = None

    @property
    def responses(self) -> list[str]:
        """The responses in the order the labeller sees them."""
        return [self.task.responses[i] for i in self.display]


@dataclass(frozen=True)
class Vote:
    """One labeller's answer to one task."""

    id: str
    task_id: int
    labeller: str
    k: int
    choice: str
    """'rank' (the responses ordered), 'tie' (all equally good), 'bad' (all equally bad) or
    'skip' (cannot judge)."""
    ranking: list[int] | None
    """Response indices best first (for 'rank'); None otherwise."""
    rating: int | None
    """1-7 overall quality of the response ranked first (optional)."""
    flag: str | None
    """Free text such as 'harmful' or 'nonsense' (optional)."""
    created: float
    seconds: float | None = None
    """From the moment the task was given to the labeller (again, after a change) to the
    vote; None where that is not known."""
    replaced: float | None = None
    """When the labeller took this vote back to change it; None for a vote that stands."""


@dataclass(frozen=True)
class VoteResult:
    """The stored vote, and whether this submission was a retry of one already stored."""

    vote: Vote
    duplicate: bool


class VoteError(ValueError):
    """A vote the store refuses; `status` is the HTTP status that says why."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class LoginError(ValueError):
    """A name or token that cannot sign in."""


class DatabaseError(UsageError):
    """A file that is not a labelling database (of this rlhfkit)."""


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _known_name(db: sqlite3.Connection, name: str) -> str:
    """The name a labeller already has that ``name`` spells (the same after NFKC
    normalisation and case folding), else ``name``."""
    folded = _folded(name)
    for row in db.execute("SELECT name FROM labellers ORDER BY created, name"):
        if _folded(row["name"]) == folded:
            return row["name"]
    return name


def _folded(name: str) -> str:
    return unicodedata.normalize("NFKC", name).casefold()


def check_name(name: str) -> str:
    """A labeller name, stripped: 1 to `MAX_NAME` characters, none of them invisible."""
    name = name.strip() if isinstance(name, str) else ""
    if not 1 <= len(name) <= MAX_NAME or any(
        unicodedata.category(c) in _NOT_IN_NAMES for c in name
    ):
        raise LoginError(f"a name is 1 to {MAX_NAME} printable characters")
    return name


def _task(row: sqlite3.Row) -> Task:
    return Task(row["id"], json.loads(row["prompt"]), json.loads(row["responses"]))


def _vote(row: sqlite3.Row) -> Vote:
    ranking = row["ranking"]
    keys = row.keys()
    return Vote(
        id=row["id"],
        task_id=row["task_id"],
        labeller=row["labeller"],
        k=row["k"],
        choice=row["choice"],
        ranking=json.loads(ranking) if ranking is not None else None,
        rating=row["rating"],
        flag=row["flag"],
        created=row["created"],
        seconds=row["seconds"] if "seconds" in keys else None,
        replaced=row["replaced"] if "replaced" in keys else None,
    )


class Store:
    """The labelling database at `path`; `create=True` makes it (and its folder) if missing.

    Safe to share between threads: each thread gets its own connection.
    """

    def __init__(self, path: str | Path, *, create: bool = False):
        self.path = Path(path)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.is_file():
            raise DatabaseError(
                f"{self.path}: no such labelling database (`rlhfkit label prepare` makes one)"
            )
        self._check_schema()

    # ------------------------------------------------------------------------ connections
    def _connection(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            # isolation_level=None: no implicit transactions, each is begun explicitly below.
            db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = FULL")
            db.execute("PRAGMA foreign_keys = ON")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    @contextmanager
    def transaction(self, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """One transaction: IMMEDIATE (takes the write lock first) or DEFERRED (a read snapshot)."""
        db = self._connection()
        db.execute(f"BEGIN {mode}")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()

    def _check_schema(self) -> None:
        try:
            with self.transaction() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if version == 0 and tables == 0:
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    version = SCHEMA_VERSION
                while version in _MIGRATIONS and tables > 0:
                    for statement in _MIGRATIONS[version]:
                        db.execute(statement)
                    version += 1
                    db.execute(f"PRAGMA user_version = {version}")
        except sqlite3.DatabaseError as error:
            raise DatabaseError(f"{self.path}: not a labelling database ({error})") from None
        if version != SCHEMA_VERSION:
            raise DatabaseError(
                f"{self.path}: not a labelling database of this rlhfkit (schema version "
                f"{version}, expected {SCHEMA_VERSION})"
            )

    # ------------------------------------------------------------------------------ tasks
    def add_tasks(
        self,
        tasks: Iterable[tuple[Prompt, list[str]]],
        gold: Sequence[list[int] | None] | None = None,
    ) -> tuple[int, int]:
        """Add (prompt, responses) tasks in one transaction; returns (added, already there).
        `gold`, one per task: the known ranking (response indices best first) that makes it
        a check task (`campaign.py`), or None."""
        added = present = 0
        now = time.time()
        with self.transaction() as db:
            for n, (prompt, responses) in enumerate(tasks):
                if len(responses) < 2:
                    raise ValueError(f"a task needs K >= 2 responses, got {len(responses)}")
                prompt_json = json.dumps(prompt, ensure_ascii=False)
                responses_json = json.dumps(list(responses), ensure_ascii=False)
                digest = _hash(prompt_json + "\n" + responses_json)
                cursor = db.execute(
                    "INSERT OR IGNORE INTO tasks (prompt, responses, k, digest, created) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (prompt_json, responses_json, len(responses), digest, now),
                )
                added += cursor.rowcount
                present += 1 - cursor.rowcount
                if gold is not None and gold[n] is not None:
                    if sorted(gold[n]) != list(range(len(responses))):
                        raise ValueError(
                            f"gold {gold[n]} is not an order of the {len(responses)} responses"
                        )
                    db.execute(
                        "UPDATE tasks SET gold = ? WHERE digest = ?", (json.dumps(gold[n]), digest)
                    )
        return added, present

    def tasks(self) -> dict[int, Task]:
        """Every task by id."""
        rows = self._connection().execute("SELECT id, prompt, responses FROM tasks ORDER BY id")
        return {row["id"]: _task(row) for row in rows}

    # ------------------------------------------------------------------- labellers, login
    def issue_token(self, name: str, *, replace: bool = False) -> str | None:
        """A new login token for `name` (the labeller is created if new). Returns None, and
        keeps the old token, if the labeller has one and `replace` is False. Only the token's
        hash is stored: it is shown this once."""
        token = secrets.token_urlsafe(16)
        with self.transaction() as db:
            name = _known_name(db, check_name(name))
            row = db.execute("SELECT token_hash FROM labellers WHERE name = ?", (name,)).fetchone()
            if row is not None and row["token_hash"] is not None and not replace:
                return None
            db.execute(
                "INSERT INTO labellers (name, token_hash, created) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash",
                (name, _hash(token), time.time()),
            )
            # A replaced token also ends the sessions it opened.
            db.execute("DELETE FROM sessions WHERE labeller = ?", (name,))
        return token

    def sign_in(self, *, name: str | None = None, token: str | None = None) -> tuple[str, str]:
        """Open a session with a token, or with a bare name (for a name that has no token).
        Returns (session secret, labeller name)."""
        with self.transaction() as db:
            if token:
                row = db.execute(
                    "SELECT name, disabled FROM labellers WHERE token_hash = ?",
                    (_hash(token.strip()),),
                ).fetchone()
                if row is None:
                    raise LoginError("unknown token")
                name = row["name"]
            else:
                name = _known_name(db, check_name(name or ""))
                row = db.execute(
                    "SELECT token_hash, disabled FROM labellers WHERE name = ?", (name,)
                ).fetchone()
                if row is not None and row["token_hash"] is not None:
                    raise LoginError(f"{name} signs in with the token they were given")
                db.execute(
                    "INSERT OR IGNORE INTO labellers (name, created) VALUES (?, ?)",
                    (name, time.time()),
                )
            if row is not None and row["disabled"]:
                raise LoginError(f"{name} may no longer sign in (the organiser disabled them)")
            secret = secrets.token_urlsafe(24)
            db.execute(
                "INSERT INTO sessions (secret_hash, labeller, created) VALUES (?, ?, ?)",
                (_hash(secret), name, time.time()),
            )
        return secret, name

    def labeller_of(self, secret: str | None) -> str | None:
        """The labeller signed in with this session secret, or None."""
        if not secret:
            return None
        row = (
            self._connection()
            .execute("SELECT labeller FROM sessions WHERE secret_hash = ?", (_hash(secret),))
            .fetchone()
        )
        return row["labeller"] if row is not None else None

    def sign_out(self, secret: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM sessions WHERE secret_hash = ?", (_hash(secret),))

    def labellers(self) -> dict[str, bool]:
        """Every labeller by name (signed in once, or given a token): whether disabled."""
        rows = self._connection().execute("SELECT name, disabled FROM labellers ORDER BY name")
        return {row["name"]: bool(row["disabled"]) for row in rows}

    def set_disabled(self, name: str, disabled: bool = True) -> None:
        """Disable `name` (signed out now, no sign-in later; the tasks they were shown and did
        not answer go back to the others), or enable them again. Their votes stay."""
        with self.transaction() as db:
            name = _known_name(db, name)
            found = db.execute(
                "UPDATE labellers SET disabled = ? WHERE name = ?", (int(disabled), name)
            ).rowcount
            if not found:
                raise LoginError(f"no labeller {name!r}")
            if disabled:
                db.execute("DELETE FROM sessions WHERE labeller = ?", (name,))
                db.execute(
                    "DELETE FROM shown WHERE labeller = ? AND NOT EXISTS (SELECT 1 FROM votes v "
                    "WHERE v.task_id = shown.task_id AND v.labeller = shown.labeller)",
                    (name,),
                )

    # ------------------------------------------------------------------------- next task
    def next_task(
        self, labeller: str, labels_per_task: int, quota: int | None = None
    ) -> Shown | None:
        """The task `labeller` should label now (see the module docstring), or None. With a
        `quota`, no new task once they have judged that many (skips not counted)."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT t.id, t.prompt, t.responses, s.display FROM shown s "
                "JOIN tasks t ON t.id = s.task_id "
                "WHERE s.labeller = ? AND NOT EXISTS "
                "(SELECT 1 FROM votes v WHERE v.task_id = s.task_id AND v.labeller = s.labeller) "
                "ORDER BY (SELECT max(r.replaced) FROM replaced_votes r "
                "WHERE r.task_id = s.task_id AND r.labeller = s.labeller) DESC NULLS LAST, "
                "s.shown_at LIMIT 1",
                (labeller,),
            ).fetchone()
            if row is not None:
                return Shown(_task(row), json.loads(row["display"]), _previous(db, row, labeller))
            if is_paused(db) or (quota is not None and _judged(db, labeller) >= quota):
                return None
            row = db.execute(
                _PICK, {"me": labeller, "needed": labels_per_task, "since": _lease_start()}
            ).fetchone()
            if row is None:
                return None
            task = _task(row)
            display = random.SystemRandom().sample(range(task.k), task.k)
            db.execute(
                "INSERT INTO shown (task_id, labeller, display, shown_at) VALUES (?, ?, ?, ?)",
                (task.id, labeller, json.dumps(display), time.time()),
            )
        return Shown(task, display)

    # ------------------------------------------------------------------------------ votes
    def record_vote(
        self,
        labeller: str,
        vote_id: str,
        task_id: int,
        choice: str,
        order: list[int] | None = None,
        rating: int | None = None,
        flag: str | None = None,
    ) -> VoteResult:
        """Store one vote atomically. `order` lists display slots best first (choice 'rank').

        Submitting the same vote again (same id and content) returns the stored vote with
        `duplicate=True`; anything else that would change a stored vote raises `VoteError`.
        """
        vote_id = _check_vote_id(vote_id)
        _check_fields(choice, order, rating)
        flag = _check_flag(flag)
        if task_id not in _INT64:
            raise VoteError(f"no task {task_id}", 404)
        with self.transaction() as db:
            task = db.execute("SELECT k FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if task is None:
                raise VoteError(f"no task {task_id}", 404)
            shown = db.execute(
                "SELECT display FROM shown WHERE task_id = ? AND labeller = ?", (task_id, labeller)
            ).fetchone()
            if shown is None:
                raise VoteError(f"task {task_id} was not shown to {labeller}", 409)
            ranking = _ranking(choice, order, json.loads(shown["display"]))
            values = (vote_id, task_id, labeller, choice, ranking, rating, flag)
            stored = db.execute(_VOTE_BY_ID, (vote_id,)).fetchone()
            if stored is not None:
                if tuple(stored)[:7] != values:
                    raise VoteError(f"vote id {vote_id} is already used by another vote", 409)
                return VoteResult(_vote(stored), duplicate=True)
            other = db.execute(
                "SELECT id FROM votes WHERE task_id = ? AND labeller = ?", (task_id, labeller)
            ).fetchone()
            if other is not None:
                raise VoteError(f"{labeller} already voted on task {task_id}", 409)
            db.execute(
                "INSERT INTO votes (id, task_id, labeller, choice, ranking, rating, flag, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*values, time.time()),
            )
            stored = db.execute(_VOTE_BY_ID, (vote_id,)).fetchone()
        return VoteResult(_vote(stored), duplicate=False)

    def reopen_last(self, labeller: str) -> Vote | None:
        """Take back `labeller`'s latest vote so that they can vote on its task again: the
        vote moves to the replaced votes (kept, with the time; `replaced_votes`), and the
        task, shown to them anew and unanswered, is the next they get (`next_task` gives the
        task taken back last first) with that vote as its `previous`. Each call
        reopens the latest vote left, so a labeller can go back several. Returns the vote
        taken back, None if they have none."""
        now = time.time()
        with self.transaction() as db:
            row = db.execute(
                _VOTES + " WHERE v.labeller = ? ORDER BY v.created DESC, v.rowid DESC LIMIT 1",
                (labeller,),
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "INSERT INTO replaced_votes (id, task_id, labeller, choice, ranking, rating, "
                "flag, created, replaced) SELECT id, task_id, labeller, choice, ranking, rating, "
                "flag, created, ? FROM votes WHERE id = ?",
                (now, row["id"]),
            )
            db.execute("DELETE FROM votes WHERE id = ?", (row["id"],))
            db.execute(
                "UPDATE shown SET shown_at = ? WHERE task_id = ? AND labeller = ?",
                (now, row["task_id"], labeller),
            )
        return _vote(row)

    def replaced_votes(self) -> list[Vote]:
        """Every vote a labeller took back to change, oldest first (`Vote.replaced` set)."""
        rows = self._connection().execute(_REPLACED + " ORDER BY v.created, v.id")
        return [_vote(row) for row in rows]

    def votes(self) -> list[Vote]:
        """Every vote, oldest first."""
        rows = self._connection().execute(_VOTES + " ORDER BY v.created, v.id")
        return [_vote(row) for row in rows]

    # --------------------------------------------------------------------------- progress
    def labeller_progress(
        self, labeller: str, labels_per_task: int, quota: int | None = None
    ) -> dict[str, int]:
        """`labeller`'s votes, and how many tasks they could still be given (within their
        `quota` of judged tasks, if one is set; the progress then holds it, and `judged`)."""
        with self.transaction("DEFERRED") as db:
            votes = db.execute(
                "SELECT count(*) FROM votes WHERE labeller = ?", (labeller,)
            ).fetchone()[0]
            left = db.execute(_LEFT, {"me": labeller, "needed": labels_per_task}).fetchone()[0]
            if quota is None:
                return {"votes": votes, "left": left}
            judged = _judged(db, labeller)
        left = min(left, max(quota - judged, 0))
        return {"votes": votes, "left": left, "quota": quota, "judged": judged}

    def choices_of(self, labeller: str) -> dict[str, int]:
        """How many of `labeller`'s votes are preferences, ties and skips."""
        rows = self._connection().execute(
            "SELECT choice, count(*) AS n FROM votes WHERE labeller = ? GROUP BY choice",
            (labeller,),
        )
        return {**dict.fromkeys(CHOICES, 0), **{row["choice"]: row["n"] for row in rows}}

    def counts(self, labels_per_task: int) -> dict[str, Any]:
        """Tasks (all, with a vote, with `labels_per_task` votes) and votes per labeller."""
        with self.transaction("DEFERRED") as db:
            per_task = db.execute(
                "SELECT t.id, count(v.id) AS n, coalesce(t.overlap, ?) AS needed FROM tasks t "
                "LEFT JOIN votes v ON v.task_id = t.id AND v.choice != 'skip' GROUP BY t.id",
                (labels_per_task,),
            ).fetchall()
            rows = db.execute(
                "SELECT labeller, choice, count(*) AS n FROM votes GROUP BY labeller, choice"
            ).fetchall()
        labellers: dict[str, dict[str, int]] = {}
        for row in rows:
            counts = labellers.setdefault(row["labeller"], dict.fromkeys(("votes", *CHOICES), 0))
            counts[row["choice"]] = row["n"]
            counts["votes"] += row["n"]
        return {
            "tasks": len(per_task),
            "tasks_started": sum(row["n"] > 0 for row in per_task),
            "tasks_done": sum(row["n"] >= row["needed"] for row in per_task),
            "votes": sum(c["votes"] for c in labellers.values()),
            "labellers": dict(sorted(labellers.items())),
        }


# The tasks :me may be given at all: those given to no one in particular, and those given to
# them (`campaign.Campaign.assign`).
_MINE = """(NOT EXISTS (SELECT 1 FROM assignments a WHERE a.task_id = t.id) OR EXISTS
    (SELECT 1 FROM assignments a WHERE a.task_id = t.id AND a.labeller = :me))"""
# A task that still takes votes: fewer than it needs (its own overlap, else :needed), or a
# check task (gold), which every labeller judges once.
_OPEN = "(coalesce(d.n, 0) < coalesce(t.overlap, :needed) OR t.gold IS NOT NULL)"

# Open tasks not yet shown to :me, those others are working on first (see the module docstring).
_PICK = f"""
WITH done AS (
    SELECT task_id, count(*) AS n FROM votes WHERE choice != 'skip' GROUP BY task_id
), pending AS (
    SELECT s.task_id, count(*) AS n FROM shown s
    WHERE s.shown_at > :since AND NOT EXISTS
        (SELECT 1 FROM votes v WHERE v.task_id = s.task_id AND v.labeller = s.labeller)
    GROUP BY s.task_id
), open AS (
    SELECT t.id, t.prompt, t.responses, coalesce(t.overlap, :needed) AS needed,
        coalesce(d.n, 0) + coalesce(p.n, 0) AS busy
    FROM tasks t
    LEFT JOIN done d ON d.task_id = t.id
    LEFT JOIN pending p ON p.task_id = t.id
    WHERE {_OPEN} AND {_MINE}
      AND NOT EXISTS (SELECT 1 FROM shown s WHERE s.task_id = t.id AND s.labeller = :me)
)
SELECT id, prompt, responses FROM open
ORDER BY busy >= needed, CASE WHEN busy < needed THEN -busy ELSE busy END, id
LIMIT 1
"""

# Tasks :me could still be given: open ones never shown to them, and their unanswered one.
_LEFT = f"""
SELECT
    (SELECT count(*) FROM tasks t
     LEFT JOIN (SELECT task_id, count(*) AS n FROM votes WHERE choice != 'skip'
                GROUP BY task_id) d ON d.task_id = t.id
     WHERE {_OPEN} AND {_MINE}
       AND NOT EXISTS (SELECT 1 FROM shown s WHERE s.task_id = t.id AND s.labeller = :me))
  + (SELECT count(*) FROM shown s WHERE s.labeller = :me AND NOT EXISTS
        (SELECT 1 FROM votes v WHERE v.task_id = s.task_id AND v.labeller = s.labeller))
"""

_VOTE_COLUMNS = "v.id, v.task_id, v.labeller, v.choice, v.ranking, v.rating, v.flag, v.created, t.k"
_VOTES = (
    f"SELECT {_VOTE_COLUMNS}, v.created - s.shown_at AS seconds FROM votes v "
    "JOIN tasks t ON t.id = v.task_id "
    "LEFT JOIN shown s ON s.task_id = v.task_id AND s.labeller = v.labeller"
)
_REPLACED = (
    f"SELECT {_VOTE_COLUMNS}, v.replaced FROM replaced_votes v JOIN tasks t ON t.id = v.task_id"
)
_VOTE_BY_ID = _VOTES + " WHERE v.id = ?"


def _previous(db: sqlite3.Connection, task: sqlite3.Row, labeller: str) -> Vote | None:
    """`labeller`'s latest vote on `task` that they took back to change, if any."""
    row = db.execute(
        _REPLACED + " WHERE v.task_id = ? AND v.labeller = ? ORDER BY v.replaced DESC LIMIT 1",
        (task["id"], labeller),
    ).fetchone()
    return _vote(row) if row is not None else None


def is_paused(db: sqlite3.Connection) -> bool:
    """Whether the lead paused the campaign: no labeller is given a new task until resumed
    (a task already given stays theirs to answer)."""
    row = db.execute("SELECT value FROM settings WHERE key = 'paused'").fetchone()
    return row is not None and row["value"] == "1"


def _judged(db: sqlite3.Connection, labeller: str) -> int:
    """The tasks `labeller` judged: their votes but the skips (what a quota counts)."""
    return db.execute(
        "SELECT count(*) FROM votes WHERE labeller = ? AND choice != 'skip'", (labeller,)
    ).fetchone()[0]


def _lease_start() -> float:
    return time.time() - LEASE_SECONDS


# A value a client sent, shown in an error: short, however long or deeply nested it is.
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 2, 60, 40
_brief = _repr.repr


def _check_vote_id(vote_id: Any) -> str:
    try:
        if not isinstance(vote_id, str):
            raise ValueError
        return str(uuid.UUID(vote_id))
    except ValueError:
        raise VoteError(f"vote id {_brief(vote_id)} is not a UUID", 422) from None


def _check_fields(choice: Any, order: Any, rating: Any) -> None:
    if choice not in CHOICES:
        raise VoteError(f"choice {_brief(choice)} is not one of {', '.join(CHOICES)}", 422)
    if choice != "rank" and order is not None:
        raise VoteError(f"choice {_brief(choice)} takes no order", 422)
    if rating is not None and not (type(rating) is int and 1 <= rating <= 7):
        raise VoteError(f"rating {_brief(rating)} is not an integer from 1 to 7", 422)


def _check_flag(flag: Any) -> str | None:
    if flag is None:
        return None
    if not isinstance(flag, str) or len(flag.strip()) > MAX_FLAG:
        raise VoteError(f"a flag is a text of at most {MAX_FLAG} characters", 422)
    return flag.strip() or None


def _ranking(choice: str, order: Any, display: list[int]) -> str | None:
    """The display slots of `order` as response indices best first (JSON), for 'rank'."""
    if choice != "rank":
        return None
    k = len(display)
    if not (
        isinstance(order, list)
        and all(type(slot) is int for slot in order)
        and sorted(order) == list(range(k))
    ):
        raise VoteError(f"order {_brief(order)} is not a permutation of the slots 0..{k - 1}", 422)
    return json.dumps([display[slot] for slot in order])
