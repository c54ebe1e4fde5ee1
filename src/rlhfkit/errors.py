"""The failures rlhfkit anticipates, in the two kinds the command line tells apart, and the stop
it is told to make (`Terminated`).

`UsageError`: what the user gave cannot work - a data file, a model path, a reward function
spec, a length the model cannot hold. `rlhfkit` prints the message and exits with 2, as it
does for a bad option or config value (`config.ConfigError`). `RunError`: an anticipated
failure once the run is under way, such as a reward function that raises or returns no usable
score; exit code 1. Each message says what failed, where (file and line, field or option,
sample), what is allowed and what to do, so that no traceback is needed to act on it.
"""

import math


class UsageError(ValueError):
    """Input that cannot work; the message names it, where it is and what is allowed."""


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
