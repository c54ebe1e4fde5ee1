"""Stopping on SIGTERM without losing the steps since the last checkpoint.

Jobs are stopped with SIGTERM, then SIGKILL after a grace period: SLURM at a job's time limit
or on preemption (`KillWait`, 30 s by default; `--signal=TERM@120` warns two minutes early),
Kubernetes on eviction (`terminationGracePeriodSeconds`, 30 s), `kill`, and torchrun, which
passes its own SIGTERM on to its workers and kills them 30 s later. Python's default is to die
at once: every step since the last `save_every` lost, no `finally` run.

Two behaviours, each for a block of code in the main thread (elsewhere signals cannot be
handled, and both do nothing):

- `sigterm_raises`: SIGTERM raises `errors.Terminated` where the program is, as Ctrl-C raises
  `KeyboardInterrupt`, so cleanup runs (a run's lock, its tracker, a pipeline's arm processes)
  and the command exits with 143 and one line. The CLI holds it around every command.
- `sigterm_deferred`: the training loop's steps. SIGTERM only asks (`asked()`); the loop
  finishes the step, writes a checkpoint and raises `Terminated` itself, naming the
  checkpoint. A second SIGTERM raises at once.

Each restores the handler it found when its block ends.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rlhfkit.errors import Terminated

logger = logging.getLogger(__name__)

STOPPED = (
    "stopped by SIGTERM before this stage ended; its newest checkpoint, if it wrote one, "
    "resumes it: run the same command again"
)


@contextmanager
def _handling(handler: Callable) -> Iterator[bool]:
    """``handler`` as SIGTERM's for the block; yields whether it could be installed."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise(signum: int, frame: object) -> None:
    raise Terminated(STOPPED)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread for the block."""
    with _handling(_raise):
        yield


@contextmanager
def sigterm_deferred() -> Iterator[Callable[[], bool]]:
    """SIGTERM for the block only asks to stop: yields ``asked()``, which tells whether it
    did. A second SIGTERM raises `Terminated` at once; one the block did not act on raises it
    when the block ends."""
    asked = [False]

    def ask(signum: int, frame: object) -> None:
        if asked[0]:
            raise Terminated(STOPPED)
        asked[0] = True
        logger.warning(
            "SIGTERM: stopping after the step under way, with a checkpoint (a second SIGTERM "
            "stops at once, without one)"
        )

    with _handling(ask):
        yield lambda: asked[0]
    if asked[0]:
        raise Terminated(STOPPED)
