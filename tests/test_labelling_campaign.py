"""Labelling: what a lead steers (`campaign.py`) on a real SQLite database: tasks given to named
labellers with an overlap of their own, pausing, check tasks and each labeller's accuracy on
them, the review queue and the admin's decision, which the export carries."""

import json
import subprocess
import sys

import pytest

from helpers import run_light_command, write_jsonl
from rlhfkit.config import ConfigError
from rlhfkit.labelling.campaign import Campaign
from rlhfkit.labelling.export import ExportConfig, export_records, run_export, votes_path
from rlhfkit.labelling.prepare import PrepareConfig, run_prepare
from rlhfkit.labelling.store import Store, VoteError
from test_labelling_store import PAIR, RANK, new_id, shown_and_vote

TASKS = [PAIR, ("Second", ["x", "y"]), ("Third", ["p", "q"]), RANK]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "labels.db", create=True)
    for name in ("ann", "bob", "cat"):
        s.sign_in(name=name)
    s.add_tasks(TASKS)
    yield s
    s.close()


def given(store, labeller, labels_per_task=1):
    """The ids of the tasks `labeller` is given, answering each with a tie until none is left."""
    ids = []
    while (shown := store.next_task(labeller, labels_per_task)) is not None:
        ids.append(shown.task.id)
        store.record_vote(labeller, new_id(), shown.task.id, "tie")
    return ids


def test_assigned_tasks_go_to_their_labellers_only_with_their_own_overlap(store):
    campaign = Campaign(store)
    campaign.assign([1], ["ann", "bob"], overlap=2)
    campaign.assign([2], ["ann"])
    assert campaign.assigned() == {"ann": 2, "bob": 1}
    assert given(store, "cat") == [3, 4]  # 1 and 2 are not hers
    assert given(store, "ann") == [1, 2]
    assert given(store, "bob") == [1]  # task 1 needs two votes, though labels_per_task is 1
    assert store.labeller_progress("cat", 1)["left"] == 0
    assert store.counts(1)["tasks_done"] == 4
    with pytest.raises(VoteError, match="no task 9"):
        campaign.assign([9], ["ann"])


def test_tasks_in_turn_give_each_labeller_as_many(store):
    given_to = Campaign(store).assign_in_turn([1, 2, 3, 4], ["ann", "bob", "cat"], overlap=2)
    assert given_to == {"ann": [1, 2, 4], "bob": [1, 3, 4], "cat": [2, 3]}
    assert Campaign(store).unassigned_share(1.0, seed=0) == []
    with pytest.raises(ValueError, match="overlap 4"):
        Campaign(store).assign_in_turn([1], ["ann", "bob", "cat"], overlap=4)


def test_a_paused_campaign_gives_no_new_task_and_resumes(store):
    campaign = Campaign(store)
    held = store.next_task("ann", 1).task.id
    campaign.set_paused(True)
    assert campaign.paused() and store.next_task("bob", 1) is None
    assert store.next_task("ann", 1).task.id == held  # a task already given stays theirs
    campaign.set_paused(False)
    assert store.next_task("bob", 1) is not None


def test_check_tasks_reach_everyone_and_score_each_labeller(store):
    campaign = Campaign(store)
    campaign.set_gold(4, [0, 1, 2, 3])  # "one, two, three, four": the known order
    assert campaign.gold() == {4: [0, 1, 2, 3]}
    for name, order in (("ann", [0, 1, 2, 3]), ("bob", [1, 0, 2, 3]), ("cat", None)):
        while (shown := store.next_task(name, 1)) is not None and shown.task.id != 4:
            store.record_vote(name, new_id(), shown.task.id, "skip")
        assert shown is not None, f"{name} was never given the check task"
        if order is None:
            store.record_vote(name, new_id(), 4, "tie")
        else:
            store.record_vote(name, new_id(), 4, "rank", [shown.display.index(i) for i in order])
    accuracy = campaign.accuracy()
    assert accuracy["ann"] == {"tasks": 1, "judgments": 6, "correct": 6, "accuracy": 1.0}
    assert accuracy["bob"]["correct"] == 5 and accuracy["cat"]["accuracy"] == 0.0
    with pytest.raises(VoteError, match="not an order"):
        campaign.set_gold(1, [0, 0])


def test_the_review_queue_holds_disagreements_until_the_admin_decides(store, tmp_path):
    campaign = Campaign(store)
    shown_and_vote(store, "ann", [0, 1], labels_per_task=2, flag="typo")
    shown_and_vote(store, "bob", [1, 0], labels_per_task=2)  # task 1: they disagree
    shown_and_vote(store, "ann", [0, 1], labels_per_task=2)
    shown_and_vote(store, "bob", [0, 1], labels_per_task=2)  # task 2: they agree
    assert campaign.review_queue() == [1]
    rows = campaign.task_rows(show="review")
    assert [r["task"].id for r in rows] == [1] and rows[0]["disagree"]
    assert [r["task"].id for r in campaign.task_rows(show="flagged")] == [1]
    assert [r["task"].id for r in campaign.task_rows(labeller="bob")] == [1, 2]
    campaign.decide(1, "rank", [1, 0], note="B answers", as_gold=True)
    assert campaign.review_queue() == [] and campaign.gold() == {1: [1, 0]}
    decided = campaign.decisions()
    records, summary = export_records(store.tasks(), store.votes(), "majority", decided)
    assert [r["chosen"] for r in records] == ["Hello there.", "x"]  # the decision's order
    assert records[0]["decision"] == {"choice": "rank", "ranking": [1, 0], "note": "B answers"}
    assert summary["decided"] == 1 and records[1]["decision"] is None
    campaign.decide(1, "discard")
    records, summary = export_records(
        store.tasks(), store.votes(), "majority", campaign.decisions()
    )
    assert [r["task_id"] for r in records] == [2]
    assert summary["left_out"]["decided_without_preference"] == 1
    out = run_export(ExportConfig(db=str(store.path), out=str(tmp_path / "prefs.jsonl")))
    rows = [json.loads(line) for line in votes_path(out).read_text().splitlines()]
    assert {r["decision"]["choice"] for r in rows if r["task_id"] == 1} == {"discard"}
    assert {r["gold"] == [1, 0] for r in rows if r["task_id"] == 1} == {True}
    with pytest.raises(VoteError, match="only it, takes a ranking"):
        campaign.decide(2, "tie", [0, 1])


def test_label_assign_from_the_command_line_loads_no_ml_library(store):
    store.close()
    code, torch_loaded, _, log = run_light_command(
        ["label", "assign", "--db", str(store.path), "--labellers", "[ann, bob]",
         "--share", "0.5", "--overlap", "2"]
    )  # fmt: skip
    assert (code, torch_loaded) == (0, False), log[-2000:]
    assert "ann: 2 tasks" in log and "2 tasks assigned, each to 2 of 2" in log
    again = Store(store.path)
    assert Campaign(again).assigned() == {"ann": 2, "bob": 2}
    assigned = Campaign(again).assignments()
    assert len(assigned) == 2 and all(names == ["ann", "bob"] for names in assigned.values())
    assert given(again, "cat") == [i for i in (1, 2, 3, 4) if i not in assigned]
    again.close()
    bad = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", "label", "assign", "--db", str(store.path),
         "--labellers", "[ann]", "--overlap", "2"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "overlap" in bad.stderr


def test_check_tasks_come_from_a_file_of_known_answers(tmp_path):
    known = write_jsonl(
        tmp_path / "known.jsonl",
        [
            {"prompt": "2 + 2?", "chosen": "4", "rejected": "5"},
            {"prompt": "Count.", "responses": ["two", "one", "three"], "ranking": [1, 0, 2]},
        ],
    )
    db = tmp_path / "labels.db"
    run_prepare(PrepareConfig(db=str(db), check_tasks=str(known)))
    run_prepare(PrepareConfig(db=str(db), check_tasks=str(known)))  # again: nothing new
    store = Store(db)
    assert Campaign(store).gold() == {1: [0, 1], 2: [1, 0, 2]}
    assert [t.responses for t in store.tasks().values()] == [["4", "5"], ["two", "one", "three"]]
    store.close()
    with pytest.raises(ConfigError, match="or `check_tasks` alone"):
        PrepareConfig(db=str(db))
