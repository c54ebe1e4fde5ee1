"""Labelling: the SQLite store, what a page shows of model text, agreement and export."""

import json
import sqlite3
import threading
import uuid

import pytest

from rlhfkit.data import Comparison, Ranking, load_records
from rlhfkit.errors import UsageError
from rlhfkit.labelling import store as store_module
from rlhfkit.labelling.agreement import agreement, cohen_kappa, pair_labels, raw_agreement
from rlhfkit.labelling.display import prompt_turns, visible, visible_html
from rlhfkit.labelling.export import (
    ExportConfig,
    export_records,
    majority_ranking,
    run_export,
    summary_path,
    votes_path,
)
from rlhfkit.labelling.store import DatabaseError, LoginError, Store, Vote, VoteError

PAIR = ("Say hi.", ["Hi!", "Hello there."])
RANK = ([{"role": "user", "content": "Count."}], ["one", "two", "three", "four"])


def new_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "labels.db", create=True)
    for name in ("ann", "bob", "cat", "dan"):
        s.sign_in(name=name)
    yield s
    s.close()


def shown_and_vote(store, labeller, order=None, choice="rank", labels_per_task=1, **extra):
    """Show `labeller` their next task and vote on it; `order` lists response indices."""
    shown = store.next_task(labeller, labels_per_task)
    slots = None
    if choice == "rank":
        order = order if order is not None else list(range(shown.task.k))
        slots = [shown.display.index(i) for i in order]
    return store.record_vote(labeller, new_id(), shown.task.id, choice, slots, **extra)


# ------------------------------------------------------------------------------- display
def test_visible_names_every_deceptive_character_and_keeps_layout():
    text = "a\x1b[31mred\x00\x08 b\u202eevil\u2066x\u2069 c\r\nnext\tcol\x7f\x85\rz"
    assert visible(text) == (
        "a\\x1b[31mred\\x00\\x08 b\\u202eevil\\u2066x\\u2069 c\nnext\tcol\\x7f\\x85\\rz"
    )
    assert visible("<script>alert(1)</script> **bold**") == "<script>alert(1)</script> **bold**"


DECEPTIVE = [chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))]
DECEPTIVE += [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]


def test_visible_shows_real_text_as_it_is_and_neutralises_only_what_deceives():
    """By character class: joiners, non-joiners and the direction marks are part of real text
    (a family emoji, a Persian word, mixed-direction punctuation) and stay; the controls and
    the bidi embeddings, overrides and isolates, which reorder what follows, are escaped."""
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # می‌خواهم
    real = [
        family,
        persian,
        "\U0001f3f3\ufe0f\u200d\U0001f308",  # rainbow flag: a ZWJ sequence
        "\U0001f1eb\U0001f1f7",  # a flag of two regional indicators
        "price: 10\u200e$ \u05e9\u05dc\u05d5\u05dd\u200f!",  # LRM, Hebrew, RLM
        "\u0627\u061c123",  # Arabic letter mark
        "soft\u00adhyphen, zero\u200bwidth, word\u2060joiner",
    ]
    for text in real:
        assert visible(text) == text and visible_html(text) == text, ascii(text)
    for character in DECEPTIVE:
        shown = visible(f"a{character}b")
        assert character not in shown and shown.startswith("a\\") and shown.endswith("b")
        assert visible_html(character).startswith('<span class="ctrl"')


def test_visible_html_escapes_and_marks_what_it_replaced():
    html = visible_html("<b>x</b>\x1b[0m & \u202e")
    assert html == (
        '&lt;b&gt;x&lt;/b&gt;<span class="ctrl" title="U+001B">\\x1b</span>[0m &amp; '
        '<span class="ctrl" title="U+202E">\\u202e</span>'
    )
    assert visible_html("plain") == "plain"


def test_prompt_turns_of_text_and_chat_prompts():
    assert prompt_turns("hi") == [{"role": None, "content": "hi"}]
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert prompt_turns(chat) == chat


# --------------------------------------------------------------------------------- store
def test_database_is_wal_with_full_sync_and_refuses_other_files(tmp_path, store):
    db = store._connection()
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with pytest.raises(DatabaseError, match="no such labelling database"):
        Store(tmp_path / "missing.db")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(DatabaseError, match="not a labelling database"):
        Store(other)
    (tmp_path / "text.db").write_text("not sqlite at all, just some text in a file" * 10)
    with pytest.raises(DatabaseError, match="not a labelling database"):
        Store(tmp_path / "text.db")


def test_adding_the_same_tasks_twice_adds_nothing(store):
    assert store.add_tasks([PAIR, RANK]) == (2, 0)
    assert store.add_tasks([PAIR, RANK, ("Other", ["x", "y"])]) == (1, 2)
    tasks = store.tasks()
    assert [t.k for t in tasks.values()] == [2, 4, 2]
    assert tasks[2].prompt == RANK[0] and tasks[2].responses == RANK[1]


def test_next_task_is_the_unanswered_one_then_never_one_shown_before(store):
    store.add_tasks([PAIR, RANK])
    first = store.next_task("ann", 1)
    assert store.next_task("ann", 1) == first  # shown, not answered: the same again
    assert sorted(first.display) == list(range(first.task.k))
    store.record_vote("ann", new_id(), first.task.id, "skip")
    second = store.next_task("ann", 1)
    assert second.task.id != first.task.id
    store.record_vote("ann", new_id(), second.task.id, "tie")
    assert store.next_task("ann", 1) is None  # both shown to ann once


def test_tasks_are_handed_out_until_labelled_enough_and_skips_do_not_count(store):
    store.add_tasks([PAIR])
    shown_and_vote(store, "ann", choice="skip", labels_per_task=2)
    shown_and_vote(store, "bob", [1, 0], labels_per_task=2)
    shown_and_vote(store, "cat", [0, 1], labels_per_task=2)  # the skip left room for cat
    assert store.next_task("dan", 2) is None
    assert store.next_task("dan", 3) is not None


def test_tasks_others_are_working_on_come_first(store):
    store.add_tasks([PAIR, ("Second", ["x", "y"]), ("Third", ["u", "v"])])
    assert store.next_task("ann", 2).task.id == 1
    assert store.next_task("bob", 2).task.id == 1  # ann is on task 1: finish it first
    assert store.next_task("cat", 2).task.id == 2  # task 1 has its two labellers
    assert store.next_task("dan", 2).task.id == 2


def test_an_abandoned_task_is_handed_out_again_after_the_lease(store, monkeypatch):
    store.add_tasks([PAIR, ("Second", ["x", "y"])])
    assert store.next_task("ann", 1).task.id == 1
    assert store.next_task("bob", 1).task.id == 2
    assert store.next_task("cat", 1).task.id == 1  # all taken: an extra vote beats idling
    monkeypatch.setattr(store_module, "LEASE_SECONDS", -1.0)  # every lease has run out
    store.record_vote("bob", new_id(), 2, "rank", [0, 1])
    assert store.next_task("dan", 1).task.id == 1


def test_votes_are_stored_as_response_indices_whatever_the_display_order(store):
    store.add_tasks([RANK])
    shown = store.next_task("ann", 1)
    slots = [3, 1, 0, 2]
    result = store.record_vote("ann", new_id(), shown.task.id, "rank", slots, rating=6, flag="ok")
    assert result.vote.ranking == [shown.display[s] for s in slots]
    assert shown.responses[3] == RANK[1][result.vote.ranking[0]]
    assert (result.vote.rating, result.vote.flag, result.duplicate) == (6, "ok", False)


def test_a_retried_vote_is_stored_once_and_answered_the_same(store):
    store.add_tasks([PAIR])
    shown = store.next_task("ann", 1)
    vote_id = new_id()
    first = store.record_vote("ann", vote_id, shown.task.id, "rank", [1, 0], rating=3)
    again = store.record_vote("ann", vote_id.upper(), shown.task.id, "rank", [1, 0], rating=3)
    assert again.duplicate and again.vote == first.vote
    assert len(store.votes()) == 1


@pytest.mark.parametrize(
    "change, status, message",
    [
        ({"order": [0, 1]}, 409, "already used by another vote"),
        ({"vote_id": "other"}, 409, "already voted on task 1"),
        ({"labeller": "bob"}, 409, "was not shown to bob"),
        ({"task_id": 9}, 404, "no task 9"),
        ({"vote_id": "not-a-uuid"}, 422, "is not a UUID"),
        ({"choice": "best"}, 422, "is not one of rank, tie, bad, skip"),
        ({"order": [0, 0]}, 422, "not a permutation of the slots 0..1"),
        ({"order": None}, 422, "not a permutation"),
        ({"choice": "tie"}, 422, "takes no order"),
        ({"rating": 8}, 422, "rating 8 is not an integer from 1 to 7"),
        ({"rating": True}, 422, "rating True"),
        ({"flag": "x" * 201}, 422, "at most 200 characters"),
    ],
)
def test_votes_the_store_refuses(store, change, status, message):
    store.add_tasks([PAIR])
    shown = store.next_task("ann", 1)
    vote_id = new_id()
    store.record_vote("ann", vote_id, shown.task.id, "rank", [1, 0])
    args = {
        "labeller": "ann",
        "vote_id": vote_id,
        "task_id": shown.task.id,
        "choice": "rank",
        "order": [1, 0],
    }
    if change.get("vote_id") == "other":
        change = {"vote_id": new_id()}
    args.update(change)
    with pytest.raises(VoteError, match=message) as info:
        store.record_vote(**args)
    assert info.value.status == status
    assert len(store.votes()) == 1


def test_concurrent_labellers_never_overwrite_each_other(store):
    store.add_tasks([(f"Prompt {i}", [f"a{i}", f"b{i}"]) for i in range(30)])
    errors = []

    def label(name):
        try:
            local = Store(store.path)
            local.sign_in(name=name)  # one store per labeller, as separate server threads
            while (shown := local.next_task(name, 4)) is not None:
                local.record_vote(name, new_id(), shown.task.id, "rank", [1, 0])
            local.close()
        except Exception as error:  # reported below: an assert here would be lost
            errors.append(error)

    threads = [threading.Thread(target=label, args=(f"l{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    votes = store.votes()
    assert len(votes) == 120
    assert len({(v.task_id, v.labeller) for v in votes}) == 120


def test_sign_in_with_names_and_tokens(store):
    secret, name = store.sign_in(name="  ann ")
    assert name == "ann" and store.labeller_of(secret) == "ann"
    token = store.issue_token("bob")
    assert store.issue_token("bob") is None  # keeps the one printed before
    with pytest.raises(LoginError, match="signs in with the token"):
        store.sign_in(name="bob")
    secret, name = store.sign_in(token=token)
    assert name == "bob" and store.labeller_of(secret) == "bob"
    new = store.issue_token("bob", replace=True)
    assert store.labeller_of(secret) is None  # a replaced token ends its sessions
    with pytest.raises(LoginError, match="unknown token"):
        store.sign_in(token=token)
    assert store.sign_in(token=new)[1] == "bob"
    for bad in ("", "   ", "x" * 41, "ann\x1b", "a\u202eb", "a\nb"):
        with pytest.raises(LoginError):
            store.sign_in(name=bad)
    store.sign_out(secret)
    assert store.labeller_of(None) is None


def test_progress_counts(store):
    store.add_tasks([PAIR, ("Second", ["x", "y"])])
    shown_and_vote(store, "ann", [0, 1], labels_per_task=2)
    shown_and_vote(store, "bob", choice="tie", labels_per_task=2)
    shown_and_vote(store, "bob", choice="skip", labels_per_task=2)
    counts = store.counts(2)
    assert counts["tasks"] == 2 and counts["tasks_started"] == 1 and counts["tasks_done"] == 1
    assert counts["votes"] == 3
    assert counts["labellers"]["bob"] == {"votes": 2, "rank": 0, "tie": 1, "bad": 0, "skip": 1}
    assert store.labeller_progress("ann", 2) == {"votes": 1, "left": 1}
    assert store.labeller_progress("bob", 2) == {"votes": 2, "left": 0}


def test_a_quota_ends_a_labellers_tasks_and_skips_do_not_count(store):
    store.add_tasks([PAIR, ("Second", ["x", "y"]), ("Third", ["p", "q"]), ("Fourth", ["r", "s"])])
    shown_and_vote(store, "ann", [0, 1])
    skipped = shown_and_vote(store, "ann", choice="skip").vote
    assert store.labeller_progress("ann", 1, quota=2) == {
        "votes": 2,
        "left": 1,
        "quota": 2,
        "judged": 1,
    }
    shown_and_vote(store, "ann", choice="bad")  # a judgment, as a tie is
    assert store.next_task("ann", 1, quota=2) is None
    assert store.labeller_progress("ann", 1, quota=2)["left"] == 0
    assert store.next_task("ann", 1) is not None  # no quota: the fourth task
    assert store.next_task("bob", 1, quota=2).task.id == skipped.task_id  # others go on
    # A vote taken back is judged no more: its task comes again within the quota.
    store.record_vote("ann", new_id(), 4, "skip")
    reopened = store.reopen_last("ann")
    assert store.next_task("ann", 1, quota=2).task.id == reopened.task_id


def test_a_disabled_labeller_is_signed_out_and_their_open_task_goes_back(store):
    store.add_tasks([PAIR])
    secret, _ = store.sign_in(name="eve")
    assert store.next_task("eve", 1).task.id == 1
    store.set_disabled("eve")
    assert store.labeller_of(secret) is None
    for spelling in ("eve", "Eve", "EVE ", "ｅｖｅ"):  # one labeller, however spelt
        with pytest.raises(LoginError, match="eve may no longer sign in"):
            store.sign_in(name=spelling)
    assert store.next_task("ann", 1).task.id == 1  # eve's unanswered task is free again
    assert store.labellers()["eve"] is True and store.labellers()["ann"] is False
    store.set_disabled("Eve", False)
    assert store.labeller_of(store.sign_in(name="EVE")[0]) == "eve"
    assert [name for name in store.labellers() if name.casefold() == "eve"] == ["eve"]
    with pytest.raises(LoginError, match="no labeller 'zed'"):
        store.set_disabled("zed")


def test_a_labeller_can_take_back_their_latest_votes_and_vote_again(store):
    store.add_tasks([PAIR, ("Second", ["x", "y"]), ("Third", ["p", "q"])])
    first = shown_and_vote(store, "ann", [0, 1]).vote
    second = shown_and_vote(store, "ann", choice="tie").vote
    assert store.next_task("ann", 1).task.id == 3  # shown, not answered yet
    assert store.reopen_last("ann") == second
    assert store.next_task("ann", 1).task.id == 2  # the task taken back comes first
    again = store.record_vote("ann", new_id(), 2, "rank", [1, 0]).vote
    assert [v.id for v in store.votes()] == [first.id, again.id]
    assert store.reopen_last("ann") == again and store.reopen_last("ann") == first
    assert store.reopen_last("ann") is None and store.reopen_last("bob") is None
    assert store.next_task("ann", 1).task.id == 1


def test_a_database_of_schema_1_is_brought_up_to_date(tmp_path):
    path = tmp_path / "old.db"
    Store(path, create=True).close()
    db = sqlite3.connect(path)  # back to schema 1: no `disabled`, no "bad" choice
    db.execute("ALTER TABLE labellers DROP COLUMN disabled")
    for table in ("replaced_votes", "assignments", "decisions", "settings"):  # schema 3's
        db.execute(f"DROP TABLE {table}")
    db.execute("ALTER TABLE tasks DROP COLUMN gold")
    db.execute("ALTER TABLE tasks DROP COLUMN overlap")
    db.execute("DROP TABLE votes")
    db.execute(V1_VOTES)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO labellers (name, created) VALUES ('ann', 0)")
    db.execute("INSERT INTO tasks VALUES (1, '\"p\"', '[\"a\", \"b\"]', 2, 'd', 0)")
    db.execute("INSERT INTO shown VALUES (1, 'ann', '[0, 1]', 0)")
    db.execute("INSERT INTO votes VALUES ('old', 1, 'ann', 'tie', NULL, 3, 'ok', 0)")
    db.commit()
    with pytest.raises(sqlite3.IntegrityError):  # schema 1 knows no "bad"
        db.execute("UPDATE votes SET choice = 'bad'")
    db.close()
    store = Store(path)
    assert store.labellers() == {"ann": False}
    (old,) = store.votes()
    assert (old.id, old.choice, old.rating, old.flag) == ("old", "tie", 3, "ok")
    store.sign_in(name="bob")
    store.next_task("bob", 2)
    assert store.record_vote("bob", new_id(), 1, "bad").vote.choice == "bad"
    store.set_disabled("ann")
    assert store.labellers() == {"ann": True, "bob": False}
    assert store.reopen_last("bob").choice == "bad"  # schema 3: the vote is kept
    assert [v.choice for v in store.replaced_votes()] == ["bad"]
    store.close()


V1_VOTES = """CREATE TABLE votes (
    id TEXT PRIMARY KEY, task_id INTEGER NOT NULL, labeller TEXT NOT NULL,
    choice TEXT NOT NULL CHECK (choice IN ('rank', 'tie', 'skip')), ranking TEXT,
    rating INTEGER CHECK (rating BETWEEN 1 AND 7), flag TEXT, created REAL NOT NULL,
    UNIQUE (task_id, labeller), FOREIGN KEY (task_id, labeller) REFERENCES shown (task_id, labeller)
)"""


def test_a_task_id_beyond_sqlite_integers_is_no_task(store):
    store.add_tasks([PAIR])
    for task_id in (10**30, -(10**30), 2**63):
        with pytest.raises(VoteError, match="no task") as info:
            store.record_vote("ann", new_id(), task_id, "skip")
        assert info.value.status == 404
    nested: list = []
    for _ in range(500):
        nested = [nested]
    with pytest.raises(VoteError) as info:
        store.record_vote("ann", nested, 1, "skip")
    assert info.value.status == 422 and len(str(info.value)) < 200


# ----------------------------------------------------------------------------- agreement
def vote(task, labeller, label, k=2):
    """A vote from a pairwise label: "i" = response 0 first, "j" = response 1 first."""
    if label == "tie":
        return Vote(new_id(), task, labeller, k, "tie", None, None, None, 0.0)
    ranking = [0, 1] if label == "i" else [1, 0]
    return Vote(new_id(), task, labeller, k, "rank", ranking, None, None, 0.0)


def test_all_bad_prefers_no_response_as_a_tie_does():
    bad = Vote(new_id(), 1, "ann", 3, "bad", None, 1, "nonsense", 0.0)
    assert pair_labels(bad) == {(0, 1): "tie", (0, 2): "tie", (1, 2): "tie"}
    assert majority_ranking(3, [rank_vote(1, "bob", [0, 1, 2], 3), bad]) is None


def test_cohen_kappa_of_a_textbook_table():
    # 50 items: both yes 20, both no 15, a yes b no 5, a no b yes 10 (Wikipedia's example):
    # p_o = 35/50 = 0.7, p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5, kappa = 0.2 / 0.5 = 0.4.
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert raw_agreement(a, b) == pytest.approx(0.7)
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa(["i", "i"], ["i", "i"]) is None  # p_e = 1: undefined


def test_agreement_of_two_labellers_by_hand():
    a = ["i", "i", "j", "j", "i", "tie", "i", "j", "j", "i"]
    b = ["i", "j", "j", "j", "i", "i", "i", "j", "i", "i"]
    # 7 of 10 agree; a: i 5, j 4, tie 1; b: i 6, j 4, tie 0 -> p_e = (30 + 16) / 100 = 0.46;
    # kappa = (0.7 - 0.46) / (1 - 0.46) = 4/9.
    votes = [vote(t, "a", x) for t, x in enumerate(a)] + [vote(t, "b", x) for t, x in enumerate(b)]
    votes.append(vote(99, "a", "skip"))  # a skip judges nothing
    result = agreement(votes)
    assert (result.tasks, result.items) == (10, 10)
    assert result.agreement == pytest.approx(0.7)
    assert result.kappa == pytest.approx(4 / 9)
    assert [p.labellers for p in result.pairs] == [("a", "b")]


def test_rankings_agree_on_their_induced_pairs():
    ranking = Vote(new_id(), 1, "a", 3, "rank", [2, 0, 1], None, None, 0.0)
    assert pair_labels(ranking) == {(0, 1): "i", (0, 2): "j", (1, 2): "j"}
    tie = Vote(new_id(), 1, "b", 3, "tie", None, None, None, 0.0)
    assert pair_labels(tie) == {(0, 1): "tie", (0, 2): "tie", (1, 2): "tie"}
    other = Vote(new_id(), 1, "c", 3, "rank", [0, 2, 1], None, None, 0.0)  # (0,2) differs
    result = agreement([ranking, tie, other])
    # a-b: 0 of 3 agree, a-c: 2 of 3, b-c: 0 of 3 -> 2 of 9 overall.
    assert result.items == 9 and result.agreement == pytest.approx(2 / 9)
    a_c = next(p for p in result.pairs if p.labellers == ("a", "c"))
    assert a_c.agreement == pytest.approx(2 / 3)
    # a: i, j, j; c: i, i, j -> p_e = (1 * 2 + 2 * 1) / 9 = 4/9, kappa = (6/9 - 4/9) / (5/9).
    assert a_c.kappa == pytest.approx(0.4)
    assert agreement([ranking]).agreement is None  # nobody to agree with


# -------------------------------------------------------------------------------- export
def rank_vote(task, labeller, ranking, k):
    return Vote(new_id(), task, labeller, k, "rank", ranking, None, None, 0.0)


def test_majority_ranking():
    def votes(*rankings):
        return [rank_vote(1, f"l{i}", r, len(r)) for i, r in enumerate(rankings)]

    assert majority_ranking(2, votes([1, 0], [1, 0], [0, 1])) == [1, 0]
    assert majority_ranking(2, votes([1, 0], [0, 1])) is None  # 1 of 2 is no majority
    assert majority_ranking(2, [*votes([1, 0]), vote(1, "x", "tie")]) is None
    assert majority_ranking(2, [*votes([1, 0], [1, 0]), vote(1, "x", "tie")]) == [1, 0]
    assert majority_ranking(3, votes([0, 1, 2], [0, 2, 1], [1, 0, 2])) == [0, 1, 2]
    assert majority_ranking(3, votes([0, 1, 2], [1, 2, 0], [2, 0, 1])) is None  # a cycle


def test_export_writes_what_rm_and_dpo_read_and_counts_ties_and_skips(tmp_path, store):
    store.add_tasks([PAIR, RANK, ("Third", ["p", "q"])])
    shown_and_vote(store, "ann", [1, 0], labels_per_task=2, rating=5, flag="nonsense")
    shown_and_vote(store, "bob", [1, 0], labels_per_task=2)  # both on task 1
    shown_and_vote(store, "ann", [2, 0, 3, 1], labels_per_task=2)
    shown_and_vote(store, "bob", choice="tie", labels_per_task=2)  # task 2
    shown_and_vote(store, "ann", choice="skip", labels_per_task=2)  # task 3
    out = run_export(ExportConfig(db=str(store.path), out=str(tmp_path / "prefs.jsonl")))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [1, 1, 2]
    assert rows[0]["chosen"] == "Hello there." and rows[0]["rejected"] == "Hi!"
    assert (rows[0]["ratings"], rows[0]["flags"], rows[0]["labellers"]) == (
        [5],
        ["nonsense"],
        ["ann"],
    )
    assert rows[2]["ranking"] == [2, 0, 3, 1] and rows[2]["responses"] == RANK[1]
    records = load_records(out, "comparisons")
    assert records[0] == Comparison("Say hi.", "Hello there.", "Hi!")
    assert records[2] == Ranking(RANK[0], RANK[1], [2, 0, 3, 1])
    summary = json.loads(summary_path(out).read_text())
    assert summary["records"] == 3 and summary["left_out"] == {"tie": 1, "bad": 0, "skip": 1}
    assert summary["agreement"]["items"] == 1 + 6  # task 1's pair, task 2's six pairs
    assert summary["agreement"]["agreement"] == pytest.approx(1 / 7)


def test_flags_and_ratings_given_with_ties_and_skips_reach_the_export_and_its_summary(
    tmp_path, store
):
    store.add_tasks([PAIR, RANK, ("Third", ["p", "q"])])
    shown_and_vote(store, "ann", [1, 0], labels_per_task=2, rating=6)
    shown_and_vote(store, "bob", choice="tie", labels_per_task=2, rating=4, flag="harmful")
    shown_and_vote(store, "ann", choice="bad", labels_per_task=2, rating=2)  # task 2: no record
    shown_and_vote(store, "bob", choice="skip", labels_per_task=2, flag="private information")
    shown_and_vote(store, "ann", choice="skip", labels_per_task=2, rating=1, flag="nonsense")
    out = run_export(ExportConfig(db=str(store.path), out=str(tmp_path / "prefs.jsonl")))
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["task_id"] == 1 and row["ratings"] == [6] and row["skips"] == row["bad"] == []
    (tie,) = row["ties"]
    assert (tie["labeller"], tie["rating"], tie["flag"]) == ("bob", 4, "harmful")
    assert load_records(out, "comparisons") == [Comparison("Say hi.", "Hello there.", "Hi!")]
    summary = json.loads(summary_path(out).read_text())
    assert summary_path(out) == tmp_path / "prefs.jsonl.summary.json"
    assert summary["flags"] == {
        "rank": {},
        "tie": {"harmful": 1},
        "bad": {},
        "skip": {"private information": 1, "nonsense": 1},
    }
    assert summary["ratings"] == {
        "rank": {"6": 1},
        "tie": {"4": 1},
        "bad": {"2": 1},
        "skip": {"1": 1},
    }
    assert summary["left_out"] == {"tie": 1, "bad": 1, "skip": 2}
    flagged = {(f["task_id"], f["choice"], f["labeller"], f["flag"]) for f in summary["flagged"]}
    assert flagged == {
        (1, "tie", "bob", "harmful"),
        (2, "skip", "bob", "private information"),
        (3, "skip", "ann", "nonsense"),
    }
    # Task 2 makes no record: its "all bad" vote and skip are traceable to it all the same.
    assert summary["tasks_by_choice"] == {"tie": [1], "bad": [2], "skip": [2, 3]}
    votes = [json.loads(line) for line in votes_path(out).read_text().splitlines()]
    assert votes_path(out) == tmp_path / "prefs.jsonl.votes.jsonl" and len(votes) == 5
    (bad,) = [v for v in votes if v["choice"] == "bad"]
    assert (bad["task_id"], bad["labeller"], bad["rating"]) == (2, "ann", 2)
    assert bad["prompt"] == RANK[0] and bad["responses"] == RANK[1] and bad["seconds"] >= 0


WRITTEN_BESIDE = ("summary.json", "votes.jsonl")
NONE_DECIDED = {
    "decided_without_preference": 0
}  # no admin decision left a task out  # what an export writes beside its records


@pytest.mark.parametrize("fmt, name", [("parquet", "prefs.parquet"), ("dataset", "prefs")])
def test_export_as_parquet_and_a_dataset_folder_holds_what_jsonl_does(tmp_path, store, fmt, name):
    """The same records, flags, ratings, ties, "all bad" and skips a column each, read by
    `load_records` (what `rlhfkit rm` and `rlhfkit dpo` load) as the JSON Lines are."""
    store.add_tasks([PAIR, ("Count.", ["one", "two", "three"]), ("Third", ["p", "q"])])
    shown_and_vote(store, "ann", [1, 0], labels_per_task=2, rating=6, flag="nonsense")
    shown_and_vote(store, "bob", choice="tie", labels_per_task=2, rating=4, flag="harmful")
    shown_and_vote(store, "ann", [2, 0, 1], labels_per_task=2)
    shown_and_vote(store, "bob", choice="bad", labels_per_task=2, rating=1)
    shown_and_vote(store, "ann", choice="skip", labels_per_task=2, flag="private information")
    db = str(store.path)
    jsonl = run_export(ExportConfig(db=db, out=str(tmp_path / "prefs.jsonl")))
    out = run_export(ExportConfig(db=db, out=str(tmp_path / name), format=fmt))
    assert out == tmp_path / name and (out.is_file() if fmt == "parquet" else out.is_dir())
    assert summary_path(out) == tmp_path / f"{name}.summary.json" != summary_path(jsonl)
    assert (
        load_records(out, "comparisons")
        == load_records(jsonl, "comparisons")
        == [
            Comparison("Say hi.", "Hello there.", "Hi!"),
            Ranking("Count.", ["one", "two", "three"], [2, 0, 1]),
        ]
    )
    if fmt == "parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(out).to_pylist()
    else:
        import datasets

        rows = datasets.load_from_disk(str(out)).to_list()
    expected = [json.loads(line) for line in jsonl.read_text().splitlines()]
    absent = {"chosen": None, "rejected": None, "responses": None, "ranking": None}
    assert rows == [{**absent, **row} for row in expected]
    tie, bad = rows[0]["ties"][0], rows[1]["bad"][0]
    assert (tie["labeller"], tie["rating"], tie["flag"]) == ("bob", 4, "harmful")
    assert (bad["labeller"], bad["rating"], rows[0]["ratings"]) == ("bob", 1, [6])
    run_export(ExportConfig(db=db, out=str(out), format=fmt))  # again: replaced whole
    assert load_records(out, "comparisons") == load_records(jsonl, "comparisons")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["labels.db", "labels.db-shm", "labels.db-wal", "prefs.jsonl", name]
        + [f"{each}.{kind}" for each in ("prefs.jsonl", name) for kind in WRITTEN_BESIDE]
    )
    summaries = [json.loads(summary_path(each).read_text()) for each in (jsonl, out)]
    assert summaries[0] == summaries[1]  # each export its own, the same


def test_a_table_needs_prompts_of_one_kind(tmp_path, store):
    store.add_tasks([PAIR, RANK])
    shown_and_vote(store, "ann", [1, 0])
    shown_and_vote(store, "ann", [3, 2, 1, 0])
    out = str(tmp_path / "prefs.parquet")
    with pytest.raises(UsageError, match="export them as JSON Lines"):
        run_export(ExportConfig(db=str(store.path), out=out, format="parquet"))
    store.reopen_last("ann")  # the chat prompt's vote: strings only
    run_export(ExportConfig(db=str(store.path), out=out, format="parquet"))
    assert load_records(out, "comparisons") == [Comparison("Say hi.", "Hello there.", "Hi!")]


def test_export_by_majority_writes_one_record_per_task(store):
    store.add_tasks([PAIR, ("Second", ["x", "y"])])
    for name, order in [("ann", [1, 0]), ("bob", [1, 0]), ("cat", [0, 1])]:
        shown_and_vote(store, name, order, labels_per_task=3)
    shown_and_vote(store, "ann", [0, 1], labels_per_task=3)  # task 2: one each way
    shown_and_vote(store, "bob", [1, 0], labels_per_task=3)
    records, summary = export_records(store.tasks(), store.votes(), "majority")
    assert len(records) == 1
    assert records[0]["chosen"] == "Hello there." and records[0]["labellers"] == [
        "ann",
        "bob",
        "cat",
    ]
    assert summary["left_out"] == {"tie": 0, "bad": 0, "skip": 0, "no_majority": 1, **NONE_DECIDED}


def test_export_config_checks_its_fields():
    """A usage error (exit 2) as every config's, raised without rlhfkit.config (torch)."""
    with pytest.raises(UsageError, match="ExportConfig.aggregate = 'mean' is not allowed"):
        ExportConfig(aggregate="mean")
    with pytest.raises(UsageError, match="ExportConfig.out = 'x.csv'"):
        ExportConfig(out="x.csv")
    with pytest.raises(UsageError, match=r"expected a .parquet file path \(format 'parquet'\)"):
        ExportConfig(out="x.jsonl", format="parquet")
    with pytest.raises(UsageError, match="expected a folder path"):
        ExportConfig(out="x.parquet", format="dataset")
    with pytest.raises(UsageError, match="ExportConfig.format = 'csv' is not allowed"):
        ExportConfig(format="csv")
    assert ExportConfig(out="runs/prefs", format="dataset").format == "dataset"
