"""The GPU benchmark against TRL (benchmarks/gpu) keeps running on the current code: its
``--smoke`` shape (a tiny model, a few tokens) on the CPU, rlhfkit's side only, through
``run_all.sh`` as a GPU session calls it. TRL's side needs TRL on the import path and is run
on the GPU; rlhfkit's side is what changes with the library."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("ppo", "grpo", "dpo", "sft")


def run_all(tmp_path, **settings) -> subprocess.CompletedProcess:
    """``run_all.sh`` on the ``--smoke`` shape, rlhfkit's side, as a GPU session calls it."""
    env = {
        **os.environ,
        "SMOKE": "1",
        "LIBS": "rlhfkit",
        "PYTHON": sys.executable,
        "RESULTS": str(tmp_path / "results"),
        "ASSETS": "",
        "TMPDIR": str(tmp_path),
        **settings,
    }
    env.pop("OUT", None)
    done = subprocess.run(
        ["bash", "benchmarks/gpu/run_all.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_rlhfkit_side_of_the_gpu_bench_runs_every_workload(tmp_path):
    done = run_all(tmp_path)
    assert "FAILED" not in done.stdout, done.stdout
    for workload in WORKLOADS:
        result = json.loads((tmp_path / "results" / f"rlhfkit_{workload}.json").read_text())
        assert result["workload"] == workload
        assert len(result["sec_per_iter"]) >= 2
        assert all(seconds > 0 for seconds in result["sec_per_iter"])
        if workload in ("ppo", "grpo"):  # equal work: no response ends before the limit
            assert result["response_length_mean"] == result["response_length_expected"]
    summary = (tmp_path / "results" / "summary.md").read_text()
    assert all(f"| {workload} |" in summary for workload in WORKLOADS)


def test_a_bench_that_would_overrun_the_budget_is_skipped_and_said(tmp_path):
    done = run_all(tmp_path, BUDGET="1", WORKLOADS="ppo sft")
    assert "== rlhfkit ppo: skipped, it might not end within BUDGET=1s" in done.stdout
    assert "== rlhfkit sft: skipped" in done.stdout
    assert not (tmp_path / "results" / "rlhfkit_ppo.json").exists()
    assert (tmp_path / "results" / "summary.md").is_file()  # written all the same
