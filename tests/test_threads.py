"""CPU threads on a shared machine (runtime/threads.py): a busy neighbour is seen, a run takes
the cores it leaves free unless OMP_NUM_THREADS says otherwise, and a resumed run takes the
thread count its checkpoint recorded."""

import multiprocessing
import os
import threading
import time

import pytest
import torch

from rlhfkit.runtime import threads


def _spin() -> None:
    while True:
        pass


@pytest.mark.alone
def test_a_busy_neighbour_is_seen_and_this_processs_own_work_is_not():
    """Each against the load the machine had just before (a test may share it)."""
    before = threads.cores_busy_elsewhere(seconds=0.5)
    if before > os.cpu_count() - 1.5:
        pytest.skip(f"other processes keep {before:.1f} of {os.cpu_count()} cores busy")
    neighbour = multiprocessing.Process(target=_spin, daemon=True)
    neighbour.start()
    try:
        beside = threads.cores_busy_elsewhere(seconds=0.5)
    finally:
        neighbour.terminate()
        neighbour.join()
    stop = time.monotonic() + 0.7
    own = threading.Thread(
        target=lambda: [None for _ in iter(lambda: time.monotonic() < stop, False)]
    )
    own.start()
    try:
        busy_here = threads.cores_busy_elsewhere(seconds=0.5)
    finally:
        own.join()
    assert beside - before >= 0.6
    assert busy_here - before < 0.5


@pytest.fixture
def chooser(monkeypatch):
    """choose_threads as at a process's start, with OMP_NUM_THREADS unset and 4 threads; the
    busy cores it sees are the test's."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_looked", False)
    torch.set_num_threads(4)

    def choose(busy: float | None, device: str = "cpu") -> int:
        monkeypatch.setattr(threads, "cores_busy_elsewhere", lambda: busy)
        threads.choose_threads(torch.device(device))
        return torch.get_num_threads()

    return choose


@pytest.mark.parametrize("busy, taken", [(0.0, 4), (0.3, 4), (1.0, 3), (2.6, 1), (9.0, 1)])
def test_a_run_takes_the_cores_others_leave_free(chooser, busy, taken):
    assert chooser(busy) == taken


def test_the_first_choice_holds_for_the_process(chooser):
    assert chooser(3.0) == 1
    torch.set_num_threads(4)
    assert chooser(0.0) == 4  # not looked at again: the next stage of a pipeline keeps it
    assert torch.get_num_threads() == 4


def test_omp_num_threads_a_gpu_or_an_unknown_load_leave_torchs_choice(chooser, monkeypatch):
    assert chooser(None) == 4
    monkeypatch.setattr(threads, "_looked", False)
    assert chooser(3.0, device="cuda") == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert chooser(3.0) == 4


def test_a_resumed_run_takes_the_thread_count_of_its_checkpoint(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    threads.resume_threads(3, "checkpoint-4")
    assert torch.get_num_threads() == 3
    threads.resume_threads(None, "an older checkpoint")
    assert torch.get_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    threads.resume_threads(1, "checkpoint-4")
    assert torch.get_num_threads() == 3  # the user's setting wins
