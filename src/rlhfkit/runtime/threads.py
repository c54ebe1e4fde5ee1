"""CPU threads on a shared machine: one per core that other processes leave free.

torch runs each operation on one OpenMP thread per core, and an operation ends when its
slowest thread does. Where another process keeps a core busy (a second run, a browser, a
test suite), the thread on that core gets only part of it and every operation waits for it:
a run with all the cores' threads beside one busy neighbour is slower than the same run on
the cores left free (docs/results/README.md, "CPU threads"). So a run on a CPU looks once
at start-up, for a quarter of a second, at how busy the machine is (``/proc/stat``, less what
this process used) and takes as many threads as there are cores the others leave free, at
least one. Where ``OMP_NUM_THREADS`` is set (by the user, or by torchrun, which gives each of
several processes one thread), that is what runs. A neighbour that starts later is not seen:
set ``OMP_NUM_THREADS`` for a machine whose load changes. Where ``/proc/stat`` does not exist
(macOS, Windows), torch's own choice stands.

The number of threads changes how a CPU sums (each thread its share), so the last bits of a
run's results depend on it. A checkpoint records it, and a resumed run takes it again
(``resume_threads``) whatever the load then, so that it ends as the uninterrupted run would.
"""

from __future__ import annotations

import logging
import os
import time

import torch

logger = logging.getLogger(__name__)

LOOK_SECONDS = 0.25
_looked = False  # once per process: the stages of a pipeline keep the first stage's choice


def choose_threads(device: torch.device) -> None:
    """On a CPU without ``OMP_NUM_THREADS``, use the cores other processes leave free (once
    per process)."""
    global _looked
    if device.type != "cpu" or "OMP_NUM_THREADS" in os.environ or _looked:
        return
    _looked = True
    busy = cores_busy_elsewhere()
    if busy is None:
        return
    cores = torch.get_num_threads()
    threads = max(1, min(cores, round(cores - busy)))
    if threads < cores:
        torch.set_num_threads(threads)
        logger.info(
            "CPU threads: %d of %d, other processes keep %.1f cores busy "
            "(OMP_NUM_THREADS=N chooses)", threads, cores, busy,
        )  # fmt: skip


def resume_threads(recorded: int | None, checkpoint: object) -> None:
    """Take the thread count a run's ``checkpoint`` recorded, where ``OMP_NUM_THREADS`` does
    not say otherwise (on a CPU the sums of the steps to come depend on it)."""
    now = torch.get_num_threads()
    if recorded is None or recorded == now or "OMP_NUM_THREADS" in os.environ:
        return
    torch.set_num_threads(recorded)
    logger.info("CPU threads: %d, as the run that wrote %s (not %d)", recorded, checkpoint, now)


def cores_busy_elsewhere(seconds: float = LOOK_SECONDS) -> float | None:
    """Cores other processes kept busy over ``seconds``, on average; None where the machine
    does not say (no ``/proc/stat``)."""
    try:
        machine, own, start = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
        time.sleep(seconds)
        machine_used = busy_cpu_seconds() - machine
    except (OSError, ImportError):
        return None
    elapsed = time.perf_counter() - start
    return max(0.0, machine_used - (own_cpu_seconds() - own)) / elapsed


def busy_cpu_seconds() -> float:
    """Machine-wide busy CPU seconds since boot, every core (``/proc/stat``'s first line, less
    idle and iowait)."""
    with open("/proc/stat") as stat:
        values = [int(x) for x in stat.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds this process has used, every thread (user and system)."""
    import resource  # POSIX only

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
