"""The failures rlhfkit anticipates, in the two kinds the command line tells apart, and the stop
it is told to make (`Terminated`).

`UsageError`: what the user gave cannot work - a data file, a model path, a reward function
spec, a length the model cannot hold. `rlhfkit` prints the message and exits with 2, as it
does for a bad option or config value (`config.ConfigError`). `RunError`: an anticipated
failure once the run is under way, such as a reward function that raises or returns no usable
score; exit code 1. Each message says what failed, where (file and line, field or option,
sample), what is allowed and what to do, so that no traceback is needed to act on it.

`require` and `check_literals` are the checks of a config's fields, with the message every
config gives (class, field, value, what is allowed); `config.require` raises its
`ConfigError` with them, the commands that load no ML library (`label serve`, `label export`)
a `UsageError`.

`disk_errors` turns a write's failure for a reason of the disk (told by errno) into a
`DiskWriteError` naming the file, the bytes and the space left, for every writer.
"""

import dataclasses
import errno
import math
import os
import re
import shutil
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal


class UsageError(ValueError):
    """Input that cannot work; the message names it, where it is and what is allowed."""


def require(
    config: object, field: str, ok: bool, allowed: str, error: type[Exception] = UsageError
) -> None:
    """Raise ``error`` naming the class, field, value and what is allowed unless ``ok``."""
    if not ok:
        value = getattr(config, field)
        raise error(
            f"{type(config).__name__}.{field} = {value!r} is not allowed: expected {allowed}"
        )


def check_literals(config: object, error: type[Exception] = UsageError) -> None:
    """Check every `Literal[...]` field of the dataclass ``config`` against its choices
    (jsonargparse does this on the command line, but not when the dataclass is built in
    Python)."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        choices = _literal_choices(hints[f.name])
        if choices is not None:
            ok = getattr(config, f.name) in choices
            require(config, f.name, ok, "one of " + ", ".join(map(repr, choices)), error)


def _literal_choices(hint: Any) -> tuple | None:
    """The values a `Literal[...]` (or `Literal[...] | None`) hint allows; None otherwise."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    args = typing.get_args(hint)
    if type(None) in args:
        literals = [a for a in args if typing.get_origin(a) is Literal]
        if len(literals) == 1:
            return (*typing.get_args(literals[0]), None)
    return None


class RunError(RuntimeError):
    """An anticipated failure during a run; the message names what failed and on what."""


class Terminated(BaseException):
    """The process was told to stop (SIGTERM: a scheduler's preemption or time limit, `kill`,
    torchrun passing on its own). No failure: a `BaseException`, as `KeyboardInterrupt` is, so
    that what records a failure lets it pass while every `finally` runs. The message says
    where the run stopped and what resumes it; `rlhfkit` prints it and exits with 143 (128 +
    SIGTERM), as a shell reports a process SIGTERM ended (`runtime/termination.py`)."""

    exit_code = 143


class NonFiniteError(RunError):
    """A training quantity (a loss, a gradient norm, a tensor of a rollout) came out NaN or
    inf. Raised where it is measured, which does not know the step; the training loop stops the
    run with the step and what to try (``trainers/loop.py``), before anything is saved from
    that state."""

    def __init__(self, quantity: str, value: float) -> None:
        super().__init__(f"{quantity} is {value}")
        self.quantity = quantity
        self.value = value


def require_finite(quantity: str, value: float) -> None:
    """A `NonFiniteError` naming ``quantity`` where ``value`` is NaN or inf."""
    if not math.isfinite(value):
        raise NonFiniteError(quantity, value)


class DamagedError(UsageError):
    """A directory rlhfkit wrote whose files no longer match its manifest (``checkpoint.py``):
    a file missing, of another size, or with other bytes. Names the directory, the file and
    which; the directory's writer knew what it held, so the damage came after."""

    def __init__(self, directory: object, name: str, reason: str) -> None:
        super().__init__(
            f"{directory}: {name} is damaged: {reason}. Use an intact copy (an earlier "
            "checkpoint of its run, or run the stage again); if you changed the file on purpose, "
            "delete manifest.json there to load the directory unchecked"
        )
        self.directory = directory
        self.name = name
        self.reason = reason


class DiskWriteError(RunError):
    """Writing a file failed for a reason of the disk (full, over a quota, read-only, an I/O
    error). Names the file, the bytes being written and the space left."""


# --------------------------------------------------------------------------- disk errors
_NOT_THE_DISK = (errno.ENOENT, errno.EISDIR, errno.ENOTDIR)  # a wrong path, not a failing disk


def _errno_of(error: BaseException) -> int | None:
    """The errno of an OSError, or of the one a Rust library wraps in an error of its own
    without one (safetensors: "I/O error: No space left on device (os error 28)")."""
    if isinstance(error, OSError):
        return error.errno
    found = re.search(r"I/O error: .*\(os error (\d+)\)", str(error))
    return int(found.group(1)) if found else None


def is_disk_error(error: BaseException) -> bool:
    """An OSError, or a library's wrapping of one, other than a wrong path; told by errno."""
    if isinstance(error, DiskWriteError):
        return False  # already told
    code = _errno_of(error)
    if code is None:
        return isinstance(error, OSError)
    return code not in _NOT_THE_DISK


def _free_bytes(path: Path) -> int | None:
    """Bytes free on the disk that holds `path` (its nearest existing ancestor)."""
    for folder in [path, *path.parents]:
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def disk_reason(path: Path, error: BaseException) -> str:
    """ "No space left on device (ENOSPC); 1,024 bytes free on its disk"."""
    code = _errno_of(error)
    reason = f"{os.strerror(code)} ({errno.errorcode.get(code, code)})" if code else str(error)
    free = _free_bytes(path)
    return reason + (f"; {free:,} bytes free on its disk" if free is not None else "")


@contextmanager
def disk_errors(path: str | Path, size: int | None = None) -> Iterator[None]:
    """A write of `size` bytes to `path`: its disk's failure as a `DiskWriteError` naming the
    file, the bytes and the space left."""
    try:
        yield
    except Exception as error:
        if not is_disk_error(error):
            raise
        what = f"{size:,} bytes" if size is not None else "bytes"
        reason = disk_reason(Path(path), error)
        raise DiskWriteError(f"writing {what} to {path} failed: {reason}") from error
