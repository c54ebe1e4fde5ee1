"""Labelling: `rlhfkit label serve` as a real server on localhost. Tokens and a server killed
in the middle of votes, and the load test: 8 concurrent clients x 200 votes."""

import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from helpers import run_light_command
from rlhfkit.errors import UsageError
from rlhfkit.labelling.export import export_records
from rlhfkit.labelling.serve import ServeConfig, admin_token_of
from rlhfkit.labelling.store import Store


@contextmanager
def live_server(db, *args, port=0):
    """`rlhfkit label serve` on `port` (0: a free one) of 127.0.0.1: yields (url, process,
    output lines)."""
    cmd = [sys.executable, "-m", "rlhfkit.cli", "label", "serve", "--db", str(db)]
    cmd += ["--port", str(port)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:  # drain the pipe for as long as the server runs
        for line in process.stdout:
            lines.append(line)
            if "Labelling at " in line:
                started.set()
        started.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert started.wait(120), "".join(lines)
        match = re.search(r"Labelling at (http://127\.0\.0\.1:\d+/)", "".join(lines))
        assert match, "".join(lines)
        yield match.group(1), process, lines
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def make_db(path, n_tasks):
    store = Store(path, create=True)
    store.add_tasks([(f"Prompt {i}", [f"first {i}", f"second {i}"]) for i in range(n_tasks)])
    store.close()
    return path


def api(url, name=None, token=None):
    client = httpx.Client(base_url=url, timeout=30)
    response = client.post("/api/login", json={"name": name} if token is None else {"token": token})
    assert response.status_code == 200, response.text
    return client


def vote_next(client, vote_id=None):
    """Vote on the next task (the first shown response is better); None if none is left."""
    task = client.get("/api/next").json()["task"]
    if task is None:
        return None
    body = {"id": vote_id or str(uuid.uuid4()), "task": task["id"], "choice": "rank"}
    body["order"] = [0, 1]
    response = client.post("/api/votes", json=body)
    assert response.status_code == 201, response.text
    return body


def test_serve_beyond_this_machine_needs_tokens():
    with pytest.raises(UsageError, match="ServeConfig.labellers = \\[\\] is not allowed"):
        ServeConfig(host="0.0.0.0")
    assert not ServeConfig(host="0.0.0.0", labellers=["ann"]).local
    assert ServeConfig(host="localhost").local and ServeConfig(host="127.0.0.2").local
    with pytest.raises(UsageError, match="ServeConfig.host = 'no.such.host.invalid'"):
        ServeConfig(host="no.such.host.invalid")
    with pytest.raises(UsageError, match="ServeConfig.labellers"):
        ServeConfig(labellers=["ann\x1b"])


HEAVY = ("torch", "pandas", "pyarrow", "transformers", "datasets", "accelerate", "numpy")


def test_serving_imports_no_ml_library(tmp_path):
    """`rlhfkit label serve` parses its options, opens the database and builds the app without
    torch, pandas, pyarrow or transformers: it starts at once and stays small."""
    db = make_db(tmp_path / "l.db", 3)
    guidelines = tmp_path / "guidelines.md"
    guidelines.write_text("# Judge *honesty* first\n")
    args = ["--db", str(db), "--guidelines", str(guidelines), "--quota", "2"]
    script = (
        "import sys\n"
        "from rlhfkit.cli import parse_command\n"
        "from rlhfkit.labelling.app import create_app\n"
        "from rlhfkit.labelling.guidelines import read_guidelines\n"
        f"_, config = parse_command('label serve', {args!r})\n"
        "create_app(config.db, admin_token='x', hosts=config.hosts, quota=config.quota,\n"
        "           guidelines=read_guidelines(config.guidelines))\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_running_server_is_small_and_prints_an_admin_token(tmp_path):
    db = make_db(tmp_path / "l.db", 3)
    guidelines = tmp_path / "guidelines.md"
    guidelines.write_text("# Judge *honesty* first\n")
    with live_server(db, "--guidelines", str(guidelines), "--quota", "2") as (url, process, lines):
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        status = Path(f"/proc/{process.pid}/status").read_text()
        (token,) = re.findall(r"admin token \(.*\): (\S+)", "".join(lines))
        admin = api(url, token=token)
        assert admin.get("/api/progress").json()["tasks"] == 3
        assert admin.get("/api/progress").json()["quota"] == 2
        assert "quota: at most 2 tasks judged per labeller" in "".join(lines)
        assert "<h1>Judge <em>honesty</em> first</h1>" in admin.get("/guidelines").text
        assert httpx.get(f"{url}progress", follow_redirects=False).status_code == 303
    assert "libtorch" not in maps and "arrow" not in maps
    rss_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))
    assert rss_kb < 100 * 1024, f"{rss_kb} kB"


def test_tokens_and_votes_outlive_a_killed_server(tmp_path):
    """Tokens printed once sign in; killing the server (SIGKILL) while a labeller votes loses
    no vote they were told is stored; restarted, it keeps the tokens and the labeller's place."""
    db = make_db(tmp_path / "l.db", 400)
    acknowledged, sent = [], []
    with live_server(db, "--labellers", "[ann, bob]") as (url, process, lines):
        output = "".join(lines)
        tokens = dict(re.findall(r"token of (\w+): (\S+)", output))
        assert sorted(tokens) == ["ann", "bob"] and "400 tasks in" in output
        assert httpx.post(f"{url}api/login", json={"name": "ann"}).status_code == 401
        client = api(url, token=tokens["ann"])
        assert client.get("/api/next").json()["progress"] == {"votes": 0, "left": 400}
        stop = threading.Event()

        def keep_voting() -> None:
            try:
                while not stop.is_set():
                    vote_id = str(uuid.uuid4())
                    sent.append(vote_id)
                    if vote_next(client, vote_id) is not None:
                        acknowledged.append(vote_id)
            except httpx.HTTPError:
                pass  # the server is gone

        voter = threading.Thread(target=keep_voting)
        voter.start()
        deadline = time.monotonic() + 60
        while len(acknowledged) < 20:
            assert voter.is_alive() and time.monotonic() < deadline, "the votes stopped"
            time.sleep(0.01)
        process.kill()  # SIGKILL: no shutdown, no checkpoint
        process.wait()
        stop.set()
        voter.join(30)
    stored = {v.id for v in Store(db).votes()}
    assert set(acknowledged) <= stored
    assert stored <= set(sent) and len(stored) - len(acknowledged) <= 1  # one in flight
    with live_server(db, "--labellers", "[ann]") as (url, _, lines):
        assert "token of ann: (has a token already" in "".join(lines)
        client = api(url, token=tokens["ann"])
        assert client.get("/api/next").json()["progress"]["votes"] == len(stored)
        assert vote_next(client) is not None
    votes = Store(db).votes()
    assert len(votes) == len(stored) + 1 and len({v.task_id for v in votes}) == len(votes)


@pytest.mark.slow
def test_load_8_clients_200_votes_each(tmp_path):
    """8 concurrent labellers vote 200 times each, every 10th vote sent twice (a retry):
    1,600 votes in the database and in the export, none duplicated, none lost."""
    clients, votes_each = 8, 200
    db = make_db(tmp_path / "load.db", votes_each)  # every client labels every task once

    def labeller(index: int, url: str) -> list[str]:
        client, sent = api(url, name=f"client{index}"), []
        for n in range(votes_each):
            body = vote_next(client)
            assert body is not None
            sent.append(body["id"])
            if n % 10 == 9:  # the answer was lost, say: the same vote again
                retry = client.post("/api/votes", json=body)
                assert retry.status_code == 200 and retry.json()["duplicate"], retry.text
        assert client.get("/api/next").json()["task"] is None
        return sent

    with live_server(db, "--labels_per_task", str(clients)) as (url, _, lines):
        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            sent = list(pool.map(labeller, range(clients), [url] * clients))
        seconds = time.perf_counter() - start
        (token,) = re.findall(r"admin token \(.*\): (\S+)", "".join(lines))
        progress = api(url, token=token).get("/api/progress").json()
    acknowledged = [vote_id for ids in sent for vote_id in ids]
    store = Store(db)
    votes = store.votes()
    assert len(acknowledged) == len(set(acknowledged)) == clients * votes_each
    assert sorted(v.id for v in votes) == sorted(acknowledged)
    assert Counter(v.task_id for v in votes) == dict.fromkeys(range(1, votes_each + 1), clients)
    assert len({(v.task_id, v.labeller) for v in votes}) == len(votes)
    assert progress["votes"] == len(votes) and progress["tasks_done"] == votes_each
    records, summary = export_records(store.tasks(), votes, "all")
    assert sorted(r["vote_ids"][0] for r in records) == sorted(acknowledged)
    assert summary["records"] == clients * votes_each
    requests = clients * (2 * votes_each + votes_each // 10 + 2)
    print(
        f"\nload: {clients} clients x {votes_each} votes = {len(votes)} votes "
        f"({requests} requests) in {seconds:.1f} s: {len(votes) / seconds:.0f} votes/s"
    )


@pytest.mark.slow
def test_8_clients_200_votes_each_through_two_kills(tmp_path):
    """The load test with the server killed (SIGKILL) twice mid-burst and restarted on its
    port: each client sends every vote until the server answers (the same id again after a
    lost answer), and every acknowledged vote is in the database exactly once."""
    clients, votes_each = 8, 200
    total = clients * votes_each
    db = make_db(tmp_path / "load.db", votes_each)
    args = ("--labels_per_task", str(clients))
    acknowledged: list[list[str]] = [[] for _ in range(clients)]
    retried = Counter()  # answers lost to a kill, then: 201 stored now, 200 stored before

    def until_answered(send):
        while True:
            try:
                return send()
            except httpx.TransportError:  # killed, or not back yet: the same request again
                time.sleep(0.05)

    def labeller(index: int, url: str) -> None:
        client = until_answered(lambda: api(url, name=f"client{index}"))
        while len(acknowledged[index]) < votes_each:
            response = until_answered(lambda: client.get("/api/next"))
            assert response.status_code == 200, response.text
            task = response.json()["task"]
            assert task is not None, f"client{index}: no task after {len(acknowledged[index])}"
            body = {"id": str(uuid.uuid4()), "task": task["id"], "choice": "rank"}
            body["order"] = [0, 1]
            tries = 0

            def post(body=body):
                nonlocal tries
                tries += 1
                return client.post("/api/votes", json=body)

            response = until_answered(post)
            assert response.status_code in (200, 201), response.text
            if tries > 1:
                retried[response.status_code] += 1
            acknowledged[index].append(body["id"])

    def done() -> int:
        return sum(map(len, acknowledged))

    def check_labellers() -> None:
        """A labeller that stopped with an error: raise it, with what the servers printed."""
        for future in futures:
            if future.done() and future.exception() is not None:
                printed = "".join(line for lines in outputs for line in lines)
                raise AssertionError(f"a labeller failed; the servers printed:\n{printed}") from (
                    future.exception()
                )

    kills_at, outputs = [], []
    with ExitStack() as servers:
        url, process, lines = servers.enter_context(live_server(db, *args))
        outputs.append(lines)
        port = int(url.rsplit(":", 1)[1].strip("/"))
        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            futures = [pool.submit(labeller, i, url) for i in range(clients)]
            for share in (1 / 3, 2 / 3):
                deadline = time.monotonic() + 300
                while done() < share * total:
                    check_labellers()
                    assert time.monotonic() < deadline, f"{done()} of {total} votes in 300 s"
                    time.sleep(0.005)
                process.kill()  # SIGKILL, mid-burst: no shutdown, no checkpoint
                process.wait()
                kills_at.append(done())
                restarted = servers.enter_context(live_server(db, *args, port=port))
                assert restarted[0] == url
                process = restarted[1]
                outputs.append(restarted[2])
            for future in futures:
                future.exception()  # waits
            check_labellers()
        seconds = time.perf_counter() - start
    ids = [vote_id for sent in acknowledged for vote_id in sent]
    votes = Store(db).votes()
    assert len(ids) == len(set(ids)) == total and all(0 < n < total for n in kills_at)
    assert sorted(v.id for v in votes) == sorted(ids)  # each acknowledged vote, once
    assert len({(v.task_id, v.labeller) for v in votes}) == len(votes) == total
    assert Counter(v.task_id for v in votes) == dict.fromkeys(range(1, votes_each + 1), clients)
    print(
        f"\nload with two kills: {clients} clients x {votes_each} votes = {len(votes)} votes "
        f"stored once each; killed after {kills_at[0]} and {kills_at[1]} acknowledged; "
        f"{sum(retried.values())} answers lost to a kill ({retried[200]} stored before it, "
        f"{retried[201]} after); {seconds:.1f} s in all"
    )


def test_an_admin_token_file_keeps_the_admin_signed_in_across_restarts(tmp_path):
    db = make_db(tmp_path / "l.db", 2)
    kept = tmp_path / "secrets" / "admin.token"
    tokens = []
    for start in range(2):
        with live_server(db, "--admin_token_file", str(kept)) as (url, _, lines):
            (token,) = re.findall(r"admin token \(([^;]*);.*\): (\S+)", "".join(lines))
            tokens.append(token[1])
            assert token[0] == f"{'read from' if start else 'kept in'} {kept}"
            assert api(url, token=token[1]).get("/api/progress").json()["tasks"] == 2
    assert tokens[0] == tokens[1] == kept.read_text().strip()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    kept.chmod(0o644)
    with pytest.raises(UsageError, match="others than its owner may read it"):
        admin_token_of(str(kept))
    kept.write_text("short")
    kept.chmod(0o600)
    with pytest.raises(UsageError, match="not a token"):
        admin_token_of(str(kept))


def test_label_export_loads_no_ml_library_and_exports_a_thousand_votes_at_once(tmp_path):
    """`rlhfkit label export` is a light command: a thousand votes out in well under the
    seconds importing torch alone would take."""
    db = make_db(tmp_path / "l.db", 500)
    store = Store(db)
    for name in ("ann", "bob"):
        store.sign_in(name=name)
        while (shown := store.next_task(name, 2, quota=500)) is not None:
            store.record_vote(name, str(uuid.uuid4()), shown.task.id, "rank", [0, 1])
    assert len(store.votes()) == 1000
    store.close()
    out = tmp_path / "prefs.jsonl"
    code, torch_loaded, seconds, log = run_light_command(
        ["label", "export", "--db", str(db), "--out", str(out)]
    )
    assert (code, torch_loaded) == (0, False), log[-2000:]
    assert seconds < 2.0
    assert len(out.read_text().splitlines()) == 1000
