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

ADMIN = "the-admin-token"
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
def serve_in_thread(db, labels_per_task, **options):
    """The labelling app on uvicorn in a thread, on a free port of 127.0.0.1; `options` go to
    `create_app` (guidelines, quota)."""
    import uvicorn

    from rlhfkit.labelling.app import create_app
    from rlhfkit.labelling.serve import listening_socket

    sock = listening_socket("127.0.0.1", 0)
    app = create_app(db, labels_per_task=labels_per_task, admin_token=ADMIN, **options)
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
    lost = []

    def lose_first_answer(route):
        if not lost:
            lost.append(route.fetch().status)  # reaches the server, which stores it...
            route.abort("connectionreset")  # ...but the page never hears back
        else:
            route.continue_()

    # From the first request on, as on the phone below: not added just before the vote.
    page.route("**/api/votes", lose_first_answer)
    with serve_in_thread(db, labels_per_task=2) as url:
        page.goto(url)
        page.fill("#name", "ann")
        page.screenshot(path=shots / "labelling-login.png")
        page.click("text=Start labelling")

        # Task 1, by mouse; the server's answer is lost once, so the page sends it again.
        wait_for_task(page, 1)
        a, b = slot_texts(page)
        page.click("button[data-choice=b]")
        expected[1, "ann"] = (original(1, b), original(1, a))

        # Task 2, the hostile one: shown as text, nothing runs. Vote with the key 2.
        wait_for_task(page, 2)
        assert lost == [201]
        texts = slot_texts(page)
        assert sorted(texts) == sorted(visible(r) for r in TASKS[1][1])
        assert "\\x1b[31m" in visible(HOSTILE) and "\x1b" not in "".join(texts)
        assert page.locator(".response .ctrl").text_content() == "\\x1b"
        assert page.locator(".response img, .response script, .response b").count() == 0
        assert page.evaluate("window.__xss") is None
        page.get_by_label("Show raw text").check()  # the other view: inert too
        assert page.locator(".response pre.text").first.is_visible()
        assert page.locator(".response img, .response script, .response b").count() == 0
        assert page.evaluate("window.__xss") is None
        page.get_by_label("Show raw text").uncheck()
        page.screenshot(path=shots / "labelling-pair.png")
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
        page.screenshot(path=shots / "labelling-ranking.png")
        page.keyboard.press(str(slots[2] + 1))
        page.focus(f'[data-slot="{slots[3]}"]')
        page.keyboard.press(" ")  # the focused card takes the last place
        assert page.locator(f'[data-slot="{slots[0]}"] .place').text_content() == "placed 1st"
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

        # ann sees her own progress only; the admin (the token `serve` prints) everyone's.
        page.goto(f"{url}/progress")
        assert "6 votes by you" in page.locator("#mine").inner_text()
        assert "bob" not in page.content()
        admin = browser.new_page(viewport={"width": 1100, "height": 820})
        admin.goto(url)
        admin.fill("#token", ADMIN)
        admin.keyboard.press("Enter")
        admin.wait_for_selector("#labellers")
        rows = [" ".join(row.split()) for row in admin.locator("#labellers tr").all_inner_texts()]
        assert rows[0].startswith("Labeller Votes Preferences Ties All bad Skips")
        assert [row.split()[:6] for row in rows[1:]] == [
            ["ann", "6", "4", "1", "0", "1"],
            ["bob", "2", "2", "0", "0", "0"],
        ]
        agreement = admin.locator("#agreement").inner_text()
        assert "On the 2 tasks labelled by two or more people" in agreement
        assert "raw agreement 50.0%" in agreement
        admin.screenshot(path=shots / "labelling-progress.png", full_page=True)
        admin.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing overflows
        assert admin.evaluate("document.documentElement.scrollWidth") <= 390
        admin.screenshot(path=shots / "labelling-progress-phone.png", full_page=True)
        admin.close()

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
    assert summary["left_out"] == {"tie": 1, "bad": 0, "skip": 1}
    rated = next(r for r in records if r["task_id"] == 3)
    assert (rated["ratings"], rated["flags"]) == ([6], ["nonsense"])
    page.close()


# ------------------------------------------------------------------------ keyboard only
KEYBOARD_TASKS = [
    ("First pair.", ["left one", "right one"]),
    ("Second pair.", ["left two", "right two"]),
    ("A ranking to call a tie.", ["x", "y", "z"]),
    ("A ranking to skip.", ["u", "v", "w"]),
]


def tab_to(page, selector, presses=40):
    """Press Tab until the element matching `selector` has the focus; keys only, no clicks."""
    for _ in range(presses):
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached {selector}")


def assert_focus_is_visible(page):
    style = page.evaluate(
        "() => { const s = getComputedStyle(document.activeElement);"
        " return [s.outlineStyle, s.outlineWidth, s.boxShadow]; }"
    )
    assert style[0] != "none" and style[1] != "0px" or style[2] != "none", style


def test_keyboard_only_every_control_does_what_its_label_says(browser, tmp_path):
    """Signed in and labelled with the keyboard alone: a focused button does what it says
    (never the page's shortcut for the same key), arrows on the rating only rate, and the
    focus can always be seen; the controls have the roles and names a screen reader reads."""
    db = tmp_path / "labels.db"
    store = Store(db, create=True)
    store.add_tasks(KEYBOARD_TASKS)
    store.close()
    page = browser.new_page(viewport={"width": 1100, "height": 820})

    def votes():
        store = Store(db)
        try:
            return {v.task_id: v for v in store.votes()}
        finally:
            store.close()

    with serve_in_thread(db, labels_per_task=1) as url:
        page.goto(url)
        # The name field has the focus (autofocus), but only from the page's first rendering,
        # which may come after the load event that goto waits for: keys typed before it are
        # lost, and an Enter after it signs in with no name (a 401, the sign-in page again).
        sync_api.expect(page.locator("#name")).to_be_focused()
        page.keyboard.type("kim")
        page.keyboard.press("Enter")

        # Task 1: Tab to "A is better", Space: A (the page's shortcut for Space is a tie).
        wait_for_task(page, 1)
        assert page.get_by_role("button", name="A is better", exact=True).count() == 1
        assert page.get_by_role("radiogroup", name="Overall quality").count() == 1
        assert page.get_by_label("Flag").count() == 1
        a, b = slot_texts(page)
        tab_to(page, '[data-choice="a"]')
        assert_focus_is_visible(page)
        page.keyboard.press(" ")
        wait_for_task(page, 2)
        first = votes()[1]
        assert first.choice == "rank"
        assert KEYBOARD_TASKS[0][1][first.ranking[0]] == a

        # Task 2: the arrows on the rating change the rating and never vote.
        a, b = slot_texts(page)
        tab_to(page, 'input[name="rating"]')
        assert_focus_is_visible(page)
        for _ in range(3):
            page.keyboard.press("ArrowRight")
        assert page.locator('input[name="rating"]:checked').get_attribute("value") == "4"
        assert page.evaluate("document.activeElement.name") == "rating"
        page.keyboard.press("ArrowLeft")
        time.sleep(0.3)  # a vote would be on its way by now
        assert page.locator("#task").get_attribute("data-task") == "2" and 2 not in votes()
        assert page.locator('input[name="rating"]:checked').get_attribute("value") == "3"
        tab_to(page, '[data-choice="b"]')
        page.keyboard.press("Enter")
        wait_for_task(page, 3)
        second = votes()[2]
        assert KEYBOARD_TASKS[1][1][second.ranking[0]] == b and second.rating == 3

        # Task 3, K = 3: Enter on a focused "All equally good" is a tie.
        assert page.get_by_role("listbox").count() == 1
        assert page.get_by_role("option").count() == 3
        tab_to(page, '[data-choice="tie"]')
        assert_focus_is_visible(page)
        page.keyboard.press("Enter")
        wait_for_task(page, 4)
        assert votes()[3].choice == "tie"

        # Task 4, K = 3: a card placed from the keyboard, then Space on a focused "Skip" skips
        # (Enter and Space there were the shortcuts for submit and place).
        tab_to(page, ".rankable")
        assert_focus_is_visible(page)
        page.keyboard.press(" ")
        assert page.locator('.rankable[aria-selected="true"]').count() == 1
        tab_to(page, '[data-choice="skip"]')
        page.keyboard.press(" ")
        page.wait_for_selector("text=Nothing left for you to label")
        assert votes()[4].choice == "skip" and len(votes()) == 4
    page.close()


def test_on_a_phone_the_vote_is_in_reach_and_a_failure_is_plain(browser, shots, tmp_path):
    """390 px wide, long responses: nothing overflows sideways, rating and flag come before
    the vote buttons, which stay in the window; a vote refused (other than "already voted")
    says so where the labeller looks, and the page stays; "Both are bad" (key x) is a vote."""
    db = tmp_path / "labels.db"
    store = Store(db, create=True)
    long = " ".join(f"word{i}" for i in range(600))
    store.add_tasks([("A long one.", [f"First: {long}", f"Second: {long}"])])
    store.close()
    page = browser.new_page(viewport={"width": 390, "height": 844})
    refusing = []

    def votes(route):
        if refusing:
            route.fulfill(status=422, json={"error": "rating 9: expected 1 to 7"})
        else:
            route.continue_()

    # Intercepting from the first request on, not from the vote's: a route added just before
    # the key was once passed by the vote (the page went on to the next task). The flag
    # `refusing`, not adding and removing the route, says what it does with each vote.
    page.route("**/api/votes", votes)
    with serve_in_thread(db, labels_per_task=1) as url:
        page.goto(url)
        page.fill("#name", "pat")
        page.keyboard.press("Enter")
        wait_for_task(page, 1)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        button = page.locator('[data-choice="bad"]').bounding_box()
        assert button["y"] + button["height"] <= 844  # in the window, not 3,000 px down
        before = page.evaluate(
            "document.querySelector('.extras').compareDocumentPosition("
            "document.querySelector('.actions')) & Node.DOCUMENT_POSITION_FOLLOWING"
        )
        assert before
        page.screenshot(path=shots / "labelling-pair-phone.png")

        refusing.append(True)
        page.keyboard.press("x")
        status = page.locator("#status.problem")
        status.wait_for()
        assert status.inner_text() == "Not saved: rating 9: expected 1 to 7"
        box = status.bounding_box()
        assert box["y"] + box["height"] <= 844
        refusing.clear()
        page.keyboard.press("x")
        page.wait_for_selector("text=Nothing left for you to label")
    (vote,) = Store(db).votes()
    assert vote.choice == "bad"
    page.close()


# ------------------------------------------------------------- drag and drop, guidelines
RANKING = (
    "Which answer explains rain best?",
    [
        "Water vapour cools as it rises, condenses on dust into droplets, and the droplets "
        "merge until they are heavy enough to fall.",
        "Clouds get heavy.",
        "Rain is water falling from clouds when their droplets grow too large to stay up.",
        "The sky cries.",
    ],
)
GUIDELINES = """# Guidelines for this round

Read the prompt, then **every** response before you vote.

1. Prefer the response that is *correct*; then the clearer one; then the shorter one.
2. A response that refuses a harmless request is worse than a plain answer.
3. Flag anything harmful or private (`harmful`, `private information`), whatever you vote.

Use **Both are bad** when neither response should be shown to a user, and **Skip** only when
you cannot judge (a language you do not read, say). See
[InstructGPT's labelling instructions](https://arxiv.org/abs/2203.02155) for more examples.

<script>alert("never runs")</script>
"""


def card_slots(page):
    """The display slots of the ranking's cards, in the order they stand on the page."""
    return page.eval_on_selector_all(".rankable", "cards => cards.map(c => Number(c.dataset.slot))")


def test_drag_and_drop_ranks_and_the_cards_move_as_they_are_placed(browser, shots, tmp_path):
    """With the mouse (Playwright's drag_to: press, move, release): a card dropped on another
    takes its place and is placed after the placed cards above it; a click places one; the
    placed cards stand first, best first; the ranking stored is the one on the page."""
    db = tmp_path / "labels.db"
    store = Store(db, create=True)
    store.add_tasks([RANKING])
    store.close()
    page = browser.new_page(viewport={"width": 1100, "height": 1000})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    with serve_in_thread(db, labels_per_task=1) as url:
        page.goto(url)
        page.fill("#name", "dee")
        page.keyboard.press("Enter")
        wait_for_task(page, 1)
        card = page.locator
        assert card_slots(page) == [0, 1, 2, 3]
        card('[data-slot="2"]').drag_to(card('[data-slot="0"]'))  # up, onto the first
        assert card_slots(page) == [2, 0, 1, 3]
        assert page.locator("#order").text_content() == "3"
        card('[data-slot="3"]').drag_to(card('[data-slot="0"]'))  # second place
        assert card_slots(page) == [2, 3, 0, 1]
        card('[data-slot="0"]').drag_to(card('[data-slot="2"]'))  # first, above the 3
        assert card_slots(page) == [0, 2, 3, 1]
        assert page.locator("#order").text_content() == "1 > 3 > 4"
        card('[data-slot="2"]').drag_to(card('[data-slot="3"]'))  # a placed one moved down
        assert card_slots(page) == [0, 3, 2, 1]
        card('[data-slot="1"]').click()  # clicks still place: the last one
        assert page.locator("#order").text_content() == "1 > 4 > 3 > 2"
        assert card('[data-slot="3"] .place').text_content() == "placed 2nd"
        shown = slot_texts(page)
        page.click('[data-action="submit"]')
        page.wait_for_selector("text=Nothing left for you to label")
    (vote,) = Store(db).votes()
    assert vote.choice == "rank"
    assert [RANKING[1][i] for i in vote.ranking] == [visible(shown[s]) for s in (0, 3, 2, 1)]
    assert not errors, errors
    page.close()


def test_guidelines_fold_above_a_phone_ranking_and_have_a_page_of_their_own(
    browser, shots, tmp_path
):
    """The guidelines (Markdown made safe) fold above the task, stay as the labeller left
    them from one task to the next, and have a page of their own; a ranking fits a phone,
    its cards standing in the order placed."""
    from rlhfkit.labelling.guidelines import render_guidelines

    db = tmp_path / "labels.db"
    store = Store(db, create=True)
    store.add_tasks([RANKING, ("Another.", ["a", "b", "c"])])
    store.close()
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    options = {"guidelines": render_guidelines(GUIDELINES)}
    with serve_in_thread(db, labels_per_task=1, **options) as url:
        page.goto(url)
        page.fill("#name", "pat")
        page.keyboard.press("Enter")
        wait_for_task(page, 1)
        guidelines = page.locator("#guidelines")
        assert guidelines.get_attribute("open") is None  # folded at first
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.locator('[data-slot="2"]').click()
        page.locator('[data-slot="0"]').click()
        assert card_slots(page) == [2, 0, 1, 3]
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=shots / "labelling-ranking-phone.png")
        page.locator("#guidelines summary").click()
        assert guidelines.locator("strong").first.text_content() == "every"
        assert guidelines.locator("script").count() == 0 and page.evaluate("window.__xss") is None
        assert 'alert("never runs")' in guidelines.inner_text()  # shown as text
        page.locator('[data-slot="1"]').click()
        page.locator('[data-slot="3"]').click()
        page.click('[data-action="submit"]')
        wait_for_task(page, 2)
        assert page.locator("#guidelines").get_attribute("open") is not None  # left open
        page.close()

        desk = browser.new_page(viewport={"width": 1100, "height": 820})
        desk.goto(url)
        desk.fill("#name", "lee")
        desk.keyboard.press("Enter")
        desk.click("header >> text=Guidelines")
        desk.wait_for_selector("#guidelines-page")
        link = desk.locator("#guidelines-page a[href^='https:']")
        assert link.get_attribute("rel") == "noopener noreferrer"
        desk.screenshot(path=shots / "labelling-guidelines.png", full_page=True)
        desk.close()


# ------------------------------------------------------- the lead's report, item by item
FOUR = ("Rank four.", ["r one", "r two", "r three", "r four"])


def new_store(db, tasks):
    store = Store(db, create=True)
    store.add_tasks(tasks)
    store.close()


def stored_votes(db):
    store = Store(db)
    try:
        return store.votes()
    finally:
        store.close()


def sign_in(page, url, name):
    page.goto(url)
    page.fill("#name", name)
    page.keyboard.press("Enter")


def focused_slot(page):
    return page.evaluate("document.activeElement.dataset.slot")


def test_keyboard_ranking_keeps_the_focus_on_the_card_just_placed(browser, tmp_path):
    """Down, Down, Space places response 3, which moves to the top with the focus on it; the
    arrows then move through the list as it now stands, without wrapping at its ends."""
    db = tmp_path / "labels.db"
    new_store(db, [FOUR])
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "kay")
        wait_for_task(page, 1)
        shown = slot_texts(page)
        tab_to(page, '.rankable[data-slot="0"]')
        for key in ("ArrowDown", "ArrowDown", " "):
            page.keyboard.press(key)
        assert page.locator("#order").text_content() == "3"
        assert card_slots(page) == [2, 0, 1, 3] and focused_slot(page) == "2"
        page.keyboard.press("ArrowUp")  # at the top already: stays
        assert focused_slot(page) == "2"
        for key in ("ArrowDown", "ArrowDown", " "):
            page.keyboard.press(key)
        assert page.locator("#order").text_content() == "3 > 2"
        assert card_slots(page) == [2, 1, 0, 3] and focused_slot(page) == "1"
        for key in ("ArrowDown", " ", "ArrowDown", "ArrowDown", " "):
            page.keyboard.press(key)
        assert page.locator("#order").text_content() == "3 > 2 > 1 > 4"
        page.keyboard.press("Enter")
        page.wait_for_selector("text=Nothing left for you to label")
    (vote,) = stored_votes(db)
    assert [FOUR[1][i] for i in vote.ranking] == [shown[s] for s in (2, 1, 0, 3)]
    page.close()


def test_rating_and_flag_stay_in_reach_beside_the_vote_on_long_responses(browser, tmp_path):
    """On a phone and on a desktop, with two 4,000-character responses, the rating and the
    flag are in the window at the top of the page; a vote sent from there carries both."""
    db = tmp_path / "labels.db"
    long = ("A sentence of a long response. " * 130)[:4000]
    new_store(db, [("Long.", [f"1 {long}", f"2 {long}"]), ("Long again.", [long, long + "!"])])
    page = browser.new_page(viewport={"width": 390, "height": 844})
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "pat")
        for task, size in ((1, (390, 844)), (2, (1100, 820))):
            page.set_viewport_size({"width": size[0], "height": size[1]})
            wait_for_task(page, task)
            page.evaluate("window.scrollTo(0, 0)")
            assert page.evaluate("document.documentElement.scrollHeight") > 2 * size[1]
            for selector in ('input[name="rating"][value="5"]', "#flag"):
                box = page.locator(selector).bounding_box()
                assert box is not None, selector
                assert box["y"] >= 0 and box["y"] + box["height"] <= size[1], (selector, box)
            page.locator('input[name="rating"][value="5"]').check()
            page.fill("#flag", f"too long {task}")
            page.click('[data-choice="a"]')
        page.wait_for_selector("text=Nothing left for you to label")
    assert [(v.rating, v.flag) for v in stored_votes(db)] == [(5, "too long 1"), (5, "too long 2")]
    page.close()


def test_a_vote_already_made_in_another_tab_moves_on_to_the_next_task(browser, tmp_path):
    """Two tabs on one task: the first votes; the second's vote is refused (409, already
    voted), so that tab says so and loads the next task instead of staying stuck."""
    db = tmp_path / "labels.db"
    new_store(db, KEYBOARD_TASKS[:2])
    context = browser.new_context(viewport={"width": 1100, "height": 820})
    first = context.new_page()
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(first, url, "tab")
        wait_for_task(first, 1)
        second = context.new_page()
        second.goto(url)
        wait_for_task(second, 1)
        first.keyboard.press("1")
        wait_for_task(first, 2)
        second.keyboard.press("2")
        second.wait_for_selector("#status >> text=already voted")
        second.wait_for_selector('#task[data-task="2"]', timeout=5000)
    assert [v.task_id for v in stored_votes(db)] == [1]
    context.close()


def test_back_after_a_vote_does_not_show_the_sign_in_form(browser, tmp_path):
    db = tmp_path / "labels.db"
    new_store(db, KEYBOARD_TASKS[:2])
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "bea")
        wait_for_task(page, 1)
        page.keyboard.press("1")
        wait_for_task(page, 2)
        page.go_back()
        page.wait_for_load_state("domcontentloaded")
        assert page.locator("#name").count() == 0, page.url
        assert page.locator("text=Signed in as").count() == 1
    page.close()


def test_each_ranking_option_is_named_by_its_number(browser, tmp_path):
    """A screen reader names an option "Response 1" (its state: selected or not), not by its
    whole text, which is its description."""
    db = tmp_path / "labels.db"
    new_store(db, [("Long ranking.", ["x " * 1250, "y " * 1250, "z " * 1250])])
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "ray")
        wait_for_task(page, 1)
        for n in (1, 2, 3):
            assert page.get_by_role("option", name=f"Response {n}", exact=True).count() == 1
        page.keyboard.press("2")
        option = page.get_by_role("option", name="Response 2", exact=True)
        assert option.get_attribute("aria-selected") == "true"
        description = option.evaluate(
            "o => document.getElementById(o.getAttribute('aria-describedby')).innerText"
        )
        assert description.split() == slot_texts(page)[1].split()  # the text shown, once
    page.close()


def test_all_equally_good_has_a_key(browser, tmp_path):
    db = tmp_path / "labels.db"
    new_store(db, [KEYBOARD_TASKS[2]])
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "eve")
        wait_for_task(page, 1)
        button = page.get_by_role("button", name="All equally good", exact=True)
        assert button.get_attribute("aria-keyshortcuts") == "E"
        assert button.locator("kbd").text_content() == "e"
        page.keyboard.press("e")
        page.wait_for_selector("text=Nothing left for you to label")
    assert [v.choice for v in stored_votes(db)] == ["tie"]
    page.close()


def test_key_hints_are_hidden_on_a_touch_screen(browser, tmp_path):
    db = tmp_path / "labels.db"
    new_store(db, [KEYBOARD_TASKS[0], KEYBOARD_TASKS[2]])
    with serve_in_thread(db, labels_per_task=2) as url:
        for name, options, seen in (
            ("phone", {"has_touch": True, "is_mobile": True}, False),
            ("desk", {}, True),
        ):
            size = {"width": 390, "height": 844} if not seen else {"width": 1100, "height": 820}
            context = browser.new_context(viewport=size, **options)
            page = context.new_page()
            sign_in(page, url, name)
            for task in (1, 2):
                wait_for_task(page, task)
                hints = page.locator("kbd:not(dialog kbd)")
                assert hints.count() >= 5
                assert [hints.nth(i).is_visible() for i in range(hints.count())] == [
                    seen
                ] * hints.count(), (name, task)
                page.keyboard.press("s")
            context.close()


def test_question_mark_lists_every_shortcut_and_escape_closes_it(browser, tmp_path):
    db = tmp_path / "labels.db"
    new_store(db, [KEYBOARD_TASKS[0], KEYBOARD_TASKS[2]])
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "quin")
        for task, keys in ((1, ["1", "2", "space", "x", "s"]), (2, ["Backspace", "Enter", "e"])):
            wait_for_task(page, task)
            dialog = page.locator("#shortcuts")
            assert not dialog.is_visible()
            page.keyboard.press("?")
            assert dialog.is_visible()
            listed = dialog.locator("kbd").all_text_contents()
            assert all(key in listed for key in keys), listed
            page.keyboard.press("x")  # a shortcut does nothing while the list is open
            page.keyboard.press("Escape")
            assert not dialog.is_visible()
            assert page.locator("#task").get_attribute("data-task") == str(task)
            page.keyboard.press("s")
        page.wait_for_selector("text=Nothing left for you to label")
    assert [v.choice for v in stored_votes(db)] == ["skip", "skip"]
    page.close()


MARKDOWN = "**Bold** and `code`, a [link](https://example.org/a) and [bad](javascript:alert(1)).\n\n- one\n- two\n\x1b[2J"


def test_responses_show_markdown_made_safe_and_the_raw_text_on_demand(browser, tmp_path):
    """Responses are rendered Markdown (raw HTML as text, no image loaded, http(s) links only,
    controls made visible); "Show raw text" shows every response as written, and neither
    view runs the hostile one."""
    db = tmp_path / "labels.db"
    new_store(db, [("Format it.", [MARKDOWN, HOSTILE]), ("Again.", [MARKDOWN, "plain"])])
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "mo")
        wait_for_task(page, 1)
        shown = page.locator(".response .markdown").filter(has_text="Bold and")
        assert shown.locator("strong").text_content() == "Bold"
        assert shown.locator("code").text_content() == "code"
        assert shown.locator("li").count() == 2
        assert shown.locator("a").count() == 1
        assert shown.locator("a").get_attribute("href") == "https://example.org/a"
        assert "\\x1b[2J" in shown.inner_text()
        hostile = page.locator(".response .markdown").filter(has_text="onerror")
        assert SCRIPT in hostile.inner_text() and "<img src=x" in hostile.inner_text()
        assert page.locator(".response script, .response img").count() == 0
        assert not page.locator(".response pre.text").first.is_visible()

        page.get_by_label("Show raw text").check()
        raw = page.locator(".response pre.text")
        assert raw.first.is_visible() and not page.locator(".response .markdown").first.is_visible()
        assert sorted(raw.all_inner_texts()) == sorted(visible(t) for t in (MARKDOWN, HOSTILE))
        assert page.evaluate("window.__xss") is None
        page.keyboard.press("1")
        wait_for_task(page, 2)  # the choice holds from one task to the next
        assert page.get_by_label("Show raw text").is_checked()
        assert page.locator(".response pre.text").first.is_visible()
        page.get_by_label("Show raw text").uncheck()
        assert page.locator(".response .markdown").first.is_visible()
    assert not errors, errors
    page.close()


FLAG = """typo, 'quoted' "<b>twice</b>" & more"""  # the quotes of an HTML attribute, and tags


def test_a_changed_vote_comes_back_with_its_earlier_answers_filled_in(browser, tmp_path):
    """ "Change my last vote": the task comes back with the earlier rating, flag and ranking
    filled in again, and the earlier choice named; the vote sent then replaces it."""
    db = tmp_path / "labels.db"
    new_store(db, [KEYBOARD_TASKS[0], KEYBOARD_TASKS[2]])
    page = browser.new_page(viewport={"width": 1100, "height": 820})
    with serve_in_thread(db, labels_per_task=1) as url:
        sign_in(page, url, "cy")
        wait_for_task(page, 1)
        pair = slot_texts(page)
        page.locator('input[name="rating"][value="6"]').check()
        page.fill("#flag", FLAG)
        page.click('[data-choice="a"]')
        wait_for_task(page, 2)
        page.click("text=Change my last vote")
        wait_for_task(page, 1)
        assert page.locator('input[name="rating"]:checked').get_attribute("value") == "6"
        assert page.locator("#flag").input_value() == FLAG
        assert page.locator("#status").text_content() == "Your earlier vote: A is better"
        page.click('[data-choice="b"]')

        wait_for_task(page, 2)
        ranked = slot_texts(page)
        for key in ("2", "1", "3", "Enter"):
            page.keyboard.press(key)
        page.wait_for_selector("text=Nothing left for you to label")
        page.click("text=Change my last vote")
        wait_for_task(page, 2)
        assert page.locator("#order").text_content() == "2 > 1 > 3"
        assert (
            card_slots(page) == [1, 0, 2] and not page.locator("[data-action=submit]").is_disabled()
        )
        assert page.locator("#status").text_content() == "Your earlier vote: 2 > 1 > 3"
        assert page.locator('input[name="rating"]:checked').count() == 0
        page.keyboard.press("Enter")
        page.wait_for_selector("text=Nothing left for you to label")
    first, second = stored_votes(db)
    assert (first.task_id, first.rating, first.flag) == (1, 6, FLAG)
    assert KEYBOARD_TASKS[0][1][first.ranking[0]] == pair[1]  # B, the changed vote
    assert [KEYBOARD_TASKS[2][1][i] for i in second.ranking] == [ranked[s] for s in (1, 0, 2)]
    page.close()
