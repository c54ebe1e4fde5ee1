"""Keep freed tensor memory in the process on Linux CPUs, instead of handing it back to the
kernel, and bound how much of it the process holds.

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
both the step and the whole iteration are faster (how: docs/ppo.md, "Speed on a
CPU"; fault counts and timings: docs/results/ppo.md).
``tests/test_allocator.py`` shows the faults going away on a plain GPT-2 training step.

Every trainer calls it with its device. A user's own malloc settings (``GLIBC_TUNABLES``
or ``MALLOC_*_`` variables) take precedence: the thresholds are then left as they are.

``bound_held_memory`` (the CLI's ``--bounded-memory``) limits what is held that way, and must
run before the first model is loaded: later, the threads already have their arenas and
oneDNN its cache. Two things hold memory beyond the tensors:
- glibc gives each thread that allocates its own arena, and with the raised thresholds each
  arena keeps its freed blocks. The OpenMP workers and the two side-by-side threads
  (``parallel.py``) then each keep a heap of their own. One arena (``M_ARENA_MAX``) shares it.
- oneDNN, which runs bf16 matrix products on a CPU, keeps up to 1,024 compiled kernels with
  their scratch memory, one per shape it met, and padding-free passes meet many shapes.
  ``ONEDNN_CACHE_CAPACITY`` kernels are kept instead; oneDNN reads the setting when it
  compiles its first kernel.
The two save most together, and the single arena costs some speed (its lock is shared); what
each saves and costs: docs/ppo.md, "Peak memory". A user's own
``MALLOC_ARENA_MAX`` (or ``GLIBC_TUNABLES``) and ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` are kept.

``release_freed_memory`` gives back what a finished stage held: the pipeline calls it after
each stage, so that the next one's models do not come on top of the blocks the last one freed
but kept, and the pipeline's peak is about its largest stage's (docs/results/instructions.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import platform

import torch

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed on 64-bit systems
TRIM_THRESHOLD = 2**30
USER_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
USER_ARENA_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX")
ONEDNN_CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 128


def retain_freed_memory(device: torch.device) -> bool:
    """Raise glibc's mmap and trim thresholds for this process, once, when ``device`` (the
    one a trainer runs on) is the CPU; whether they are set.

    Does nothing (returns False) for another device, off Linux with glibc, or when the user
    set malloc options."""
    return device.type == "cpu" and _set_thresholds()


def bound_held_memory() -> bool:
    """One malloc arena for every thread and a smaller oneDNN kernel cache (module docstring),
    for the rest of the process; whether the arena limit is set (False off glibc, or when the
    user set their own). Call it before the first model is loaded."""
    os.environ.setdefault(ONEDNN_CACHE, str(ONEDNN_CACHE_CAPACITY))
    return _set_arena_limit()


@functools.cache
def _set_thresholds() -> bool:
    libc = _glibc(USER_SETTINGS)
    if libc is None:
        return False
    done = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(
        M_TRIM_THRESHOLD, TRIM_THRESHOLD
    )
    return bool(done)


@functools.cache
def _set_arena_limit() -> bool:
    libc = _glibc(USER_ARENA_SETTINGS)
    return libc is not None and bool(libc.mallopt(M_ARENA_MAX, 1))


def release_freed_memory() -> bool:
    """Give back to the system what the process freed but holds: Python's unreachable cycles
    collected, then every free page of glibc's heaps returned to the kernel (``malloc_trim``),
    and the CUDA caching allocator's unused blocks released (other processes on the GPU can use
    them). For the end of a stage: between training steps it would cost their speed. Returns
    whether glibc gave memory back (False off Linux with glibc)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def _glibc(user_settings: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The C library, if it is glibc and none of ``user_settings`` is in the environment."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    if any(name in os.environ for name in user_settings):
        logger.debug("malloc settings from the environment are kept")
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    return libc


def peak_resident_gib() -> float | None:
    """This process's peak resident memory so far, in GiB (the kernel's high-water mark);
    None where the platform does not tell (no ``resource`` module)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; bytes on macOS
    return peak / (2**30 if platform.system() == "Darwin" else 2**20)
