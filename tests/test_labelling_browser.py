"""Labelling in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright).

A labeller signs in, votes on pairs with the mouse and with keys (one submission's answer is
lost on the way back, so the page retries it), ranks a K = 4 task, ties and skips; a second
labeller votes on two of the same tasks; the progress page shows their agreement, and the
export holds exactly those votes. A response holding `<script>` and `<img onerror>` shows as text and
runs nothing. With RLHFKIT_SCREENSHOTS=1 the screenshots go to docs/img (the ones the docs
show), otherwise to the test's temporary folder.

Skipped, with the reason, where Chromium or Playwright is missing (`.ci/run` installs both).
"""

import os
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlhfkit.labelling.display import visible
from rlhfkit.labelling.export import export_records
from rlhfkit.labelling.store import Store

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[test]')"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium: install Debian's `chromium` package (.ci/run does)"
)
# Headless, as root in a container, and quiet: without the network flags Chromium keeps
# trying Google's services, which a machine without internet refuses, many at a time.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=\"window.__xss = 1; alert('xss')\">"
HOSTILE = f"{IMG} **not bold**\n\x1b[31m{SCRIPT}"
TASKS = [
    ("Greet a new colleague.", ["Hello! Nice to meet you.", "What do you want?"]),
    ("Repeat exactly what I wrote.", [SCRIPT, HOSTILE]),
    ("Is the sky blue?", ["Yes, on a clear day: air scatters blue light most.", "No."]),
    ("Say something.", ["Something.", "Something!"]),
    (
        [{"role": "user", "content": "Name numbers from smallest to largest."}],
        ["one, two, three", "three, two, one", "two", "one hundred and <b>one</b>"],
    ),
    ("Translate 'chat' from French.", ["cat", "chat"]),
]


@contextmanager
def serve_in_thread(db, labels_per_task):
    """The labelling app on uvicorn in a thread, on a free port of 127.0.0.1."""
    import uvicorn

    from rlhfkit.labelling.app import create_app
    from rlhfkit.labelling.serve import listening_socket

    sock = listening_socket("127.0.0.1", 0)
    app = create_app(db, labels_per_task=labels_per_task)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def shots(tmp_path):
    folder = DOCS_IMG if os.environ.get("RLHFKIT_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def slot_texts(page):
    """The responses' texts as the page holds them, in display order."""
    return [
        page.locator(f'[data-slot="{slot}"] pre.text').text_content()
        for slot in range(page.locator("[data-slot]").count())
    ]


def original(task, shown_text):
    """The response of `task` that the page shows as `shown_text`."""
    (text,) = [r for r in TASKS[task - 1][1] if visible(r) == shown_text]
    return text


def wait_for_task(page, task):
    """Wait for the page of `task`, its script run (the keys work from then on)."""
    page.wait_for_selector(f'#task[data-task="{task}"]')
    page.wait_for_load_state("domcontentloaded")


def test_a_labeller_votes_with_mouse_and_keys_and_the_export_holds_those_votes(
    browser, shots, tmp_path
):
    db = tmp_path / "labels.db"
    store = Store(db, create=True)
    store.add_tasks(TASKS)
    store.close()
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    dialogs, errors = [], []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    expected = {}  # (task id, labeller) -> (chosen, rejected) or ranking of response indices

    with serve_in_thread(db, labels_per_task=2) as url:
        page.goto(url)
        page.fill("#name", "ann")
        page.screenshot(path=shots / "labelling-login.png")
        page.click("text=Start labelling")

        # Task 1, by mouse; the server's answer is lost once, so the page sends it again.
        wait_for_task(page, 1)
        lost = []

        def lose_first_answer(route):
            if not lost:
                lost.append(route.fetch().status)  # reaches the server, which stores it...
                route.abort("connectionreset")  # ...but the page never hears back
            else:
                route.continue_()

        page.route("**/api/votes", lose_first_answer)
        a, b = slot_texts(page)
        page.click("button[data-choice=b]")
        expected[1, "ann"] = (original(1, b), original(1, a))

        # Task 2, the hostile one: shown as text, nothing runs. Vote with the key 2.
        wait_for_task(page, 2)
        assert lost == [201]
        page.unroute("**/api/votes")
        texts = slot_texts(page)
        assert sorted(texts) == sorted(visible(r) for r in TASKS[1][1])
        assert "\\x1b[31m" in visible(HOSTILE) and "\x1b" not in "".join(texts)
        assert page.locator(".response .ctrl").text_content() == "\\x1b"
        assert page.locator(".response img, .response script, .response b").count() == 0
        assert page.evaluate("window.__xss") is None
        page.screenshot(path=shots / "labelling-pair.png", full_page=True)
        page.keyboard.press("2")
        expected[2, "ann"] = (original(2, texts[1]), original(2, texts[0]))

        # Task 3: a rating and a flag with the mouse, then the left arrow (A).
        wait_for_task(page, 3)
        a, b = slot_texts(page)
        page.check('input[name="rating"][value="6"]')
        page.fill("#flag", "nonsense")
        page.keyboard.press("Escape")  # leave the text field: the keys are shortcuts again
        page.keyboard.press("ArrowLeft")
        expected[3, "ann"] = (original(3, a), original(3, b))

        # Task 4: a tie with the space bar (left out of the export, counted).
        wait_for_task(page, 4)
        page.keyboard.press(" ")

        # Task 5, K = 4: ranked with keys and clicks, one placement undone.
        wait_for_task(page, 5)
        shown = slot_texts(page)
        assert page.locator(".role").text_content() == "user"
        best_first = [2, 0, 3, 1]  # response indices
        slots = [shown.index(visible(TASKS[4][1][i])) for i in best_first]
        page.keyboard.press(str(slots[0] + 1))
        page.click(f'[data-slot="{slots[1]}"]')
        page.click(f'[data-slot="{slots[3]}"]')  # a slip...
        page.keyboard.press("Backspace")  # ...undone
        assert page.locator("#order").text_content() == f"{slots[0] + 1} > {slots[1] + 1}"
        assert page.locator('[data-action="submit"]').is_disabled()
        page.screenshot(path=shots / "labelling-ranking.png", full_page=True)
        page.keyboard.press(str(slots[2] + 1))
        page.focus(f'[data-slot="{slots[3]}"]')
        page.keyboard.press(" ")  # the focused card takes the last place
        assert page.locator(f'[data-slot="{slots[0]}"] .place').text_content() == "#1"
        page.keyboard.press("Enter")
        expected[5, "ann"] = best_first

        # Task 6: skipped with s; then nothing is left.
        wait_for_task(page, 6)
        page.keyboard.press("s")
        page.wait_for_selector("text=Nothing left for you to label")
        assert "6 votes by you" in page.locator("#my-progress").inner_text()

        # A second labeller, in a browser of their own: tasks ann labelled come first
        # (two labels each); bob agrees on task 1 and not on task 2.
        bob = browser.new_page(viewport={"width": 1100, "height": 820})
        bob.goto(url)
        bob.fill("#name", "bob")
        bob.keyboard.press("Enter")
        for task, agree in ((1, True), (2, False)):
            wait_for_task(bob, task)
            a, b = slot_texts(bob)
            ann_chose = expected[task, "ann"][0]
            first = (original(task, a) == ann_chose) == agree
            bob.keyboard.press("ArrowLeft" if first else "ArrowRight")
            chosen, rejected = (a, b) if first else (b, a)
            expected[task, "bob"] = (original(task, chosen), original(task, rejected))
        wait_for_task(bob, 3)
        bob.close()

        page.goto(f"{url}/progress")
        table = " ".join(page.locator("#labellers").inner_text().split())
        assert table == "Labeller Votes Preferences Ties Skips ann 6 4 1 1 bob 2 2 0 0"
        agreement = page.locator("#agreement").inner_text()
        assert "On the 2 tasks labelled by two or more people" in agreement
        assert "raw agreement 50.0%" in agreement
        page.screenshot(path=shots / "labelling-progress.png", full_page=True)

    assert not dialogs, dialogs
    assert errors == ["Failed to load resource: net::ERR_CONNECTION_RESET"]  # the lost answer
    store = Store(db)
    votes = store.votes()
    assert len(votes) == 8  # the lost answer's retry was not counted twice
    records, summary = export_records(store.tasks(), votes)
    exported = {
        (r["task_id"], r["labellers"][0]): (r["chosen"], r["rejected"])
        if "chosen" in r
        else r["ranking"]
        for r in records
    }
    assert exported == expected and len(records) == len(expected)
    assert summary["left_out"] == {"tie": 1, "skip": 1}
    rated = next(r for r in records if r["task_id"] == 3)
    assert (rated["ratings"], rated["flags"]) == ([6], ["nonsense"])
    page.close()
