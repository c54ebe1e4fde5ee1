"""Labelling: the web app over HTTP (Starlette's test client), and `rlhfkit label prepare` /
`export` on files and a tiny model."""

import errno
import json
import re
import uuid

import pytest
from starlette.testclient import TestClient

from helpers import write_jsonl
from rlhfkit.cli import main
from rlhfkit.data import PromptRecord, encode_prompts, load_records
from rlhfkit.errors import UsageError
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.interact.sampling import sample_responses
from rlhfkit.labelling import export as export_module
from rlhfkit.labelling import prepare as prepare_module
from rlhfkit.labelling.app import create_app
from rlhfkit.labelling.guidelines import read_guidelines, render_guidelines
from rlhfkit.labelling.prepare import PrepareConfig, run_prepare
from rlhfkit.labelling.serve import ServeConfig
from rlhfkit.labelling.store import Store
from rlhfkit.models.loading import load_causal_lm, load_tokenizer

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)> **bold** \x1b[2J\u202eevil"
TASKS = [
    ("Say hi.", ["Hi!", "Hello there."]),
    ("Which is safe?", [HOSTILE, "A plain answer."]),
    ([{"role": "user", "content": "Count <b>up</b>."}], ["one", "two", "three", "four"]),
]


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.db"
    store = Store(path, create=True)
    store.add_tasks(TASKS)
    store.close()
    return path


ADMIN = "the-admin-token"
LOCAL = "http://127.0.0.1:8000"  # a host the app answers to (TestClient's own is not)


@pytest.fixture
def client(db):
    with TestClient(create_app(db, labels_per_task=2, admin_token=ADMIN), base_url=LOCAL) as c:
        yield c


@pytest.fixture
def admin(client):
    """A second client of the same app, signed in as the admin."""
    with TestClient(client.app, base_url=LOCAL) as c:
        assert c.post("/api/login", json={"token": ADMIN}).json() == {"admin": True}
        yield c


def sign_in(client, name):
    response = client.post("/api/login", json={"name": name})
    assert response.status_code == 200, response.text
    return response


def vote(client, task, choice="rank", order=None, vote_id=None, **extra):
    body = {"id": vote_id or str(uuid.uuid4()), "task": task, "choice": choice, "order": order}
    return client.post("/api/votes", json={**body, **extra})


# ----------------------------------------------------------------------------- the pages
def test_pages_lead_from_sign_in_to_a_task(client):
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login"
    page = client.get("/login").text
    assert 'name="name"' in page and 'name="token"' in page
    response = client.post("/login", data={"name": "ann"}, follow_redirects=False)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = client.get("/").text
    assert 'id="task" data-task="1" data-k="2"' in page
    assert "Signed in as <b>ann</b>" in page and "<b>0</b> votes by you" in page
    assert '<script src="/static/label.js"></script>' in page
    assert client.get("/static/label.js").status_code == 200


def test_a_bad_sign_in_says_why(client):
    response = client.post("/login", data={"name": "  "})
    assert response.status_code == 401 and "a name is 1 to 40 printable characters" in response.text
    response = client.post("/api/login", json={"token": "nope"})
    assert response.status_code == 401 and response.json() == {"error": "unknown token"}


def test_model_text_is_shown_inert_in_pages_and_json(client):
    sign_in(client, "ann")
    task = client.get("/api/next").json()["task"]
    vote(client, task["id"], "skip")
    page = client.get("/").text  # task 2, the hostile one
    assert 'data-task="2"' in page
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    assert '**bold** <span class="ctrl" title="U+001B">\\x1b</span>[2J' in page  # as typed
    assert '<span class="ctrl" title="U+202E">\\u202e</span>evil' in page
    assert "\x1b" not in page and "\u202e" not in page
    shown = client.get("/api/next").json()["task"]
    assert shown["id"] == 2
    assert HOSTILE.replace("\x1b", "\\x1b").replace("\u202e", "\\u202e") in shown["responses"]
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"


def test_joiners_and_marks_reach_the_labeller_as_written(tmp_path):
    """What a user would see: a family emoji and a Persian word whole, LRM and RLM as they
    are; only what deceives (here a right-to-left override) is shown as its escape."""
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"
    marks = "10\u200e$ \u05e9\u05dc\u05d5\u05dd\u200f!"
    path = tmp_path / "l.db"
    store = Store(path, create=True)
    store.add_tasks([(f"Say {persian}", [f"{family} {marks}", "x\u202eevil"])])
    store.close()
    with TestClient(create_app(path), base_url=LOCAL) as client:
        sign_in(client, "ann")
        page = client.get("/").text
        task = client.get("/api/next").json()["task"]
    assert f"Say {persian}" in page and f"{family} {marks}" in page
    assert "\\u200d" not in page and "\\u200c" not in page
    assert '<span class="ctrl" title="U+202E">\\u202e</span>evil' in page
    assert task["prompt"][0]["content"] == f"Say {persian}"
    assert sorted(task["responses"]) == sorted([f"{family} {marks}", "x\\u202eevil"])


def test_a_chat_prompt_shows_each_turn_escaped(client):
    sign_in(client, "ann")
    for _ in range(2):
        task = client.get("/api/next").json()["task"]
        vote(client, task["id"], "skip")
    page = client.get("/").text
    assert 'data-k="4"' in page and '<div class="role">user</div>' in page
    assert "Count &lt;b&gt;up&lt;/b&gt;." in page
    assert page.count('class="response rankable"') == 4


# ------------------------------------------------------------------------------- the API
def test_votes_are_idempotent_and_progress_counts_them(client):
    sign_in(client, "ann")
    task = client.get("/api/next").json()["task"]
    assert task["id"] == 1 and task["k"] == 2 and len(task["responses"]) == 2
    vote_id = str(uuid.uuid4())
    first = vote(client, 1, order=[1, 0], vote_id=vote_id, rating=7, flag=" harmful ")
    assert first.status_code == 201, first.text
    stored = first.json()["vote"]
    shown_first, shown_second = task["responses"]
    assert stored["ranking"] == [TASKS[0][1].index(shown_second), TASKS[0][1].index(shown_first)]
    assert (stored["rating"], stored["flag"]) == (7, "harmful")
    retry = vote(client, 1, order=[1, 0], vote_id=vote_id, rating=7, flag=" harmful ")
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    assert retry.json()["vote"] == stored
    assert first.json()["progress"] == {"votes": 1, "left": 2}
    conflict = vote(client, 1, order=[0, 1])
    assert conflict.status_code == 409 and "already voted on task 1" in conflict.json()["error"]
    mine = client.get("/api/progress").json()
    assert mine == {
        "labeller": "ann",
        "progress": {"votes": 1, "left": 2, "rank": 1, "tie": 0, "bad": 0, "skip": 0},
    }


def test_the_vote_maps_display_slots_to_responses(client):
    sign_in(client, "ann")
    task = client.get("/api/next").json()["task"]
    best = task["responses"][1]  # the one shown second
    vote(client, task["id"], order=[1, 0])
    assert Store(client.app.state.store.path).votes()[0].ranking[0] == TASKS[0][1].index(best)


@pytest.mark.parametrize(
    "request_kwargs, status, error",
    [
        (
            {"content": b"{}", "headers": {"content-type": "text/plain"}},
            415,
            "send application/json",
        ),
        (
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "not JSON",
        ),
        ({"json": [1, 2]}, 422, "not a JSON object"),
        ({"json": {"task": "1"}}, 422, "task '1' is not a task id"),
        ({"json": {"task": 1, "id": "x", "choice": "skip"}}, 422, "is not a UUID"),
        (
            {"json": {"task": 1}, "headers": {"origin": "http://evil.example"}},
            403,
            "cross-origin request refused",
        ),
    ],
)
def test_bad_vote_requests_get_a_clear_error(client, request_kwargs, status, error):
    sign_in(client, "ann")
    client.get("/api/next")
    response = client.post("/api/votes", **request_kwargs)
    assert response.status_code == status and error in response.json()["error"]


def test_the_progress_page_before_anyone_agrees(client, admin):
    assert client.get("/progress", follow_redirects=False).status_code == 303  # signed out
    page = admin.get("/progress").text
    assert "<b>0</b> of <b>3</b> tasks done" in page and "No votes yet." in page
    sign_in(client, "ann")
    vote(client, client.get("/api/next").json()["task"]["id"], "tie")
    page = admin.get("/progress").text
    assert "<b>0</b> of <b>3</b> tasks done" in page  # labels_per_task=2
    ann = '<td><a href="/progress/tasks?labeller=ann">ann</a></td>'
    assert ann + "<td>1</td><td>0</td><td>1</td><td>0</td><td>0</td>" in page
    assert "No task has been labelled by two people yet." in page


def test_a_labeller_changes_their_last_vote(client):
    sign_in(client, "ann")
    assert client.post("/api/votes/reopen").status_code == 404  # nothing to change yet
    assert "Change my last vote" not in client.get("/").text
    assert vote(client, 1, order=[0, 1]).status_code == 201
    page = client.get("/").text
    assert 'data-task="2"' in page and "Change my last vote" in page
    response = client.post("/reopen", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"
    page = client.get("/").text
    assert 'data-task="1"' in page and "<b>0</b> votes by you" in page
    assert vote(client, 1, "tie").status_code == 201
    taken = client.post("/api/votes/reopen").json()
    assert taken["vote"]["choice"] == "tie" and taken["progress"]["votes"] == 0


def test_a_changed_vote_is_kept_and_comes_back_as_the_tasks_previous(client, db):
    sign_in(client, "ann")
    display = client.get("/api/next").json()["task"]
    assert display["previous"] is None
    first = vote(client, 1, order=[1, 0], rating=6, flag="typo").json()["vote"]
    client.post("/api/votes/reopen")
    task = client.get("/api/next").json()["task"]
    assert task["id"] == 1 and task["responses"] == display["responses"]  # the same order
    assert task["previous"] == {"choice": "rank", "order": [1, 0], "rating": 6, "flag": "typo"}
    assert vote(client, 1, "tie").status_code == 201
    store = Store(db)
    (kept,) = store.replaced_votes()
    (now,) = store.votes()
    store.close()
    assert (kept.id, kept.ranking, kept.rating, kept.flag) == (
        first["id"],
        first["ranking"],
        6,
        "typo",
    )
    assert kept.replaced is not None and now.choice == "tie" and now.seconds >= 0


def test_the_sign_in_page_sends_the_signed_in_on(client, admin):
    sign_in(client, "ann")
    for who in (client, admin):  # Back to /login after a vote, or the address typed
        response = who.get("/login", follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/"
    client.post("/logout")
    assert 'name="name"' in client.get("/login").text


def test_the_admin_reviews_disagreements_and_decides(client, admin, db):
    with TestClient(client.app, base_url=LOCAL) as bob:
        sign_in(client, "ann")
        sign_in(bob, "bob")
        for who, best, extra in ((client, "Hi!", {"flag": "typo"}), (bob, "Hello there.", {})):
            task = who.get("/api/next").json()["task"]  # in an order shuffled for each
            assert task["id"] == 1
            first = task["responses"].index(best)
            assert vote(who, 1, order=[first, 1 - first], **extra).status_code == 201
        assert bob.get("/api/tasks").status_code == 403  # a labeller sees no one's votes
        assert bob.get("/progress/tasks", follow_redirects=False).status_code == 303
    assert (
        'href="/progress/tasks?show=review"><b>1</b> task to review' in admin.get("/progress").text
    )
    page = admin.get("/progress/tasks?show=review").text
    assert 'id="task-1"' in page and "disagreement" in page and "typo" in page
    (row,) = admin.get("/api/tasks?show=flagged").json()["tasks"]
    assert [(v["labeller"], v["flag"]) for v in row["votes"]] == [("ann", "typo"), ("bob", None)]
    assert sorted(v["order"] for v in row["votes"]) == [[1, 2], [2, 1]]  # their shuffles
    assert admin.get("/api/tasks?labeller=bob").json()["tasks"][0]["id"] == 1
    assert admin.get("/api/tasks?show=nothing").status_code == 422
    form = {"task": "1", "order": "2 > 1", "note": "B answers", "gold": "on", "choice": "rank"}
    referer = {"referer": LOCAL + "/progress/tasks?show=review"}
    response = admin.post("/progress/decisions", data=form, headers=referer, follow_redirects=False)
    assert response.headers["location"] == "/progress/tasks?show=review"
    assert "No task to show." in admin.get("/progress/tasks?show=review").text
    page = admin.get("/progress/tasks?show=decided").text
    assert "Decided: <b>2 &gt; 1</b> (B answers)" in page and "check task: 2 &gt; 1" in page
    bad = admin.post("/progress/decisions", data={**form, "order": "first"})
    assert bad.status_code == 422 and "response numbers best first" in bad.json()["error"]
    answer = admin.post("/api/decisions", json={"task": 2, "choice": "discard", "note": None})
    assert answer.json() == {
        "decision": {"choice": "discard", "ranking": None, "note": None},
        "task": 2,
    }
    assert admin.post("/api/decisions", json={"task": 99, "choice": "tie"}).status_code == 404
    assert client.post("/api/decisions", json={"task": 1, "choice": "tie"}).status_code == 403


def test_the_admin_pauses_and_resumes_the_labelling(client, admin):
    sign_in(client, "ann")
    assert client.post("/api/pause", json={"paused": True}).status_code == 403
    admin.post("/progress/pause", data={"action": "pause"})
    assert "Labelling is paused" in admin.get("/progress").text
    page = client.get("/").text
    assert 'id="paused"' in page and 'id="task"' not in page
    assert client.get("/api/next").json()["paused"] is True
    assert admin.post("/api/pause", json={"paused": "no"}).status_code == 422
    assert admin.post("/api/pause", json={"paused": False}).json() == {"paused": False}
    assert 'id="task"' in client.get("/").text


def test_the_admin_assigns_tasks_from_the_progress_page(client, admin, db):
    sign_in(client, "cat")
    for name in ("ann", "bob"):
        Store(db).sign_in(name=name)
    assert "<b>3</b> of 3 tasks are given to no one in particular" in admin.get("/progress").text
    form = {"share": "100", "overlap": "1", "labeller": ["ann", "bob"]}
    response = admin.post("/progress/assign", data=form, follow_redirects=False)
    assert response.status_code == 303
    assert "<b>0</b> of 3 tasks are given to no one in particular" in admin.get("/progress").text
    assert client.get("/api/next").json()["task"] is None  # all of them are ann's and bob's
    bad = admin.post("/progress/assign", data={**form, "share": "150"})
    assert bad.status_code == 422 and "at most 100" in bad.json()["error"]
    assert admin.post("/progress/assign", data={**form, "overlap": "x"}).status_code == 422
    assert client.post("/progress/assign", data=form).status_code == 403
    answer = admin.post("/api/assign", json={"labellers": ["cat"], "share": 1.0, "overlap": 1})
    assert answer.json() == {"assigned": {"cat": []}}  # none left to give
    assert admin.post("/api/assign", json={"labellers": "cat", "share": 1}).status_code == 422


def test_the_tasks_page_lists_a_large_campaign_a_page_at_a_time(tmp_path):
    store = Store(tmp_path / "big.db", create=True)
    store.add_tasks([(f"Prompt {i}", [f"a{i}", f"b{i}"]) for i in range(120)])
    store.sign_in(name="ann")
    while (shown := store.next_task("ann", 1)) is not None:
        store.record_vote("ann", str(uuid.uuid4()), shown.task.id, "tie")
    store.close()
    app = create_app(tmp_path / "big.db", admin_token=ADMIN)
    with TestClient(app, base_url=LOCAL) as admin:
        admin.post("/api/login", json={"token": ADMIN})
        page = admin.get("/progress/tasks").text
        assert page.count('class="task-row') == 50 and "Tasks 1 to 50 of <b>120</b>" in page
        assert 'href="/progress/tasks?labeller=&amp;show=all&amp;page=2" rel="next"' in page
        last = admin.get("/progress/tasks?labeller=ann&show=all&page=3").text
        assert last.count('class="task-row') == 20 and "Tasks 101 to 120 of <b>120</b>" in last
        assert 'rel="next"' not in last and 'page=2" rel="prev"' in last
        answer = admin.get("/api/tasks?page=3").json()
        assert (len(answer["tasks"]), answer["page"], answer["pages"], answer["total"]) == (
            20, 3, 3, 120,
        )  # fmt: skip
        assert admin.get("/api/tasks?page=0").status_code == 422


def test_the_tasks_page_shows_model_text_inert(client, admin):
    sign_in(client, "ann")
    for task in (1, 2):
        client.get("/api/next")
        vote(client, task, "bad", flag="<b>flag</b>")
    page = admin.get("/progress/tasks").text
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page
    assert "<b>flag</b>" not in page and "&lt;b&gt;flag&lt;/b&gt;" in page


def test_signed_out_clients_cannot_vote(client):
    assert client.get("/api/next").status_code == 401
    assert vote(client, 1, "skip").status_code == 401
    sign_in(client, "ann")
    client.post("/logout")
    assert client.get("/api/next").status_code == 401


def test_two_labellers_on_one_task_and_their_agreement(client, db):
    sessions = {}
    for name in ("ann", "bob"):
        with TestClient(client.app, base_url=LOCAL) as c:
            sign_in(c, name)
            task = c.get("/api/next").json()["task"]
            assert task["id"] == 1  # labels_per_task=2: both get task 1 first
            order = [task["responses"].index("Hello there."), task["responses"].index("Hi!")]
            assert vote(c, 1, order=order).status_code == 201
            sessions[name] = c.cookies
    client.post("/api/login", json={"token": ADMIN})
    overview = client.get("/api/progress").json()
    assert overview["tasks_done"] == 1
    assert overview["agreement"]["agreement"] == 1.0 and overview["agreement"]["kappa"] is None
    page = client.get("/progress").text
    assert "raw agreement <b>100.0%</b>" in page and "ann &amp; bob" in page


def test_a_labeller_sees_only_their_own_progress_and_the_admin_everyone(client, admin):
    """Labellers cannot read each other's votes: the live agreement would give them away."""
    sessions = {}
    for name in ("ann", "bob"):
        c = sessions[name] = TestClient(client.app, base_url=LOCAL)
        sign_in(c, name)
        task = c.get("/api/next").json()["task"]
        assert vote(c, task["id"], order=[0, 1]).status_code == 201
    page = sessions["ann"].get("/progress").text
    assert "Your progress" in page and "<b>1</b> vote by you" in page
    assert "bob" not in page and "agreement" not in page.lower()
    mine = sessions["bob"].get("/api/progress").json()
    assert mine["labeller"] == "bob" and mine["progress"]["votes"] == 1
    assert "ann" not in json.dumps(mine) and "agreement" not in mine
    overview = admin.get("/api/progress").json()
    assert sorted(overview["labellers"]) == ["ann", "bob"] and overview["agreement"]["items"] == 1
    assert admin.get("/", follow_redirects=False).headers["location"] == "/progress"
    page = admin.get("/progress").text
    assert "Signed in as <b>the admin</b>" in page and 'aria-label="Disable bob"' in page
    # Only the admin may disable; bob is signed out and cannot sign in again.
    refused = sessions["ann"].post("/progress/labellers", data={"name": "bob", "action": "disable"})
    assert refused.status_code == 403
    response = admin.post(
        "/progress/labellers", data={"name": "bob", "action": "disable"}, follow_redirects=False
    )
    assert response.status_code == 303
    assert sessions["bob"].get("/api/next").status_code == 401
    for spelling in ("bob", "Bob", " BOB", "ｂｏｂ"):  # not back under another spelling
        again = sessions["bob"].post("/api/login", json={"name": spelling})
        assert again.status_code == 401 and "bob may no longer sign in" in again.json()["error"]
    assert admin.get("/api/progress").json()["labellers"]["bob"]["disabled"] is True
    assert "Enable bob" in admin.get("/progress").text
    admin.post("/progress/labellers", data={"name": "bob", "action": "enable"})
    sign_in(sessions["bob"], "bob")
    assert client.post("/api/login", json={"token": "not-the-admin"}).status_code == 401
    for c in sessions.values():
        c.close()


# ------------------------------------------------------------------- guidelines, quotas
GUIDELINES = """# How to judge

Prefer the **honest** answer. See [the rubric](https://example.org/rubric).

<script>alert(1)</script> <img src=x onerror=alert(2)>

[bad](javascript:alert(3)) [data](data:text/html,<b>x</b>) [local](/progress)
![a picture](https://example.org/p.png)
"""


def test_guidelines_are_markdown_made_safe():
    html = str(render_guidelines(GUIDELINES))
    assert "<h1>How to judge</h1>" in html and "<strong>honest</strong>" in html
    assert (
        '<a href="https://example.org/rubric" rel="noopener noreferrer" target="_blank">'
        "the rubric</a>"
    ) in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &lt;img src=x onerror=alert(2)&gt;" in html
    assert "<script" not in html and "<img" not in html
    assert re.findall(r'href="([^"]*)"', html) == [
        "https://example.org/rubric",
        "https://example.org/p.png",  # an image is a link to it: the page loads nothing
    ]
    assert "[bad](javascript:alert(3))" in html and "[local](/progress)" in html


def test_guidelines_beside_every_task_and_on_their_own_page(db, tmp_path):
    path = tmp_path / "guidelines.md"
    path.write_text(GUIDELINES)
    app = create_app(db, admin_token=ADMIN, guidelines=read_guidelines(path))
    with TestClient(app, base_url=LOCAL) as c:
        assert c.get("/guidelines", follow_redirects=False).headers["location"] == "/login"
        sign_in(c, "ann")
        page = c.get("/").text
        assert '<details class="guidelines" id="guidelines">' in page
        assert "<summary>Guidelines</summary>" in page and "<h1>How to judge</h1>" in page
        assert '<a href="/guidelines">Guidelines</a>' in page  # and in the header
        page = c.get("/guidelines").text
        assert 'id="guidelines-page"' in page and "<strong>honest</strong>" in page
        assert "<script>alert" not in page
    with TestClient(create_app(db), base_url=LOCAL) as c:  # none given: none shown
        sign_in(c, "ann")
        assert "guidelines" not in c.get("/").text.lower()
        assert c.get("/guidelines").status_code == 404
    for content, problem in [(b"\xff\xfe", "not UTF-8 text"), (b"x" * 600_000, "more than")]:
        path.write_bytes(content)
        with pytest.raises(UsageError, match=problem):
            read_guidelines(path)
    with pytest.raises(UsageError, match="ServeConfig.guidelines = 'no/such.md'"):
        ServeConfig(guidelines="no/such.md")


def test_a_quota_caps_each_labellers_tasks_and_the_admin_sees_it(db):
    with TestClient(create_app(db, admin_token=ADMIN, quota=1), base_url=LOCAL) as c:
        sign_in(c, "ann")
        assert c.get("/api/next").json()["progress"] == {
            "votes": 0,
            "left": 1,
            "quota": 1,
            "judged": 0,
        }
        assert vote(c, 1, "skip").status_code == 201  # a skip is no judgment...
        task = c.get("/api/next").json()["task"]
        assert vote(c, task["id"], order=[0, 1]).status_code == 201  # ...this one is
        answer = c.get("/api/next").json()
        assert answer["task"] is None and answer["progress"]["left"] == 0
        page = c.get("/").text
        assert "Nothing left for you to label" in page
        assert "You have judged your quota of 1 task." in page
        assert "Your quota: <b>1</b> task to judge" in c.get("/progress").text
        c.post("/api/login", json={"token": ADMIN})
        page = c.get("/progress").text
        assert "each labeller judges at most <b>1</b> task" in page
        assert "<th>Quota</th>" in page and "<td>1 / 1</td>" in page
        assert c.get("/api/progress").json()["quota"] == 1
    with pytest.raises(ValueError, match="quota=0"):
        create_app(db, quota=0)
    with pytest.raises(UsageError, match="ServeConfig.quota = 0 is not allowed"):
        ServeConfig(quota=0)


def test_with_tokens_only_tokens_sign_in(db):
    store = Store(db)
    token = store.issue_token("ann")
    store.close()
    with TestClient(create_app(db, require_token=True), base_url=LOCAL) as client:
        response = client.post("/api/login", json={"name": "bob"})
        assert response.status_code == 401 and "asks for the token" in response.json()["error"]
        assert client.get("/progress", follow_redirects=False).status_code == 303
        assert client.get("/api/progress").status_code == 401
        page = client.get("/login").text
        assert 'name="name"' not in page and 'name="token"' in page
        response = client.post("/api/login", json={"token": token})
        assert response.json() == {"labeller": "ann"}
        assert client.get("/api/next").json()["task"]["id"] == 1


def nested(depth):
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("path", ["/api/votes", "/api/login"])
@pytest.mark.parametrize(
    "body",
    [
        nested(30_000),  # 60 KB, deeper than the JSON parser goes
        '{"task": 1, "id": ' + nested(900) + ', "choice": "skip", "name": ' + nested(900) + "}",
        json.dumps({"task": 10**30, "id": str(uuid.uuid4()), "choice": "skip"}),
        '{"task": -1000000000000000000000000000000, "name": "ann", "token": ' + nested(900) + "}",
    ],
    ids=["nested-60KB", "nested-fields", "task-1e30", "task-minus-1e30"],
)
def test_hostile_bodies_get_a_4xx_never_a_500(client, path, body):
    sign_in(client, "ann")
    client.get("/api/next")
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert len(response.json()["error"]) < 200


def test_two_servers_on_one_machine_keep_their_sessions_apart(tmp_path):
    """Cookies do not tell ports apart: each database's server has a cookie of its own."""
    apps, clients = [], []
    for i, name in enumerate(("ann", "bob")):
        path = tmp_path / f"{i}.db"
        Store(path, create=True).close()
        apps.append(create_app(path))
        clients.append(TestClient(apps[-1], base_url=f"http://127.0.0.1:800{i}"))
        sign_in(clients[-1], name)
    first, second = clients
    first.cookies.update(second.cookies)  # one browser: both cookies go to both servers
    second.cookies.update(first.cookies)
    assert len(first.cookies) == 2
    assert first.get("/api/next").json()["progress"] == {"votes": 0, "left": 0}
    assert "Signed in as <b>ann</b>" in first.get("/").text
    assert "Signed in as <b>bob</b>" in second.get("/").text
    for c in clients:
        c.close()


@pytest.mark.parametrize(
    "host, allowed",
    [
        ("127.0.0.1:8000", True),
        ("localhost:8000", True),
        ("LOCALHOST", True),
        ("[::1]:8000", True),
        ("192.168.1.20:8000", True),  # an address cannot be re-pointed
        ("labels.example.org", True),  # given to the app
        ("rebind.attacker.example:8000", False),
        ("127.0.0.1.nip.io:8000", False),
        ("", False),
    ],
)
def test_only_allowed_host_names_are_answered(db, host, allowed):
    """A DNS-rebinding page reaches the server under its own name: refused, pages and API."""
    app = create_app(db, hosts=["labels.example.org"])
    with TestClient(app, base_url=LOCAL) as client:
        headers = {"host": host}
        page = client.get("/login", headers=headers)
        login = client.post("/api/login", json={"name": "mallory"}, headers=headers)
    assert (page.status_code, login.status_code) == ((200, 200) if allowed else (400, 400))
    if not allowed:
        assert "is not one this server answers to" in login.json()["error"]


def test_oversized_bodies_are_refused(client):
    sign_in(client, "ann")
    response = client.post(
        "/api/votes", content=b" " * 100_000, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


# -------------------------------------------------------------- prepare and export (CLI)


def test_prepare_from_a_file_then_export(tmp_path, capsys):
    rows = [
        {"prompt": "a", "responses": ["x", "y"]},
        {"prompt": [{"role": "user", "content": "b"}], "responses": ["1", "2", "3"]},
    ]
    source = str(write_jsonl(tmp_path / "r.jsonl", rows))
    db = str(tmp_path / "l.db")
    assert main(["label", "prepare", "--db", db, "--responses", source]) == 0
    assert main(["label", "prepare", "--db", db, "--responses", source]) == 0  # adds nothing
    tasks = Store(db).tasks()
    assert [(t.prompt, t.responses) for t in tasks.values()] == [
        (r["prompt"], r["responses"]) for r in rows
    ]
    out = str(tmp_path / "prefs.jsonl")
    assert main(["label", "export", "--db", db, "--out", out, "--aggregate", "majority"]) == 0
    assert (tmp_path / "prefs.jsonl").read_text() == ""  # no votes yet
    assert f"result:         {out}" in capsys.readouterr().out
    assert (tmp_path / "prefs.jsonl.summary.json").is_file()  # where --help says it is
    with pytest.raises(SystemExit):
        main(["label", "export", "--help"])
    assert "(runs/label/preferences.jsonl.summary.json)" in " ".join(
        capsys.readouterr().out.split()
    )


def test_export_formats_from_the_command_line(tmp_path, capsys):
    source = str(write_jsonl(tmp_path / "r.jsonl", [{"prompt": "a", "responses": ["x", "y"]}]))
    db = str(tmp_path / "l.db")
    assert main(["label", "prepare", "--db", db, "--responses", source]) == 0
    store = Store(db)
    store.sign_in(name="ann")
    shown = store.next_task("ann", 1)
    store.record_vote("ann", str(uuid.uuid4()), shown.task.id, "rank", [0, 1], rating=3)
    store.close()
    for fmt, name in [("jsonl", "p.jsonl"), ("parquet", "p.parquet"), ("dataset", "p")]:
        out = str(tmp_path / name)
        assert main(["label", "export", "--db", db, "--out", out, "--format", fmt]) == 0
        (record,) = load_records(out, "comparisons")
        assert record.prompt == "a" and {record.chosen, record.rejected} == {"x", "y"}
    with pytest.raises(SystemExit) as info:  # a folder's name, as format 'dataset' wrote
        main(["label", "export", "--db", db, "--out", out, "--format", "parquet"])
    assert info.value.code == 2
    assert "expected a .parquet file path (format 'parquet')" in capsys.readouterr().err


def test_an_export_on_a_full_disk_names_its_file_and_exits_1(tmp_path, capsys, monkeypatch):
    source = str(write_jsonl(tmp_path / "r.jsonl", [{"prompt": "a", "responses": ["x", "y"]}]))
    db = str(tmp_path / "l.db")
    assert main(["label", "prepare", "--db", db, "--responses", source]) == 0

    def full(records, path):  # as pyarrow's writer fails when the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setitem(export_module.WRITERS, "parquet", full)
    out = tmp_path / "p.parquet"
    assert main(["label", "export", "--db", db, "--out", str(out), "--format", "parquet"]) == 1
    err = capsys.readouterr().err
    assert f"writing bytes to {out} failed: No space left on device (ENOSPC)" in err, err


def test_prepare_leaves_out_a_record_with_two_identical_responses(tmp_path, caplog):
    rows = [
        {"prompt": "a", "responses": ["same", "same"]},
        {"prompt": "b", "responses": ["x", "y", "x"]},
        {"prompt": "c", "responses": ["x", "y"]},
    ]
    db = tmp_path / "l.db"
    assert (
        main(
            [
                "label",
                "prepare",
                "--db",
                str(db),
                "--responses",
                str(write_jsonl(tmp_path / "r.jsonl", rows)),
            ]
        )
        == 0
    )
    assert [t.prompt for t in Store(db).tasks().values()] == ["c"]
    assert "2 of 3 records left out: two of their responses are the same text" in caplog.text


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"responses": ["x", "y"]}, "line 2: field 'prompt' is missing"),
        ({"prompt": "p"}, "line 2: field 'responses' is missing"),
        (
            {"prompt": "p", "responses": ["only one"]},
            "line 2: field 'responses' must hold at least 2 responses, got 1",
        ),
        (
            {"prompt": "p", "responses": "x"},
            "line 2: field 'responses' must be a list of at least 2 strings, got 'x'",
        ),
        ({"prompt": "p", "responses": ["x", " "]}, "line 2: field 'responses' item 1 must be a"),
        ({"prompt": "p", "responses": ["x", 3]}, "line 2: field 'responses' item 1 must be a"),
        ({"prompt": "", "responses": ["x", "y"]}, "line 2: field 'prompt' must be a non-empty"),
        ({"prompt": "\ud800", "responses": ["x", "y"]}, "line 2: field 'prompt' holds a lone"),
    ],
)
def test_prepare_names_file_line_and_field_of_bad_input(tmp_path, capsys, row, problem):
    source = str(
        write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok", "responses": ["a", "b"]}, row])
    )
    db = tmp_path / "l.db"
    assert main(["label", "prepare", "--db", str(db), "--responses", source]) == 2
    err = capsys.readouterr().err
    assert f"rlhfkit label prepare: error: {source} {problem}" in err, err
    assert not db.exists()  # nothing half-written


def test_prepare_refuses_a_model_that_is_not_there(tmp_path, tiny_model_dir):
    config = PrepareConfig(models=[str(tiny_model_dir), str(tmp_path / "no/model")], db="x.db")
    with pytest.raises(UsageError, match=r"PrepareConfig.models\[1\] '.*no/model': no such dir"):
        run_prepare(config)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="an empty directory without config.json"):
        run_prepare(PrepareConfig(models=[str(tmp_path / "empty")], db="x.db"))
    assert not (tmp_path / "x.db").exists()


def test_prepare_refuses_bad_settings(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["label", "prepare", "--responses", "r.jsonl", "--k", "1"])
    assert "PrepareConfig.k = 1 is not allowed: expected an integer >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["label", "prepare"])
    assert "PrepareConfig.responses = None is not allowed" in capsys.readouterr().err
    assert main(["label", "serve", "--db", str(tmp_path / "none.db")]) == 2
    assert "no such labelling database" in capsys.readouterr().err


def test_prepare_samples_from_models_end_to_end(tiny_model_dir, tmp_path, monkeypatch):
    rows = [{"prompt": p} for p in ("The cat", "A dog", "My friend")]
    prompts = str(write_jsonl(tmp_path / "p.jsonl", rows))
    db = tmp_path / "l.db"
    args = ["label", "prepare", "--db", str(db), "--prompts", prompts, "--k", "3"]
    args += ["--models", f"[{tiny_model_dir}, {tiny_model_dir}]", "--max_new_tokens", "8"]
    assert main([*args, "--device", "cpu", "--seed", "1"]) == 0
    tasks = list(Store(db).tasks().values())
    assert [t.prompt for t in tasks] == ["The cat", "A dog", "My friend"]
    assert all(t.k == 3 and all(r.strip() for r in t.responses) for t in tasks)
    # Response 1 of each prompt is model 1's (seed + 1), sampled as `rlhfkit bon` samples.
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir, tokenizer=tokenizer).eval()
    ids, _ = encode_prompts([PromptRecord(t.prompt) for t in tasks], tokenizer, 128)
    (batch,) = sample_responses(model, tokenizer, ids, SamplingConfig(8), seed=2, batch_size=32)
    assert [t.responses[1] for t in tasks] == batch.responses

    # Preparing again samples nothing (every prompt has its task) and adds nothing.
    def sample_again(*args, **kwargs):
        raise AssertionError("a prompt that has its task was sampled again")

    monkeypatch.setattr(prepare_module, "_sample", sample_again)
    assert main([*args, "--device", "cpu", "--seed", "1"]) == 0
    assert len(Store(db).tasks()) == len(tasks)
    config = PrepareConfig(models=[str(tiny_model_dir)], k=2)
    assert config.sampling.max_new_tokens == 48


def test_exported_votes_train_a_reward_model_and_dpo_unchanged(client, tmp_path, tiny_model_dir):
    from rlhfkit.config import RewardConfig
    from rlhfkit.trainers.dpo import run_dpo
    from rlhfkit.trainers.dpo_config import DPOConfig
    from rlhfkit.trainers.reward import run_reward

    sign_in(client, "ann")
    while (task := client.get("/api/next").json()["task"]) is not None:
        assert vote(client, task["id"], order=list(range(task["k"]))[::-1]).status_code == 201
    out = tmp_path / "prefs.jsonl"
    db = str(client.app.state.store.path)
    assert main(["label", "export", "--db", db, "--out", str(out)]) == 0
    records = load_records(out, "comparisons")
    assert len(records) == 3
    common = {"train_data": str(out), "eval_data": None, "max_steps": 1, "batch_size": 2}
    common |= {"cpu": True, "report_to": [], "max_length": 64}
    rm_dir = tmp_path / "rm"
    run_reward(RewardConfig(model=str(tiny_model_dir), output_dir=str(rm_dir), **common))
    assert (rm_dir / "final").is_dir()
    dpo_dir = tmp_path / "dpo"
    run_dpo(DPOConfig(model=str(tiny_model_dir), output_dir=str(dpo_dir), **common))
    assert (dpo_dir / "final").is_dir()


def test_label_help_lists_the_four_commands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["label", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(
        re.search(rf"^\s+{c}\s", out, re.M) for c in ("prepare", "assign", "serve", "export")
    )
    with pytest.raises(SystemExit) as info:
        main(["label"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        main(["label", "serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--labels_per_task LABELS_PER_TASK Votes (ties included, skips not)" in out
