"""One writer per output directory, with real processes: a second start on a directory a
live run holds is refused naming it, a lock a killed run left is taken over, and a worker whose
launcher died stops at the next step instead of training on."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from rlhfkit.errors import RunError, UsageError
from rlhfkit.runtime import output_lock as lock
from rlhfkit.trainers import loop
from test_loop import _trainer

HOLD = """
import sys, time
from rlhfkit.runtime.output_lock import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """A process that holds the lock of ``tmp_path / "run"`` until killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_second_run_is_refused_naming_the_holder_and_a_stale_lock_is_taken_over(
    tiny_model_dir, tiny_tokenizer, tmp_path, holder, caplog
):
    run = tmp_path / "run"
    with pytest.raises(UsageError, match=f"in use by another run: pid {holder.pid} on host"):
        _trainer(tiny_model_dir, tiny_tokenizer, run, max_steps=1).train()
    assert sorted(p.name for p in run.iterdir()) == [lock.LOCK_FILE]  # nothing of its own

    holder.send_signal(signal.SIGKILL)  # killed: no clean-up, the lock file stays behind
    holder.wait()
    assert json.loads((run / lock.LOCK_FILE).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.WARNING):
        assert _trainer(tiny_model_dir, tiny_tokenizer, run, max_steps=1).train().complete
    assert f"taking over the lock left by pid {holder.pid}" in caplog.text
    assert not (run / lock.LOCK_FILE).exists()  # released at the end


def test_an_output_dir_that_is_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "taken").write_text("not a directory")
    for output_dir in (tmp_path / "taken", tmp_path / "taken" / "run"):
        refused = pytest.raises(UsageError, match=f"output_dir '{output_dir}': .*taken is a file")
        with refused, lock.output_lock(output_dir):
            pass
    assert (tmp_path / "taken").read_text() == "not a directory"


def test_one_process_cannot_take_its_own_held_lock_twice(tmp_path):
    with lock.output_lock(tmp_path) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with pytest.raises(UsageError, match=f"pid {os.getpid()}"), lock.output_lock(tmp_path):
            pass
    with lock.output_lock(tmp_path):  # released: free again
        pass


LAUNCHER = """
import os, subprocess, sys, time
worker = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], sys.argv[2]],
    env={**os.environ, "TORCHELASTIC_RUN_ID": "test"},
    start_new_session=True,  # as torchrun's workers: killing the launcher spares them
)
print(worker.pid, flush=True)
time.sleep(120)
"""
WORKER = """
import pathlib, sys, time
from rlhfkit.runtime.output_lock import launcher_alive, launcher_pid
pid = launcher_pid()
report = pathlib.Path(sys.argv[1])
report.write_text(f"watching {pid}")
while launcher_alive(pid):
    time.sleep(0.05)
report.write_text(f"stopped: {pid} is gone")
"""


def test_a_worker_sees_its_launcher_die(tmp_path):
    report = tmp_path / "worker.txt"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, WORKER, str(report)], stdout=subprocess.PIPE, text=True
    )
    worker_pid = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert report.read_text() == f"watching {launcher.pid}"
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker_pid), "the worker trained on without its launcher"
        assert report.read_text() == f"stopped: {launcher.pid} is gone"
    finally:
        if _alive(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by init, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_loop_stops_at_the_step_after_its_launcher_died(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    trainer = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=1)
    trainer.launcher = 4242
    monkeypatch.setattr(loop, "launcher_alive", lambda pid: trainer.state.step < 2)
    with pytest.raises(RunError, match="pid 4242 .* is gone, so the run stops before step 3"):
        trainer.train()
    assert trainer.state.step == 2
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
