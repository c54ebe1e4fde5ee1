"""SIGTERM stops a run at the end of the step under way, with a checkpoint of that step, and
the run resumes from it to the model of an uninterrupted run: in-process, and through the
command line in a real process (one line, exit code 143, no lock or failure record left)."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import sigterm_after_steps
from rlhfkit import checkpoint as ckpt
from rlhfkit.errors import Terminated
from rlhfkit.runtime import termination
from rlhfkit.runtime.output_lock import LOCK_FILE
from rlhfkit.tracking import read_jsonl
from test_loop import _trainer, _weights


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_raises_in_the_block_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated, match="stopped by SIGTERM"), termination.sigterm_raises():
        _sigterm()
        time.sleep(5)  # not reached: the handler raises in the main thread
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_deferred_sigterm_asks_and_a_second_one_raises(caplog):
    with pytest.raises(Terminated), termination.sigterm_deferred() as asked:
        assert not asked()
        _sigterm()
        assert asked()  # asked, not raised: the step under way finishes
        assert "stopping after the step under way" in caplog.text
        _sigterm()
        pytest.fail("a second SIGTERM stops at once")


def test_a_deferred_sigterm_nobody_acted_on_raises_when_the_block_ends():
    with pytest.raises(Terminated), termination.sigterm_deferred():
        _sigterm()


def test_outside_the_main_thread_nothing_is_installed():
    import threading

    seen = []

    def worker():
        with termination.sigterm_deferred() as asked:
            seen.append((asked(), signal.getsignal(signal.SIGTERM)))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [(False, before)]


def _sigterm_in_step(trainer, step: int) -> None:
    """Send this process a SIGTERM while ``trainer`` computes step ``step``."""
    compute_loss = trainer.compute_loss
    sent = []

    def signalled(batch):
        if trainer.state.step == step - 1 and not sent:  # once: a step has 2 micro-batches
            sent.append(_sigterm())
        return compute_loss(batch)

    trainer.compute_loss = signalled


def test_sigterm_stops_after_the_step_with_its_checkpoint_and_resumes_exactly(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    straight = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "a")
    straight.train()

    run = tmp_path / "b"
    stopped = _trainer(tiny_model_dir, tiny_tokenizer, run, save_every=2)
    _sigterm_in_step(stopped, 3)
    with pytest.raises(Terminated, match=r"after step 3 of 6; .*checkpoint-3 resumes it"):
        stopped.train()
    assert stopped.state.step == 3  # the step under way finished, and no further one began
    assert ckpt.latest_checkpoint(run).name == "checkpoint-3"
    assert not (run / LOCK_FILE).exists() and not (run / "failed.json").exists()
    assert not (run / "final").exists()

    resumed = _trainer(tiny_model_dir, tiny_tokenizer, run, save_every=2)
    assert resumed.train().complete
    expected, got = _weights(straight), _weights(resumed)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_sigterm_in_the_last_step_leaves_a_checkpoint_that_finishes_the_run(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    stopped = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=2)
    _sigterm_in_step(stopped, 2)
    with pytest.raises(Terminated, match="after step 2 of 2"):
        stopped.train()
    assert not (tmp_path / "final").exists()
    assert _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=2).train().complete


def test_sigterm_to_the_command_stops_it_with_a_checkpoint_and_exit_code_143(
    tiny_model_dir, tmp_path
):
    data = tmp_path / "demos.jsonl"
    rows = [f'{{"prompt": "Say {i}", "response": " number {i}."}}\n' for i in range(16)]
    data.write_text("".join(rows))
    run = tmp_path / "run"
    command = [sys.executable, "-m", "rlhfkit.cli", "sft", "--model", str(tiny_model_dir),
               "--train_data", str(data), "--eval_data", "null", "--batch_size", "2",
               "--max_steps", "10000", "--log_every", "1", "--report_to", "none",
               "--cpu", "true", "--output_dir", str(run)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr = sigterm_after_steps(process, run)

    assert process.returncode == 143, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    step = ckpt.read_json(ckpt.latest_checkpoint(run) / ckpt.STATE_FILE)["step"]
    assert last == (
        f"rlhfkit sft: stopped by SIGTERM after step {step} of 10000; "
        f"{run / f'checkpoint-{step}'} resumes it: run the same command again"
    )
    assert "Traceback" not in stderr
    assert not (run / LOCK_FILE).exists() and not (run / "failed.json").exists()
    assert read_jsonl(run / "metrics.jsonl")[-1]["step"] == step  # no step after the one it saved
