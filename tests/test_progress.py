"""What a user watches: one bar per stage with its few metrics in a terminal, log messages
above it, no library bars; one line per log interval and no redraws off a terminal."""

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit import tracking
from rlhfkit.tracking import Tracker, format_metrics

RLHFKIT = Path(sys.executable).with_name("rlhfkit")  # the console script of this environment
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LIBRARY_BARS = ("Loading weights", "Writing model shards", "Map", "Generating")


def test_format_metrics_by_hand():
    assert format_metrics({"nll": 4.241791660345874, "perplexity": 69.52}) == (
        "nll 4.242, perplexity 69.52"
    )
    assert format_metrics({"lr": 9.665e-05, "steps": 3}) == "lr 9.665e-05, steps 3"


def test_off_a_terminal_each_log_is_one_line_of_the_watched_metrics(
    tmp_path, caplog, capsys, monkeypatch
):
    monkeypatch.setattr(tracking, "is_terminal", lambda: False)  # also under `pytest -s`
    caplog.set_level(logging.INFO, logger="rlhfkit.tracking")
    with Tracker(tmp_path, report_to=[]) as tracker:
        tracker.start_progress(4, desc="SFTTrainer", watch={"loss": "train/loss", "lr": "train/lr"})
        tracker.advance()
        tracker.log({"train/loss": 1.23456, "train/lr": 1e-4, "train/grad_norm": 3.0}, 2)
        tracker.log({"eval/nll": 2.0}, 2)  # nothing watched: no line
    assert [r.getMessage() for r in caplog.records] == [
        "SFTTrainer step 2/4: loss 1.235, lr 0.0001"
    ]
    assert capsys.readouterr().err == ""  # no bar
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train/grad_norm"] == 3.0  # every metric still recorded


def _sft_args(model_dir, tmp_path):
    demos = [{"prompt": f"Q: {i} plus one?", "response": f" A: {i + 1}"} for i in range(24)]
    data = tmp_path / "demos.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in demos))
    return [
        "sft", "--model", str(model_dir), "--train_data", str(data), "--eval_data", str(data),
        "--max_steps", "6", "--log_every", "2", "--eval_every", "3", "--batch_size", "4",
        "--max_length", "32", "--cpu", "true", "--report_to", "none",
        "--output_dir", str(tmp_path / "run"),
    ]  # fmt: skip


@pytest.mark.slow
def test_a_stage_in_a_terminal_draws_one_bar_with_log_lines_above_it(tiny_model_dir, tmp_path):
    pexpect = pytest.importorskip("pexpect")  # a test dependency; absent where only the runtime is
    args = _sft_args(tiny_model_dir, tmp_path)
    child = pexpect.spawn(
        str(RLHFKIT), args, encoding="utf-8", timeout=240, dimensions=(40, 160), cwd=tmp_path
    )
    child.expect(pexpect.EOF)
    child.close()
    out = ANSI.sub("", child.before)
    assert child.exitstatus == 0, out[-3000:]
    segments = [seg for line in out.split("\n") for seg in line.split("\r") if seg.strip()]
    bars = [seg for seg in segments if seg.startswith("SFTTrainer:")]
    assert bars and any("loss 5." in seg and ", lr " in seg for seg in bars)
    assert max(len(seg) for seg in bars) <= 160  # one terminal line, not a postfix of everything
    for seg in segments:  # a log message is never drawn into the bar, nor the bar into it
        if re.search(r" (INFO|WARNING) rlhfkit", seg):
            assert LOG_LINE.match(seg), seg
    assert any("eval step 3: nll " in seg for seg in segments)
    assert not [seg for seg in segments if seg.startswith(LIBRARY_BARS)]
    # The summary comes after the finished bar, which is not drawn again below it.
    # (With report_to none, the summary names no TensorBoard command: the run directory ends it.)
    assert out.rstrip().splitlines()[-1].strip().startswith("run directory:")


@pytest.mark.slow
def test_off_a_terminal_a_stage_writes_lines_without_redraws(tiny_model_dir, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", *_sft_args(tiny_model_dir, tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\r" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert all(LOG_LINE.match(line) for line in lines), lines
    progress = [line.split(": ", 1)[1] for line in lines if "SFTTrainer step" in line]
    assert [p.split(":")[0] for p in progress] == [f"SFTTrainer step {s}/6" for s in (2, 4, 6)]
    assert all(re.fullmatch(r".*: loss \d\.\d+, lr \S+", p) for p in progress), progress
    assert sum("eval step" in line for line in lines) == 2
    assert not any(bar in result.stderr for bar in LIBRARY_BARS)

    verbose = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", "--verbose", *_sft_args(tiny_model_dir, tmp_path),
         "--resume", "false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "Loading weights" in verbose.stderr  # --verbose shows them again
