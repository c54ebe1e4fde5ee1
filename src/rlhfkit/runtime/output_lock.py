"""One writer per output directory, and workers that stop when their launcher is gone.

The lock is ``run.lock`` in the output directory, held with ``flock`` by the run's main
process while it trains. The kernel lets go of it when that process ends, however it ends, so
a lock a killed run left is told apart from a held one without trusting a PID, which a
restarted container reuses. The file says who holds it (PID, host, start time, command) for
the messages: a second start is refused naming the holder, and a stale lock is taken over
with a warning naming the run that left it. The file is removed on release; a start that
opened it just before is made to look again (the lock must be on the file the path names).

Only the main process locks (``launch_lock``); a refusal is every process's error, said by
each, so that none waits in its first collective for a main process that left. The other
processes of a ``torchrun`` launch stop with it, or
when the launcher dies: its workers run in sessions of their own, so killing only
``torchrun`` leaves them training, and a start on the same directory would race them. Each
worker notes its parent, the launcher, when this module is imported, and the loop asks
``launcher_alive`` at every step boundary: a worker whose launcher died has a new parent.

Limits: ``flock`` is POSIX (without ``fcntl``, as on Windows, nothing is locked), and on a
network file system it holds across hosts only where the mount passes locks to the server
(NFSv4 does; ``local_lock=flock`` mounts do not).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rlhfkit.errors import RunError, UsageError, disk_errors
from rlhfkit.runtime.distributed import text_of_main_process

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
# The process that started this one, noted as early as possible: a launcher that dies
# before the loop first looks would otherwise be missed.
_PARENT_AT_START = os.getppid()


@contextmanager
def output_lock(output_dir: str | Path) -> Iterator[Path | None]:
    """Hold ``output_dir``'s lock for the block (creating the directory); yields the lock
    file (None where the platform cannot lock). A `UsageError` naming the holder where a
    live process holds it."""
    if fcntl is None:
        yield None
        return
    path = Path(output_dir) / LOCK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        directory = path.parent
        file = next(p for p in (directory, *directory.parents) if p.exists() and not p.is_dir())
        raise UsageError(
            f"output_dir {str(output_dir)!r}: {file} is a file, not a directory; give the path "
            "of a directory (it is made if it does not exist)"
        ) from error
    fd = _locked_fd(path)
    try:
        holder = json.dumps(_holder()).encode()
        with disk_errors(path, len(holder)):
            os.ftruncate(fd, 0)
            os.write(fd, holder)
            os.fsync(fd)
        yield path
    finally:
        path.unlink(missing_ok=True)  # before the close: no one locks a file being removed
        os.close(fd)


@contextmanager
def launch_lock(output_dir: str | Path, main_process: bool) -> Iterator[None]:
    """``output_lock`` held by the main process of a launch for the block; where it fails,
    every process raises its error (a `UsageError` for a refusal, else a `RunError`)."""
    with ExitStack() as held:
        failed: Exception | None = None
        if main_process:
            try:
                held.enter_context(output_lock(output_dir))
            except Exception as error:
                failed = error
        kind = "" if failed is None else "usage" if isinstance(failed, UsageError) else "run"
        said = text_of_main_process(f"{kind}:{failed or ''}")
        if failed is not None:
            raise failed
        kind, _, message = said.partition(":")
        if kind:
            raise (UsageError if kind == "usage" else RunError)(message)
        yield


def _locked_fd(path: Path) -> int:
    """A descriptor of ``path`` with its lock taken: a stale holder is named in a warning, a
    live one in a `UsageError`."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UsageError(_refusal(path, holder)) from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed it between our open and our lock: look again
    stale = _read_holder(fd)
    if stale:
        logger.warning(
            "%s: taking over the lock left by %s, which no longer runs (killed?); its "
            "checkpoints are this run's to resume",
            path.parent,
            _describe(stale),
        )
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _holder() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": " ".join(sys.argv),
    }


def _read_holder(fd: int) -> dict[str, object]:
    """What the lock file says of its holder ({} where it says nothing readable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 1 << 16) or b"{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, object]) -> str:
    """ "pid 123 on host h, started 2025-01-01 10:00:00 +0000 (rlhfkit sft ...)"."""
    if not holder:
        return "a run that left no record of itself"
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    text += f", started {holder['started']}" if holder.get("started") else ""
    return text + (f" ({holder['command']})" if holder.get("command") else "")


def _refusal(path: Path, holder: dict[str, object]) -> str:
    pid = holder.get("pid")
    stop = f"stop it (kill {pid})" if pid else "stop it"
    return (
        f"output_dir {str(path.parent)!r} is in use by another run: {_describe(holder)}, "
        f"which holds {path.name} there. Two runs writing one directory would mix their "
        f"checkpoints and metrics, so this one does not start. Wait for that run to end, "
        f"{stop} and resume, or give this run another output_dir"
    )


# --------------------------------------------------------------------------- the launcher
def launcher_pid() -> int | None:
    """The PID of the launcher (torchrun, or accelerate launch on several processes, which
    runs it) that started this process, or None when no launcher did: a run started from a
    shell goes on when the shell ends (nohup), as it always did."""
    return _PARENT_AT_START if "TORCHELASTIC_RUN_ID" in os.environ else None


def launcher_alive(pid: int) -> bool:
    """Whether the launcher ``pid`` is still this process's parent: a process whose parent
    dies is given another (init, or a subreaper)."""
    return os.getppid() == pid
