"""The labelling web app (Starlette, Jinja2 templates with autoescape): pages and a JSON API.

Pages, rendered on the server: `/login`, `/` (the next task, "nothing left" or "paused"),
`/progress` (by role, below), `/progress/tasks` (the admin's tasks and votes), `/guidelines`
(when `serve` was given some; the task page shows them too, folded); their forms POST to
`/login`, `/logout`, `/reopen` ("Change my last vote") and the admin's
`/progress/labellers` (Disable, Enable), `/progress/pause`, `/progress/assign` and
`/progress/decisions`.
The page's script (`static/label.js`) adds the keyboard, the ranking by clicks, and sends the
vote to the API with the UUID it made when the page was shown, retrying on a lost connection
with the same UUID; after a vote it loads `/` again for the next task. The API, which the
load test also drives:

    POST /api/login   {"name": ...} or {"token": ...}      -> {"labeller": ...} + session cookie
                      {"token": the admin token}           -> {"admin": true} + session cookie
    GET  /api/next                                         -> {"task": {...} or null, "progress"}
    POST /api/votes   {"id": UUID, "task": id, "choice": "rank" | "tie" | "bad" | "skip",
                       "order": [display slots best first] (rank), "rating": 1-7, "flag": text}
                                                           -> {"vote", "duplicate", "progress"}
    POST /api/votes/reopen                                 -> {"vote": the vote taken back}
                      (the labeller's latest vote is kept aside, `Store.replaced_votes`; its
                      task is their next again, with that vote as the task's `previous`)
    GET  /api/progress    a labeller: their own counts; the admin: every labeller's, agreement
    the admin's (`campaign.py`):
    GET  /api/tasks?labeller=&show=all|review|flagged|gold|decided&page=
                                                           -> {"tasks", "page", "pages", "total"}
    POST /api/decisions {"task", "choice": "rank" | "tie" | "bad" | "discard", "ranking":
                       [response indices best first] (rank), "note", "gold": bool} -> {"decision"}
    POST /api/pause   {"paused": bool}                      -> {"paused"}
    POST /api/assign  {"labellers": [...], "share": (0, 1], "overlap": n} -> {"assigned"}

Roles: a labeller sees their own progress only, never another's votes, names or counts (the
live agreement would tell them how the others voted on the tasks they share). The admin
(the organiser, signed in with the token `serve` prints at each start, or keeps in
`--admin_token_file`; the app holds it in memory, never in the database) sees the progress of
all, the agreement and every vote, and steers the campaign: disables a labeller, pauses,
assigns tasks, decides the tasks under review. The admin does not label.

Model text is shown safely: Jinja2 escapes every value, a response's Markdown is rendered by
the guidelines' safe renderer (raw HTML stays text), `display` makes control and bidi
characters visible (in the JSON too), the script sets only `textContent`, and the
Content-Security-Policy allows no inline script, so even a missed escape could not run one.
POSTs must come from the app's own origin (the Origin header, when a browser sends one) and
API POSTs must be JSON, which a cross-site form cannot send; the session cookie is HttpOnly
and SameSite=Strict, and named after the database, so that two servers on one machine (cookies
do not tell ports apart) do not sign each other out. Every request must name an allowed host:
an IP address, `localhost` or a name the server was given (its `--host`): a page whose name
an attacker re-points at 127.0.0.1 ("DNS rebinding") would otherwise be this app's own origin,
and could sign in by name and vote.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jinja2 import Environment, PackageLoader
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlhfkit.labelling.agreement import agreement
from rlhfkit.labelling.campaign import TASK_FILTERS, Campaign
from rlhfkit.labelling.display import prompt_turns, visible, visible_html
from rlhfkit.labelling.guidelines import render_response
from rlhfkit.labelling.store import CHOICES, LoginError, Shown, Store, Vote, VoteError

COOKIE_DAYS = 30
TASKS_PER_PAGE = 50  # the admin's tasks page
MAX_BODY = 64 * 1024

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make POSTs Origin: null
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    """ASGI middleware adding `SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def task_view(shown: Shown, show: Callable[[str], str] = str) -> dict[str, Any]:
    """A task as a page or the API shows it, responses in display order (slot 0 first) and
    every text passed through `show`: `visible` for JSON; the templates apply `visible_html`."""
    turns = [
        {"role": show(t["role"]) if t["role"] is not None else None, "content": show(t["content"])}
        for t in prompt_turns(shown.task.prompt)
    ]
    return {
        "id": shown.task.id,
        "k": shown.task.k,
        "prompt": turns,
        "responses": [show(text) for text in shown.responses],
        "previous": _previous_view(shown, show),
    }


def _previous_view(shown: Shown, show: Callable[[str], str]) -> dict[str, Any] | None:
    """The vote the labeller took back to change, as the page prefills it: the order as
    display slots best first (the labeller's own order, whatever the response indices)."""
    vote = shown.previous
    if vote is None:
        return None
    order = [shown.display.index(i) for i in vote.ranking] if vote.ranking else None
    flag = show(vote.flag) if vote.flag is not None else None
    return {"choice": vote.choice, "order": order, "rating": vote.rating, "flag": flag}


def vote_view(vote: Vote) -> dict[str, Any]:
    return {
        "id": vote.id,
        "task": vote.task_id,
        "labeller": visible(vote.labeller),
        "choice": vote.choice,
        "ranking": vote.ranking,
        "rating": vote.rating,
        "flag": visible(vote.flag) if vote.flag is not None else None,
    }


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": visible(message)}, status_code=status)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def cookie_name(db: str | Path) -> str:
    """The session cookie's name for the database `db`: one per database, so that servers of
    two databases on one machine keep their sessions apart."""
    return "rlhfkit_" + _digest(str(Path(db).resolve()))[:12]


class LabellingApp:
    """The routes of the app over one `Store`; `create_app` wraps it in Starlette."""

    def __init__(
        self,
        store: Store,
        labels_per_task: int,
        require_token: bool,
        admin_token: str | None,
        quota: int | None = None,
        guidelines: Markup | None = None,
    ):
        self.store = store
        self.campaign = Campaign(store)
        self.labels_per_task = labels_per_task
        self.require_token = require_token
        self.admin_token = admin_token
        self.quota = quota
        self.guidelines = guidelines
        self.cookie = cookie_name(store.path)
        self._admin_sessions: set[str] = set()  # digests of the admin's session secrets
        environment = Environment(
            loader=PackageLoader("rlhfkit.labelling", "templates"), autoescape=True
        )
        environment.filters["visible"] = visible_html
        environment.filters["markdown"] = render_response
        self.templates = Jinja2Templates(env=environment)

    # ---------------------------------------------------------------------------- helpers
    async def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """A store method on a worker thread (SQLite blocks; the event loop must not)."""
        return await run_in_threadpool(method, *args, **kwargs)

    async def _labeller(self, request: Request) -> str | None:
        return await self._call(self.store.labeller_of, request.cookies.get(self.cookie))

    def _is_admin(self, request: Request) -> bool:
        secret = request.cookies.get(self.cookie)
        return bool(secret) and _digest(secret) in self._admin_sessions

    async def _progress(self, labeller: str) -> dict[str, int]:
        return await self._call(
            self.store.labeller_progress, labeller, self.labels_per_task, self.quota
        )

    async def _next(self, labeller: str) -> Shown | None:
        return await self._call(self.store.next_task, labeller, self.labels_per_task, self.quota)

    def _page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("labeller", None)
        context.setdefault("admin", False)
        context["require_token"] = self.require_token
        context["guidelines"] = self.guidelines
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    async def _sign_in(self, name: str | None, token: str | None) -> tuple[str, str | None]:
        """(session secret, labeller name), the name None for the admin."""
        if token and self.admin_token and hmac.compare_digest(token.strip(), self.admin_token):
            secret = secrets.token_urlsafe(24)
            self._admin_sessions.add(_digest(secret))
            return secret, None
        if not token and self.require_token:
            raise LoginError("this server asks for the token you were given")
        return await self._call(self.store.sign_in, name=name, token=token)

    def _with_session(self, response: Response, secret: str) -> Response:
        response.set_cookie(
            self.cookie, secret, max_age=COOKIE_DAYS * 86400, httponly=True, samesite="strict"
        )
        return response

    async def _overview(self) -> dict[str, Any]:
        """What the admin sees: tasks, votes per labeller (every labeller, disabled or not),
        and the agreement."""
        counts = await self._call(self.store.counts, self.labels_per_task)
        votes = await self._call(self.store.votes)
        disabled = await self._call(self.store.labellers)
        no_votes = dict.fromkeys(("votes", *CHOICES), 0)
        labellers = {
            name: {**counts["labellers"].get(name, no_votes), "disabled": off}
            for name, off in disabled.items()
        }
        accuracy = await self._call(self.campaign.accuracy, votes)
        assigned = await self._call(self.campaign.assigned)
        assignments = await self._call(self.campaign.assignments)
        for name, c in labellers.items():
            c["assigned"] = assigned.get(name, 0)
            c["check"] = accuracy.get(name)
        return {
            **counts,
            "labels_per_task": self.labels_per_task,
            "quota": self.quota,
            "labellers": {visible(name): c for name, c in labellers.items()},
            "agreement": agreement(votes).as_dict(),
            "paused": await self._call(self.campaign.paused),
            "review": len(await self._call(self.campaign.review_queue, votes)),
            "check_tasks": len(await self._call(self.campaign.gold)),
            "unassigned": counts["tasks"] - len(assignments),
        }

    async def _own_progress(self, labeller: str) -> dict[str, Any]:
        """What a labeller sees: their own votes by choice and the tasks left for them."""
        progress = await self._progress(labeller)
        return {**progress, **await self._call(self.store.choices_of, labeller)}

    # ------------------------------------------------------------------------------ pages
    async def home(self, request: Request) -> Response:
        if self._is_admin(request):
            return RedirectResponse("/progress", status_code=303)
        labeller = await self._labeller(request)
        if labeller is None:
            return RedirectResponse("/login", status_code=303)
        shown = await self._next(labeller)
        progress = await self._progress(labeller)
        if shown is None:
            done = "paused.html" if await self._call(self.campaign.paused) else "done.html"
            return self._page(request, done, labeller=labeller, progress=progress)
        return self._page(
            request, "label.html", labeller=labeller, progress=progress, task=task_view(shown)
        )

    async def guidelines_page(self, request: Request) -> Response:
        """The guidelines on a page of their own, for the signed in (404 when there are none)."""
        admin = self._is_admin(request)
        labeller = None if admin else await self._labeller(request)
        if not admin and labeller is None:
            return RedirectResponse("/login", status_code=303)
        if self.guidelines is None:
            return _error("this server was started without guidelines", 404)
        progress = await self._progress(labeller) if labeller is not None else None
        return self._page(
            request, "guidelines.html", labeller=labeller, admin=admin, progress=progress
        )

    async def login_page(self, request: Request) -> Response:
        """The sign-in form; the signed in (back to it with Back, say) go on to their page."""
        if self._is_admin(request) or await self._labeller(request) is not None:
            return RedirectResponse("/", status_code=303)
        return self._page(request, "login.html")

    async def login_form(self, request: Request) -> Response:
        form = await request.form()
        name, token = (form.get(key) for key in ("name", "token"))
        name = name if isinstance(name, str) else None  # not a file upload
        token = token if isinstance(token, str) else None
        try:
            secret, _ = await self._sign_in(name, token)
        except LoginError as error:
            return self._page(request, "login.html", status=401, error=str(error), name=name)
        return self._with_session(RedirectResponse("/", status_code=303), secret)

    async def logout(self, request: Request) -> Response:
        secret = request.cookies.get(self.cookie)
        if secret:
            self._admin_sessions.discard(_digest(secret))
            await self._call(self.store.sign_out, secret)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(self.cookie, httponly=True, samesite="strict")
        return response

    async def progress_page(self, request: Request) -> Response:
        if self._is_admin(request):
            overview = await self._overview()
            return self._page(request, "progress.html", admin=True, overview=overview)
        labeller = await self._labeller(request)
        if labeller is None:
            return RedirectResponse("/login", status_code=303)
        mine = await self._own_progress(labeller)
        return self._page(request, "mine.html", labeller=labeller, progress=mine)

    async def disable_form(self, request: Request) -> Response:
        """The admin's form on the progress page: disable (or enable again) a labeller."""
        if not self._is_admin(request):
            return _error("only the admin may disable a labeller", 403)
        form = await request.form()
        name, action = form.get("name"), form.get("action")
        if not isinstance(name, str) or action not in ("disable", "enable"):
            return _error("send a labeller's name and action=disable or enable", 422)
        try:
            await self._call(self.store.set_disabled, name, action == "disable")
        except LoginError as error:
            return _error(str(error), 404)
        return RedirectResponse("/progress", status_code=303)

    # ------------------------------------------------------------------ the admin's steering
    async def tasks_page(self, request: Request) -> Response:
        """The admin's list of tasks with every vote, filtered by labeller and by what the
        lead looks for (`campaign.TASK_FILTERS`), `TASKS_PER_PAGE` at a time, each with the
        form of a decision."""
        if not self._is_admin(request):
            return RedirectResponse("/login", status_code=303)
        listed = await self._listed_tasks(request, str)
        if isinstance(listed, Response):
            return listed
        names = await self._call(self.store.labellers)
        return self._page(
            request, "tasks.html", admin=True, names=list(names), filters=TASK_FILTERS, **listed
        )

    async def _listed_tasks(
        self, request: Request, show_text: Callable[[str], str]
    ) -> dict[str, Any] | Response:
        """The page of tasks the query asks for (``labeller``, ``show``, ``page`` from 1):
        its rows, the choices and the counts; or the error response naming a bad one."""
        labeller = request.query_params.get("labeller") or None
        show = request.query_params.get("show", "all")
        if show not in TASK_FILTERS:
            return _error(f"show={show!r}: expected one of {', '.join(TASK_FILTERS)}", 422)
        page = request.query_params.get("page", "1")
        if not page.isdigit() or int(page) < 1:
            return _error(f"page={page!r}: expected a page number from 1", 422)
        rows = await self._call(self.campaign.task_rows, labeller, show)
        first = (int(page) - 1) * TASKS_PER_PAGE
        return {
            "rows": [
                _task_row_view(row, show_text) for row in rows[first : first + TASKS_PER_PAGE]
            ],
            "chosen": {"labeller": labeller, "show": show},
            "page": int(page),
            "pages": max(-(-len(rows) // TASKS_PER_PAGE), 1),
            "total": len(rows),
            "first": first + 1,
        }

    async def decision_form(self, request: Request) -> Response:
        """The admin's decision on a task, from the tasks page: a ranking written as response
        numbers best first ("2 1 3"), or tie, bad or discard; a note; a check task or not."""
        if not self._is_admin(request):
            return _error("only the admin may decide on a task", 403)
        form = await request.form()
        fields = {key: form.get(key) for key in ("task", "choice", "order", "note", "gold")}
        if not all(isinstance(v, str | None) for v in fields.values()):
            return _error("send the decision as form fields", 422)
        try:
            task = int(fields["task"] or "")
            ranking = _numbers(fields["order"]) if fields["choice"] == "rank" else None
            await self._call(
                self.campaign.decide, task, fields["choice"], ranking, fields["note"],
                fields["gold"] == "on",
            )  # fmt: skip
        except ValueError as error:
            status = error.status if isinstance(error, VoteError) else 422
            return _error(str(error), status)
        # Back to the list as it was filtered: the path and query of the page the form was on.
        back = urlsplit(request.headers.get("referer", ""))
        query = f"?{back.query}" if back.path == "/progress/tasks" and back.query else ""
        return RedirectResponse(f"/progress/tasks{query}", status_code=303)

    async def assign_form(self, request: Request) -> Response:
        """The admin's Assign form of the progress page: a share (in percent) of the tasks
        given to no one yet, each to `overlap` of the labellers ticked, in turn (what
        `rlhfkit label assign` does)."""
        if not self._is_admin(request):
            return _error("only the admin may assign tasks", 403)
        form = await request.form()
        names = [name for name in form.getlist("labeller") if isinstance(name, str)]
        try:
            share = _number(form.get("share"), "share", float) / 100
            overlap = _number(form.get("overlap"), "overlap", int)
            await self._assign(names, share, overlap)
        except ValueError as error:
            return _error(str(error), 422)
        return RedirectResponse("/progress", status_code=303)

    async def _assign(self, names: list[str], share: float, overlap: int) -> dict[str, list[int]]:
        if not 0 < share <= 1:
            raise ValueError(f"share {100 * share:g}%: give a percentage above 0, at most 100")
        tasks = await self._call(self.campaign.unassigned_share, share, 0)
        return await self._call(self.campaign.assign_in_turn, tasks, names, overlap)

    async def api_assign(self, request: Request) -> Response:
        payload = await self._admin_payload(request, "assign tasks")
        if isinstance(payload, Response):
            return payload
        names, share, overlap = (payload.get(k) for k in ("labellers", "share", "overlap"))
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            return _error("labellers is a list of names", 422)
        if type(share) not in (int, float) or type(overlap) is not int:
            return _error("share is a number in (0, 1] and overlap an integer", 422)
        try:
            given = await self._assign(names, float(share), overlap)
        except ValueError as error:
            return _error(str(error), 422)
        return JSONResponse({"assigned": {visible(name): ids for name, ids in given.items()}})

    async def pause_form(self, request: Request) -> Response:
        """The admin's Pause / Resume button of the progress page."""
        if not self._is_admin(request):
            return _error("only the admin may pause the labelling", 403)
        form = await request.form()
        await self._call(self.campaign.set_paused, form.get("action") == "pause")
        return RedirectResponse("/progress", status_code=303)

    async def api_tasks(self, request: Request) -> Response:
        if not self._is_admin(request):
            return _error("only the admin sees every task's votes", 403)
        listed = await self._listed_tasks(request, visible)
        if isinstance(listed, Response):
            return listed
        counts = {key: listed[key] for key in ("page", "pages", "total")}
        return JSONResponse({"tasks": listed["rows"], **counts})

    async def _admin_payload(self, request: Request, doing: str) -> dict[str, Any] | Response:
        """The JSON object the admin sent, or the error response: 403 for anyone else."""
        if not self._is_admin(request):
            return _error(f"only the admin may {doing}", 403)
        return await _json_object(request)

    async def api_decide(self, request: Request) -> Response:
        payload = await self._admin_payload(request, "decide on a task")
        if isinstance(payload, Response):
            return payload
        task, note = payload.get("task"), payload.get("note")
        if type(task) is not int or not isinstance(note, str | None):
            return _error("task is a task id and note a text", 422)
        try:
            decision = await self._call(
                self.campaign.decide, task, payload.get("choice"), payload.get("ranking"),
                note, payload.get("gold") is True,
            )  # fmt: skip
        except VoteError as error:
            return _error(str(error), error.status)
        return JSONResponse({"decision": decision.as_dict(), "task": task})

    async def api_pause(self, request: Request) -> Response:
        payload = await self._admin_payload(request, "pause the labelling")
        if isinstance(payload, Response):
            return payload
        if type(payload.get("paused")) is not bool:
            return _error('send {"paused": true} or {"paused": false}', 422)
        await self._call(self.campaign.set_paused, payload["paused"])
        return JSONResponse({"paused": payload["paused"]})

    # -------------------------------------------------------------------------------- API
    async def api_login(self, request: Request) -> Response:
        payload = await _json_object(request)
        if isinstance(payload, Response):
            return payload
        name, token = payload.get("name"), payload.get("token")
        if not isinstance(name, str | None) or not isinstance(token, str | None):
            return _error("name and token are strings", 422)
        try:
            secret, labeller = await self._sign_in(name, token)
        except LoginError as error:
            return _error(str(error), 401)
        answer = {"admin": True} if labeller is None else {"labeller": visible(labeller)}
        return self._with_session(JSONResponse(answer), secret)

    async def api_next(self, request: Request) -> Response:
        labeller = await self._labeller(request)
        if labeller is None:
            return _error("not signed in", 401)
        shown = await self._next(labeller)
        return JSONResponse(
            {
                "task": task_view(shown, visible) if shown is not None else None,
                "progress": await self._progress(labeller),
                "paused": await self._call(self.campaign.paused),
            }
        )

    async def api_vote(self, request: Request) -> Response:
        labeller = await self._labeller(request)
        if labeller is None:
            return _error("not signed in", 401)
        payload = await _json_object(request)
        if isinstance(payload, Response):
            return payload
        task = payload.get("task")
        if type(task) is not int:
            return _error(f"task {task!r} is not a task id", 422)
        try:
            result = await self._call(
                self.store.record_vote,
                labeller,
                payload.get("id"),
                task,
                payload.get("choice"),
                payload.get("order"),
                payload.get("rating"),
                payload.get("flag"),
            )
        except VoteError as error:
            return _error(str(error), error.status)
        return JSONResponse(
            {
                "vote": vote_view(result.vote),
                "duplicate": result.duplicate,
                "progress": await self._progress(labeller),
            },
            status_code=200 if result.duplicate else 201,
        )

    async def reopen_form(self, request: Request) -> Response:
        """The "Change my last vote" button of the task and done pages: the page of its task."""
        labeller = await self._labeller(request)
        if labeller is not None:
            await self._call(self.store.reopen_last, labeller)
        return RedirectResponse("/", status_code=303)

    async def api_reopen(self, request: Request) -> Response:
        """Take back the labeller's latest vote: its task comes again, to vote anew."""
        labeller = await self._labeller(request)
        if labeller is None:
            return _error("not signed in", 401)
        vote = await self._call(self.store.reopen_last, labeller)
        if vote is None:
            return _error("you have no vote to change", 404)
        return JSONResponse({"vote": vote_view(vote), "progress": await self._progress(labeller)})

    async def api_progress(self, request: Request) -> Response:
        if self._is_admin(request):
            return JSONResponse(await self._overview())
        labeller = await self._labeller(request)
        if labeller is None:
            return _error("not signed in", 401)
        mine = await self._own_progress(labeller)
        return JSONResponse({"labeller": visible(labeller), "progress": mine})


def _task_row_view(row: dict[str, Any], show: Callable[[str], str]) -> dict[str, Any]:
    """A task of the admin's list with its votes: who chose what (a ranking as response
    numbers best first), the rating, the flag, the seconds it took; its decision and gold."""
    task, decision = row["task"], row["decision"]
    turns = prompt_turns(task.prompt)
    votes = [
        {
            "labeller": show(v.labeller),
            "choice": v.choice,
            "order": _numbered(v.ranking),
            "rating": v.rating,
            "flag": show(v.flag) if v.flag is not None else None,
            "seconds": round(v.seconds) if v.seconds is not None else None,
        }
        for v in row["votes"]
    ]
    return {
        "id": task.id,
        "k": task.k,
        "prompt": show(turns[-1]["content"]),
        "responses": [show(text) for text in task.responses],
        "votes": votes,
        "disagree": row["disagree"],
        "decision": decision and {**decision, "order": _numbered(decision["ranking"])},
        "gold": _numbered(row["gold"]),
    }


def _number(text: Any, field: str, kind: type) -> Any:
    """A form field's number, or a `ValueError` naming the field."""
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise ValueError(f"{field} {text!r} is not a number") from None


def _numbered(ranking: list[int] | None) -> list[int] | None:
    """Response indices as the numbers a person reads (1 for the first response)."""
    return [i + 1 for i in ranking] if ranking else None


def _numbers(order: str | None) -> list[int]:
    """Response numbers as the admin writes them ("2 1 3", "2>1>3", "2,1,3") as indices."""
    words = (order or "").replace(">", " ").replace(",", " ").split()
    if not words or not all(w.isdigit() for w in words):
        raise ValueError(f"order {order!r}: write the response numbers best first, as 2 1 3")
    return [int(w) - 1 for w in words]


async def _json_object(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or the error response that says why there is none."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return _error("send application/json", 415)
    try:
        payload = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        return _error("the body is not JSON", 400)
    except RecursionError:
        return _error("the body is nested too deeply", 400)
    if not isinstance(payload, dict):
        return _error("the body is not a JSON object", 422)
    return payload


LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def _host_name(host: str) -> str:
    """The name or address of a Host header, without its port and brackets, in lower case."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AllowedHosts:
    """ASGI middleware refusing a request whose Host header is not an IP address, a localhost
    name or one of `names`. A DNS-rebinding page reaches the server under the attacker's name;
    an address cannot be re-pointed, so an address is always allowed."""

    def __init__(self, app: ASGIApp, names: Iterable[str] = ()):
        self.app = app
        self.names = {*LOCAL_NAMES, *(_host_name(name) for name in names)}

    def allowed(self, host: str) -> bool:
        name = _host_name(host).rstrip(".")
        return name in self.names or name.endswith(".localhost") or _is_address(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not self.allowed(host):
                refusal = _error(f"host {host!r} is not one this server answers to", 400)
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SameOrigin:
    """ASGI middleware refusing a POST whose Origin header (browsers send one) is not the
    host it was sent to: another site's page cannot vote or sign in on a labeller's behalf."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode("latin-1")
            host = headers.get(b"host", b"").decode("latin-1")
            if origin and urlsplit(origin).netloc != host:
                await _error("cross-origin request refused", 403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    db: str | Path,
    *,
    labels_per_task: int = 1,
    require_token: bool = False,
    admin_token: str | None = None,
    hosts: Iterable[str] = (),
    quota: int | None = None,
    guidelines: Markup | None = None,
) -> Starlette:
    """The labelling app over the database `db` (made by `rlhfkit label prepare`).

    `labels_per_task`: votes (skips not counted) a task needs before it is no longer handed
    out. `require_token`: sign-in only with a token the operator issued (`Store.issue_token`),
    not with a bare name; what a server reachable beyond this machine needs. `admin_token`:
    the token that signs in as the admin (None: no admin). `hosts`: the host names the
    server answers to besides IP addresses and localhost. `quota`: the most tasks a labeller
    judges (skips not counted; None: no limit). `guidelines`: shown with every task and at
    `/guidelines`, HTML already made safe (`guidelines.read_guidelines`).
    """
    if labels_per_task < 1:
        raise ValueError(f"labels_per_task={labels_per_task}: expected an integer >= 1")
    if quota is not None and quota < 1:
        raise ValueError(f"quota={quota}: expected None or an integer >= 1")
    routes = LabellingApp(Store(db), labels_per_task, require_token, admin_token, quota, guidelines)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        routes.store.close()

    app = Starlette(
        routes=_routes(routes),
        max_body_size=MAX_BODY,
        lifespan=lifespan,
    )
    app.state.store = routes.store
    app.add_middleware(SameOrigin)
    app.add_middleware(AllowedHosts, names=hosts)
    app.add_middleware(SecurityHeaders)
    return app


def _routes(app: LabellingApp) -> list[Route | Mount]:
    """The pages, the admin's forms, the JSON API and the static files, by path."""
    return [
        Route("/", app.home),
        Route("/login", app.login_page, methods=["GET"]),
        Route("/login", app.login_form, methods=["POST"]),
        Route("/logout", app.logout, methods=["POST"]),
        Route("/reopen", app.reopen_form, methods=["POST"]),
        Route("/progress", app.progress_page),
        Route("/guidelines", app.guidelines_page),
        Route("/progress/labellers", app.disable_form, methods=["POST"]),
        Route("/progress/tasks", app.tasks_page),
        Route("/progress/decisions", app.decision_form, methods=["POST"]),
        Route("/progress/pause", app.pause_form, methods=["POST"]),
        Route("/progress/assign", app.assign_form, methods=["POST"]),
        Route("/api/tasks", app.api_tasks),
        Route("/api/decisions", app.api_decide, methods=["POST"]),
        Route("/api/pause", app.api_pause, methods=["POST"]),
        Route("/api/assign", app.api_assign, methods=["POST"]),
        Route("/api/login", app.api_login, methods=["POST"]),
        Route("/api/next", app.api_next),
        Route("/api/votes", app.api_vote, methods=["POST"]),
        Route("/api/votes/reopen", app.api_reopen, methods=["POST"]),
        Route("/api/progress", app.api_progress),
        Mount("/static", StaticFiles(packages=[("rlhfkit.labelling", "static")]), name="static"),
    ]
