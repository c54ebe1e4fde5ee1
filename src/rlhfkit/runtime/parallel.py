"""Independent model work on separate CPU cores.

On a CPU, PyTorch splits every operator over its intra-op threads. For the small matrices of
a small model the threads spend much of each operator starting, waiting and joining, so two
independent chains of work (the policy's and the critic's PPO updates, which share nothing
but their minibatches) finish sooner side by side, each on its own share of the threads, than
one after the other with all threads on every operator. Larger operators gain less: with
torch's own kernels the no-grad passes of a 32-sequence rollout kept two cores busy already,
and they gain side by side only because the table GELU's lookup runs on one thread and the
log-softmax blocks split badly (timings of both: docs/ppo.md, "Speed on a CPU").

Each task runs in a fresh Python thread. PyTorch fixes a thread's intra-op thread count when
the thread first runs a parallel operator, so threads started while the count is lowered
keep their share, and the caller's count is restored afterwards. Operators release the GIL,
so the tasks overlap in everything but their Python code. Each thread's results are
deterministic; they can differ from a run on all threads in float rounding only.

Gradient mode is thread-local in PyTorch; the tasks run in the caller's. So is autocast: a
task enters its own autocast context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def run_parallel(tasks: Sequence[Callable[[], T]], enabled: bool = True) -> list[T]:
    """The results of ``tasks``, run side by side on equal shares of the intra-op threads.

    Runs them one after the other, on all threads, when ``enabled`` is False, when there is
    one task, or when there are fewer threads than tasks. An exception in a task is raised
    here once every task has finished.
    """
    threads = torch.get_num_threads()
    if not enabled or len(tasks) < 2 or threads < len(tasks):
        return [task() for task in tasks]
    grad = torch.is_grad_enabled()

    def call(task: Callable[[], T]) -> T:
        with torch.set_grad_enabled(grad):
            return task()

    torch.set_num_threads(threads // len(tasks))
    try:
        with ThreadPoolExecutor(len(tasks), thread_name_prefix="rlhfkit") as pool:
            futures = [pool.submit(call, task) for task in tasks]
            return [future.result() for future in futures]
    finally:
        torch.set_num_threads(threads)
