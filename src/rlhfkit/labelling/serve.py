"""`rlhfkit label serve`: the labelling app (`app.py`) on uvicorn, until Ctrl-C.

On a loopback address (the default, 127.0.0.1) anyone at this machine may sign in with a
name. Listening anywhere else (0.0.0.0 for a team on the local network) needs tokens: each
name in `labellers` gets one the first time it is listed, printed once, and only tokens sign
in. The socket is bound before the URL is printed, so `--port 0` (a free port) prints the
port the server really has. Each start also prints a new admin token: signed in with it, the
organiser sees everyone's progress and the agreement, and steers the campaign (disables a
labeller, pauses, reviews disagreements, decides); `--admin_token_file` keeps that token
across restarts.
`--guidelines FILE.md` shows the organiser's guidelines with every task (`guidelines.py`
renders them, once, at start); `--quota N` gives each labeller at most N tasks to judge.

Serving a SQLite file needs no ML library: this module, the app and the store import neither
torch nor pandas, pyarrow or transformers, and `rlhfkit label serve` parses its options
without them (the command is `light` in `cli.COMMANDS`), so the server starts at once and
stays small (docs/results/labelling.md has the measurements). For the same reason the checks below
raise `UsageError` rather than `config.ConfigError`, with the same message.

This module is a command's front end, so it prints the URL and the tokens; the app logs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.errors import UsageError, require
from rlhfkit.labelling.guidelines import read_guidelines
from rlhfkit.labelling.store import MAX_NAME, LoginError, Store, check_name

logger = logging.getLogger(__name__)


def addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses `host` (a name or an address) stands for; none if it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def is_loopback(host: str) -> bool:
    """Whether `host` is on this machine only (127.0.0.0/8, ::1)."""
    found = addresses(host)
    return bool(found) and all(address.is_loopback for address in found)


@dataclass
class ServeConfig:
    """Serve the labelling web app on a labelling database, until Ctrl-C."""

    db: str = "runs/label/labels.db"
    """The labelling database (from `rlhfkit label prepare`)."""
    host: str = "127.0.0.1"
    """Address to listen on: 127.0.0.1 for this machine only; 0.0.0.0 (every interface) or
    this machine's address for a team, which then needs `labellers` (tokens)."""
    port: int = 8000
    """TCP port; 0 picks a free one (the URL printed says which)."""
    labels_per_task: int = 1
    """Votes (ties included, skips not) a task needs before it is no longer handed out; 2 or
    more gives the agreement between labellers."""
    labellers: list[str] = dataclasses.field(default_factory=list)
    """Names that sign in with a token: each one without a token gets one, printed once
    (only its hash is stored). Required when `host` is not a loopback address."""
    new_tokens: bool = False
    """Give `labellers` new tokens even if they have one (the old ones stop working)."""
    allowed_hosts: list[str] = dataclasses.field(default_factory=list)
    """Host names labellers may browse to besides IP addresses, localhost, `host` and, for
    0.0.0.0, this machine's name: a reverse proxy's name, say. Any other name is refused, so
    that a web page cannot re-point its own name at this server (DNS rebinding)."""

    quota: int | None = None
    """The most tasks a labeller is given to judge (ties and "all bad" count, skips not);
    None: no limit. The admin's progress page shows each labeller's count against it."""
    guidelines: str | None = None
    """A Markdown file of guidelines for the labellers, shown (folded) above every task and on
    a page of its own, `/guidelines`. Rendered safely: raw HTML is shown as text and only
    http(s) links are links."""
    admin_token_file: str | None = None
    """A file that keeps the admin token across restarts: read when it exists, else made with
    a new token (readable by its owner only). None: a new token at each start, printed."""

    def __post_init__(self) -> None:
        require(self, "db", bool(self.db), "a database file")
        require(self, "host", bool(addresses(self.host)), "an address or a host name")
        require(self, "port", 0 <= self.port <= 65535, "a TCP port in 0..65535 (0 = any free)")
        require(self, "labels_per_task", self.labels_per_task >= 1, "an integer >= 1")
        require(self, "quota", self.quota is None or self.quota >= 1, "None or an integer >= 1")
        require(
            self,
            "guidelines",
            self.guidelines is None or Path(self.guidelines).is_file(),
            "None or a Markdown file",
        )
        require(
            self,
            "labellers",
            all(_signs_in(name) for name in self.labellers),
            f"names of 1 to {MAX_NAME} printable characters",
        )
        require(
            self,
            "labellers",
            bool(self.labellers) or self.local,
            "at least one name when `host` is not a loopback address (beyond this machine, "
            "labellers sign in with tokens)",
        )

    @property
    def local(self) -> bool:
        """Whether the server can only be reached from this machine (names may sign in)."""
        return is_loopback(self.host)

    @property
    def hosts(self) -> list[str]:
        """The host names the server answers to (IP addresses and localhost are always)."""
        names = [self.host, *self.allowed_hosts]
        if ipaddress.ip_address(addresses(self.host)[0]).is_unspecified:
            names += [socket.gethostname(), socket.getfqdn()]  # what `_url` prints
        return names


def _signs_in(name: str) -> bool:
    try:
        check_name(name)
    except LoginError:
        return False
    return True


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (IPv4 or IPv6, whichever `host` is)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket, host: str) -> str:
    address, port = sock.getsockname()[:2]
    if ipaddress.ip_address(address.split("%")[0]).is_unspecified:
        address = socket.gethostname()  # 0.0.0.0 / :: is not an address to browse to
    elif ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}/"


def issue_tokens(store: Store, names: list[str], replace: bool) -> dict[str, str | None]:
    """New tokens of `names` by name; None for those who keep the token they have."""
    return {name: store.issue_token(name, replace=replace) for name in names}


def admin_token_of(path: str | None) -> tuple[str, bool]:
    """The admin token, and whether it was read from `path` (else it is new: written there,
    readable by its owner only, when `path` is given). A token file that is too short to be
    a token, or that others may read, is a `UsageError` naming it."""
    if path is None:
        return secrets.token_urlsafe(16), False
    file = Path(path)
    if file.exists():
        mode = file.stat().st_mode
        token = file.read_text(encoding="utf-8").strip() if file.is_file() else ""
        if len(token) < 16:
            raise UsageError(f"admin_token_file {path!r}: not a token of 16 characters or more")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(
                f"admin_token_file {path!r}: others than its owner may read it (mode "
                f"{stat.S_IMODE(mode):o}); chmod 600 it, or remove it for a new token"
            )
        return token, True
    token = secrets.token_urlsafe(16)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token, False


def run_serve(config: ServeConfig) -> None:
    """The `rlhfkit label serve` command: log the URL (and new tokens), serve until Ctrl-C."""
    import uvicorn

    from rlhfkit.labelling.app import create_app

    store = Store(config.db)
    try:
        tokens = issue_tokens(store, config.labellers, config.new_tokens)
        tasks = len(store.tasks())
    finally:
        store.close()
    guidelines = read_guidelines(config.guidelines) if config.guidelines else None
    admin_token, kept = admin_token_of(config.admin_token_file)
    app = create_app(
        config.db,
        labels_per_task=config.labels_per_task,
        require_token=not config.local,
        admin_token=admin_token,
        hosts=config.hosts,
        quota=config.quota,
        guidelines=guidelines,
    )
    sock = listening_socket(config.host, config.port)
    url = _url(sock, config.host)
    logger.info("%d task%s in %s", tasks, "s" * (tasks != 1), config.db)
    if config.quota is not None:
        logger.info("quota: at most %d tasks judged per labeller", config.quota)
    for name, token in tokens.items():
        shown = token if token is not None else "(has a token already; --new_tokens replaces it)"
        logger.info("token of %s: %s", name, shown)
    if config.admin_token_file is None:
        where = "this run only"
    else:
        where = f"{'read from' if kept else 'kept in'} {config.admin_token_file}"
    logger.info(
        "admin token (%s; sign in with it to see everyone's progress): %s", where, admin_token
    )
    logger.info("Labelling at %s (Ctrl-C stops)", url)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    )
    server.run(sockets=[sock])
