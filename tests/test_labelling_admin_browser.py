"""Labelling: the admin steers a campaign in a real browser (headless Chromium, as in
test_labelling_browser.py): the progress page with its review queue, check-task accuracy and
Pause, the tasks page filtered by labeller and by what needs review, and a decision taken with
the keyboard alone. With RLHFKIT_SCREENSHOTS=1 the screenshots go to docs/img (the ones
docs/labelling.md shows)."""

from rlhfkit.labelling.campaign import Campaign
from rlhfkit.labelling.store import Store
from test_labelling_browser import ADMIN, browser, pytestmark, serve_in_thread, shots  # noqa: F401
from test_labelling_store import new_id

TASKS = [
    ("Greet a new colleague.", ["Hello! Nice to meet you.", "What do you want?"]),
    ("Is the sky blue?", ["Yes, on a clear day: air scatters blue light most.", "No."]),
    ("Name a prime number.", ["Nine.", "Seven."]),
    ("Say something <b>kind</b>.", ["You did well today.", "<script>alert(1)</script>"]),
]


def vote(store, labeller, task, best, **extra):
    """`labeller` is shown `task` and prefers response `best` (an index), or votes `best`
    when it is a choice ("tie", "bad", "skip")."""
    shown = store.next_task(labeller, 2)
    assert shown.task.id == task, (labeller, shown.task.id)
    if isinstance(best, str):
        return store.record_vote(labeller, new_id(), task, best, **extra)
    order = [shown.display.index(best), shown.display.index(1 - best)]
    return store.record_vote(labeller, new_id(), task, "rank", order, **extra)


def campaign_db(tmp_path):
    """Two labellers' votes: they disagree on task 1 (ann flags it) and agree on task 2;
    task 3 is a check task (the second response is right), which bob gets wrong."""
    db = tmp_path / "labels.db"
    store = Store(db, create=True)
    store.add_tasks(TASKS)
    Campaign(store).set_gold(3, [1, 0])
    for name in ("ann", "bob"):
        store.sign_in(name=name)
    vote(store, "ann", 1, 0, flag="rude reply", rating=6)
    vote(store, "bob", 1, 1, rating=3)
    vote(store, "ann", 2, 0)
    vote(store, "bob", 2, 0)
    vote(store, "ann", 3, 1)
    vote(store, "bob", 3, 0)
    vote(store, "ann", 4, "bad", flag="unsafe")
    store.close()
    return db


def test_the_admin_reviews_decides_and_pauses_in_a_browser(browser, shots, tmp_path):  # noqa: F811
    db = campaign_db(tmp_path)
    errors = []
    with serve_in_thread(db, labels_per_task=2) as url:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        page.fill("#token", ADMIN)
        page.keyboard.press("Enter")
        page.wait_for_selector("#labellers")
        table = " ".join(page.locator("#labellers").inner_text().split())
        assert "ann 4 3 0 1 0 100% (1 judgment on 1 task)" in table
        assert "bob 3 3 0 0 0 0% (1 judgment on 1 task)" in table
        assert "1 task to review" in page.locator("#review").inner_text()
        page.screenshot(path=shots / "labelling-admin-progress.png", full_page=True)

        page.click("text=Pause labelling")
        page.wait_for_selector("text=Labelling is paused")
        labeller = browser.new_page()
        labeller.goto(url)
        labeller.fill("#name", "cat")
        labeller.keyboard.press("Enter")
        labeller.wait_for_selector("#paused")
        page.click("text=Resume labelling")
        labeller.reload()
        labeller.wait_for_selector("#task")

        page.click("#review a >> nth=0")
        page.wait_for_selector("#task-1")
        assert page.locator("article").count() == 1
        assert "rude reply" in page.locator("#task-1 table").inner_text()
        page.screenshot(path=shots / "labelling-admin-review.png", full_page=True)
        # The decision with the keyboard alone: the order, a check task, a note, the button.
        page.focus('#task-1 input[name="order"]')
        page.keyboard.type("2 1")
        page.keyboard.press("Tab")
        page.keyboard.press("Space")
        page.keyboard.press("Tab")
        page.keyboard.type("bob is right: the reply is rude")
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")
        page.wait_for_selector("text=No task to show.")
        assert page.url.endswith("/progress/tasks?show=review")

        page.select_option('select[name="labeller"]', "bob")
        page.select_option('select[name="show"]', "decided")
        page.click("text=Filter")
        page.wait_for_selector("#task-1 .decision")
        decided = page.locator("#task-1").inner_text()
        assert "Decided: 2 > 1 (bob is right: the reply is rude)" in decided
        assert "check task: 2 > 1" in decided
        page.select_option('select[name="show"]', "flagged")
        page.select_option('select[name="labeller"]', "")
        page.click("text=Filter")
        page.wait_for_selector("#task-4")
        assert page.locator("article").count() == 2  # tasks 1 and 4
        assert page.locator("#task-4 script").count() == 0
        assert "<script>alert(1)</script>" in page.locator("#task-4 details").text_content()
    store = Store(db)
    assert Campaign(store).decisions()[1].note == "bob is right: the reply is rude"
    assert Campaign(store).gold() == {1: [1, 0], 3: [1, 0]}
    store.close()
    assert errors == []
