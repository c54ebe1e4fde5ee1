"""run_parallel: tasks overlap on shares of the intra-op threads, results come back in order,
the caller's thread count and gradient mode hold, errors reach the caller."""

import threading

import pytest
import torch

from rlhfkit.runtime.parallel import run_parallel


def test_tasks_overlap_each_on_one_thread_and_return_in_order(two_threads):
    # Both tasks must reach the barrier before either leaves it: one after the other, the
    # first would wait for the second until the timeout and the barrier would break.
    barrier = threading.Barrier(2, timeout=10)

    def task(name):
        def run():
            barrier.wait()
            return name, torch.get_num_threads(), threading.get_ident()

        return run

    results = run_parallel([task("a"), task("b")])
    assert [name for name, _, _ in results] == ["a", "b"]
    assert [threads for _, threads, _ in results] == [1, 1]
    assert len({results[0][2], results[1][2], threading.get_ident()}) == 3
    assert torch.get_num_threads() == 2


def test_disabled_single_task_or_too_few_threads_run_in_the_caller(two_threads):
    def where():
        return threading.get_ident(), torch.get_num_threads()

    here = (threading.get_ident(), 2)
    assert run_parallel([where, where], enabled=False) == [here, here]
    assert run_parallel([where]) == [here]
    torch.set_num_threads(1)
    assert run_parallel([where, where]) == [(threading.get_ident(), 1)] * 2


def test_the_callers_gradient_mode_reaches_the_tasks(two_threads):
    weight = torch.ones(3, requires_grad=True)

    def product():
        return (weight * 2).requires_grad

    with torch.no_grad():
        assert run_parallel([product, product]) == [False, False]
    assert run_parallel([product, product]) == [True, True]


def test_an_error_in_a_task_reaches_the_caller_and_the_thread_count_is_restored(two_threads):
    finished = []

    def fails():
        raise ValueError("task failed")

    def works():
        finished.append(True)
        return 1

    with pytest.raises(ValueError, match="task failed"):
        run_parallel([fails, works])
    assert finished == [True]  # the other task still ran to its end
    assert torch.get_num_threads() == 2
