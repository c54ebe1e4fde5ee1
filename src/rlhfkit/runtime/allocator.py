"""Keep freed tensor memory in the process on Linux CPUs, instead of handing it back to the kernel.

PyTorch's CPU tensors come from the C library's ``malloc``. With glibc's defaults a large
block comes from a fresh ``mmap`` (the threshold adapts, up to glibc's maximum,
``MMAP_THRESHOLD``), and the top of the heap is given back to the kernel once enough of it is
free. A training step allocates and frees the same activations, gradients and casts of a few
MiB every time, so step after step they are mapped again, and each 4 KiB of them costs a page
fault and a zero-fill by the kernel.

``retain_freed_memory`` sets glibc's two thresholds (``mallopt``) so that blocks below
``MMAP_THRESHOLD`` come from the heap and freed ones stay there for the next step. The
process's peak memory is unchanged; what it holds after a peak is not given back. ``jemalloc``
or ``tcmalloc``, with their PyTorch settings, do the same, but must be preloaded.

On ``benchmarks/bench_ppo.py``'s workload a policy update step then takes no page faults, and
both the step and the whole iteration are faster (fault counts and timings: docs/ppo.md, "Speed
on a CPU" and "Measured before 2026-11-24 on the 2-core CPU development machine").
``tests/test_allocator.py`` shows the faults going away on a plain GPT-2 training step.

Every trainer calls it with its device. A user's own malloc settings (``GLIBC_TUNABLES``
or ``MALLOC_*_`` variables) take precedence: the thresholds are then left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

import torch

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed on 64-bit systems
TRIM_THRESHOLD = 2**30
USER_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def retain_freed_memory(device: torch.device) -> bool:
    """Raise glibc's mmap and trim thresholds for this process, once, when ``device`` (the
    one a trainer runs on) is the CPU; whether they are set.

    Does nothing (returns False) for another device, off Linux with glibc, or when the user
    set malloc options."""
    return device.type == "cpu" and _set_thresholds()


@functools.cache
def _set_thresholds() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in USER_SETTINGS):
        logger.debug("malloc settings from the environment are kept")
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    done = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(
        M_TRIM_THRESHOLD, TRIM_THRESHOLD
    )
    return bool(done)
