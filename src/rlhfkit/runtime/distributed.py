"""The processes of a data-parallel run: which one this is, how many there are, and the two
collectives the algorithms need besides the gradients' (a sum and a gather).

The launcher (``torchrun``, ``accelerate launch``) starts the processes; accelerate's
``PartialState`` joins them into torch.distributed's default group (gloo on a CPU, NCCL on
GPUs) when the runtime is made. With one process every function here is the identity, so the
algorithms need no branch for it.

Random streams: each process samples from its own stream (``rank_seed``), so N processes do
not draw the same responses; process 0 keeps the run's seed, so one process samples exactly
what it did before data parallelism existed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist


def world_size() -> int:
    """Processes in the run (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's index, 0 to ``world_size() - 1``."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over every process (a new tensor; ``tensor`` itself
    with one process)."""
    if world_size() == 1:
        return tensor
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def mean_over_ranks(value: float) -> float:
    """The mean of a per-process number over every process (``value`` with one process)."""
    if world_size() == 1:
        return value
    total = sum_over_ranks(torch.tensor(value, dtype=torch.float64, device=_collective_device()))
    return total.item() / world_size()


def text_of_main_process(text: str) -> str:
    """``text`` as the main process (rank 0) has it, on every process (sent as UTF-8 bytes,
    nothing unpickled); ``text`` itself with one process."""
    if world_size() == 1:
        return text
    device = _collective_device()
    data = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
    length = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    if rank() != 0:
        data = torch.empty(int(length), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return bytes(data.tolist()).decode()


def _collective_device() -> str:
    """Where a collective's tensors live: NCCL (GPUs) works on the GPU only, gloo on the CPU."""
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def shares_over_ranks(counts: torch.Tensor) -> list[float]:
    """Each process's ``counts`` (M,) as a share of their sum over the processes, times the
    number of processes: the weights that turn the average of the processes' per-micro-batch
    means (what data parallelism's gradient averaging takes) into the mean over all their
    items. Exactly 1 each with one process."""
    counts = counts.double()
    return (counts * world_size() / sum_over_ranks(counts).clamp(min=1)).tolist()


def all_over_ranks(flag: torch.Tensor) -> bool:
    """Whether a 0-d boolean ``flag`` is true on every process (on the device collectives use
    for this backend: the GPU with NCCL)."""
    if world_size() == 1:
        return bool(flag)
    return int(sum_over_ranks(flag.to(torch.int32))) == world_size()


def gather_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """Every process's ``tensor`` (the same shape on each) concatenated along dim 0 in rank
    order: the rows of the whole batch, in the order one process would hold them."""
    if world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


_left_a_group = False  # set by leave_process_group: the group is gone, its threads may not be


def leave_process_group() -> None:
    """Wait for every process, then close the default process group, if there is one."""
    global _left_a_group
    if dist.is_available() and dist.is_initialized():
        _left_a_group = _left_a_group or dist.get_world_size() > 1
        dist.barrier()
        dist.destroy_process_group()


def was_in_a_group() -> bool:
    """Whether this process is, or was, one of several in a process group."""
    return _left_a_group or world_size() > 1


def exit_without_finalizing(code: int) -> NoReturn:
    """End this process with exit code ``code`` once its ``atexit`` functions have run and
    its output is flushed, skipping the interpreter's finalization.

    For a process that was one of several in a gloo group, whose work is all written by now.
    gloo's worker threads keep each collective's work object, and the tensors Python handed
    to it, for a moment after the collective has returned. A thread that lets go of the last
    of them while the interpreter is finalizing must take the GIL to free the tensors' Python
    objects; Python ends a thread that takes the GIL then, here inside a C++ destructor, so
    the process aborts ("terminate called without an active exception", signal 6) and the
    launcher reports a finished run as failed. The threads outlive ``destroy_process_group``
    (seen in a core dump of such an abort). Without finalization nothing is freed that way;
    the ``atexit`` functions (trackers' and logging's) still run, while the interpreter is
    whole."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream
            stream.flush()
    os._exit(code)


def rank_seed(seed: int, process: int) -> int:
    """The seed of process ``process``'s own random stream: ``seed`` on process 0, a
    well-mixed derivation of ``(seed, process)`` on the others (numpy's ``SeedSequence``)."""
    return seed if process == 0 else stream_seed(seed, process)


def stream_seed(seed: int, *key: int) -> int:
    """A seed that is a function of ``(seed, *key)`` alone: a batch keyed by its position in
    the data samples the same responses whichever process draws it, and after a resume."""
    return int(np.random.SeedSequence([seed, *key]).generate_state(1, np.uint64)[0] >> 1)
