"""`retain_freed_memory`: training steps on a CPU stop taking page faults, and a user's own
malloc settings win. `bound_held_memory` (`rlhfkit --bounded-memory`): one malloc arena."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from rlhfkit.runtime import allocator

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# Training steps of a GPT-2 the size of benchmarks/bench_ppo.py's, in a fresh process; prints
# the median page faults of a step after the first six (the heap grows in those).
STEPS = textwrap.dedent(
    """
    import resource, sys
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from rlhfkit.runtime.allocator import retain_freed_memory

    if sys.argv[1] == "retain":
        assert retain_freed_memory(torch.device("cpu"))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = GPT2Config(n_layer=4, n_head=4, n_embd=256, n_positions=64, vocab_size=4096)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 4096, (8, 46))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    faults = []
    for _ in range(16):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(sorted(faults[6:])[5])
    """
)


def median_faults_per_step(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in allocator.USER_SETTINGS}
    result = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, env=env, check=True
    )
    return float(result.stdout.split()[-1])


@glibc
def test_training_steps_take_no_page_faults_once_freed_memory_is_retained():
    # glibc's defaults map and fault in each step's larger activations and gradients again
    # (a median of 2,900-4,400 faults per step on this machine); with the thresholds raised they
    # stay in the heap (a median of 0 or 1; the heap still grows now and then).
    assert median_faults_per_step("retain") < 10


@glibc
def test_glibc_accepts_the_thresholds(monkeypatch):
    for name in allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert allocator._set_thresholds.__wrapped__()


@glibc
@pytest.mark.parametrize("name", allocator.USER_SETTINGS)
def test_a_users_malloc_settings_are_kept(monkeypatch, name):
    monkeypatch.setenv(name, "1")
    assert not allocator._set_thresholds.__wrapped__()


def test_only_a_cpu_trainer_changes_the_thresholds():
    assert not allocator.retain_freed_memory(torch.device("meta"))


# Two threads allocate and free blocks of a few MiB at once, in a fresh process; prints how
# many heaps (arenas) malloc holds, from glibc's malloc_info.
ARENAS = textwrap.dedent(
    """
    import ctypes, sys, tempfile, threading
    from rlhfkit.runtime.allocator import bound_held_memory

    if sys.argv[1] == "bound":
        assert bound_held_memory()
    start = threading.Barrier(2)

    def work():
        start.wait()
        for _ in range(200):
            ctypes.create_string_buffer(2**20)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
    libc.fclose.argtypes = (ctypes.c_void_p,)
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        print(open(out.name).read().count("<heap nr="))
    """
)


def malloc_heaps(mode: str, **env_changes: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in allocator.USER_ARENA_SETTINGS}
    result = subprocess.run(
        [sys.executable, "-c", ARENAS, mode],
        capture_output=True,
        text=True,
        env={**env, **env_changes},
        check=True,
    )
    return int(result.stdout.split()[-1])


@glibc
def test_bounded_memory_shares_one_malloc_arena_between_threads():
    assert malloc_heaps("default") > 1  # each thread that allocates gets an arena of its own
    assert malloc_heaps("bound") == 1


@glibc
def test_bounded_memory_keeps_a_users_arena_setting(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not allocator._set_arena_limit.__wrapped__()


def test_bounded_memory_shrinks_onednns_kernel_cache_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv(allocator.ONEDNN_CACHE, raising=False)
    allocator.bound_held_memory()
    assert os.environ[allocator.ONEDNN_CACHE] == str(allocator.ONEDNN_CACHE_CAPACITY)
    monkeypatch.setenv(allocator.ONEDNN_CACHE, "512")
    allocator.bound_held_memory()
    assert os.environ[allocator.ONEDNN_CACHE] == "512"


def test_the_cli_flag_bounds_memory_before_the_command_runs(monkeypatch):
    from rlhfkit import cli

    calls = []
    monkeypatch.setattr(allocator, "bound_held_memory", lambda: calls.append(True))
    with pytest.raises(SystemExit):
        cli.main(["--bounded-memory", "sft", "--help"])
    assert calls == [True]


def test_peak_resident_memory_counts_a_large_tensor():
    before = allocator.peak_resident_gib()
    block = torch.ones(2**28 // 4)  # 256 MiB, every page written
    after = allocator.peak_resident_gib()
    del block
    assert before > 0 and after - before >= 0.2  # no more than the process already peaked at
    assert allocator.peak_resident_gib() == after  # a high-water mark: freeing does not lower it


# A stage that allocates 512 MiB in blocks of 4 MiB (below the raised mmap threshold, so they
# come from malloc's heap, as a trainer's activations do) and frees them, run in a fresh
# process either alone ("alone": the process keeps what it freed) or as a pipeline step
# (`pipeline.run._run_step`, which gives it back after the step). Prints the resident MiB
# before the stage, at its end (blocks freed) and after the step.
STAGE = textwrap.dedent(
    """
    import sys
    import torch
    from rlhfkit.pipeline.rounds import Step
    from rlhfkit.pipeline.run import _run_step
    from rlhfkit.runtime.allocator import retain_freed_memory

    def resident_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    assert retain_freed_memory(torch.device("cpu"))
    held = []

    def stage():
        blocks = [torch.ones(2**20) for _ in range(128)]
        del blocks
        held.append(resident_mib())

    before = resident_mib()
    if sys.argv[1] == "alone":
        stage()
    else:
        _run_step(Step("stage", lambda: False, stage), "stage", {})
    print(before, held[0], resident_mib())
    """
)


def resident_around_a_stage(mode: str) -> tuple[float, float, float]:
    env = {k: v for k, v in os.environ.items() if k not in allocator.USER_SETTINGS}
    result = subprocess.run(
        [sys.executable, "-c", STAGE, mode], capture_output=True, text=True, env=env, check=True
    )
    before, held, after = map(float, result.stdout.split()[-3:])
    return before, held, after


@glibc
def test_a_pipeline_step_gives_back_what_its_stage_freed():
    before, held, after = resident_around_a_stage("alone")
    assert held - before > 400 and after - before > 400  # freed, but kept by the process
    before, held, after = resident_around_a_stage("step")
    assert held - before > 400  # the stage's blocks are held at its end...
    assert after - before < 50  # ...and given back once the step is over


@pytest.mark.cuda
def test_releasing_freed_memory_empties_the_cuda_cache():
    block = torch.ones(2**26, device="cuda")  # 256 MiB
    del block
    assert torch.cuda.memory_reserved() >= 2**28  # freed, but cached by PyTorch's allocator
    allocator.release_freed_memory()
    assert torch.cuda.memory_reserved() < 2**28
