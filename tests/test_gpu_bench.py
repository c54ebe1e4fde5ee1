"""The GPU session's script (benchmarks/gpu/run_all.sh) keeps running on the current code: its
``--dry-run`` starts every step on the CPU (tiny shapes, a few iterations, rlhfkit's side of
each benchmark, `pytest -m cuda` collected, the shipped pipeline from the bundled tiny model),
so that the GPU call does not fail on a typo. TRL's side needs TRL on the import path and is
run on the GPU; rlhfkit's side is what changes with the library."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("ppo", "grpo", "dpo", "sft")
SHAPES = ("gpt2", "qwen0.5b")


def run_all(tmp_path, *args: str, **settings) -> subprocess.CompletedProcess:
    """``run_all.sh`` as a GPU session calls it, rlhfkit's side."""
    unset = ("OUT", "ASSETS", "STEPS", "SMOKE", "BUDGET")
    env = {name: value for name, value in os.environ.items() if name not in unset}
    env |= {
        "LIBS": "rlhfkit",
        "PYTHON": sys.executable,
        "RESULTS": str(tmp_path / "results"),
        "TMPDIR": str(tmp_path),
        **settings,
    }
    done = subprocess.run(
        ["bash", "benchmarks/gpu/run_all.sh", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_the_dry_run_starts_every_step_and_writes_one_summary(tmp_path):
    done = run_all(tmp_path, "--dry-run")
    results = tmp_path / "results"
    assert "FAILED" not in done.stdout and "skipped" not in done.stdout, done.stdout
    steps = [json.loads(p.read_text()) for p in results.glob("*.step.json")]
    assert len(steps) == 1 + 2 * 4 + 1 + 2 + 1 and all(s["exit"] == 0 for s in steps), steps
    for shape in SHAPES:
        for workload in WORKLOADS:
            result = json.loads((results / f"rlhfkit_{shape}_{workload}.json").read_text())
            assert (result["shape"], result["workload"]) == (shape, workload)
            assert len(result["sec_per_iter"]) >= 2
            assert all(seconds > 0 for seconds in result["sec_per_iter"])
            if workload in ("ppo", "grpo"):  # equal work: no response ends before the limit
                assert result["response_length_mean"] == result["response_length_expected"]
    decode = json.loads((results / "decode_qwen0.5b.json").read_text())
    assert set(decode["variants"]) == {"rlhfkit", "bare", "hf-generate"}
    pipeline = json.loads((results / "smollm2" / "pipeline_run.json").read_text())
    assert pipeline["dry_run"] and pipeline["config"].endswith("instructions_smollm2_gpu.yaml")
    assert {"sft", "reward", "ppo", "dpo", "grpo", "eval"} <= set(pipeline["stages"])
    summary = (results / "summary.md").read_text()
    for shape in SHAPES:
        assert all(f"| {shape} | {workload} |" in summary for workload in WORKLOADS)
    assert "| fsdp_sft | 2 |" in summary and "| fsdp_grpo | 2 |" in summary
    assert summary.count("| yes |") == 2  # both FSDP checkpoints in the sharded layout
    assert "Sampling at the qwen0.5b shape" in summary and "| grpo |" in summary
    recorded = json.loads((results / "results.json").read_text())
    assert len(recorded) == 8 + 1 + 2 + 1 + len(steps)


def test_a_step_without_a_minute_of_the_budget_left_is_skipped_and_said(tmp_path):
    done = run_all(tmp_path, "--dry-run", BUDGET="1", STEPS="gpt2 smollm2")
    assert "== assets gpt2: skipped, " in done.stdout and "left of BUDGET=1s" in done.stdout
    assert "== smollm2: skipped, " in done.stdout
    assert not list((tmp_path / "results").glob("*.step.json"))
    assert (tmp_path / "results" / "summary.md").is_file()  # written all the same


def test_the_model_crosses_in_parts_one_device_call_at_a_time(tmp_path):
    """unpack.sh keeps each call's GGUF part until every part has come, then joins them and
    checks the SHA-256: the model a GPU session carries in calls of 64 MiB."""
    model = os.urandom(3000)
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "m.gguf").write_bytes(model)
    subprocess.run(["split", "-b", "1200", "-d", "-a", "2", "m.gguf", "m.gguf.part-"],
                   cwd=packed, check=True)  # fmt: skip
    sums = subprocess.run(["sha256sum", "m.gguf"], cwd=packed, capture_output=True, text=True)
    ferry = tmp_path / "ferry"
    found = []
    for part in ("00", "01", "02"):  # one part per call, each in a fresh copy of the tree
        tree = tmp_path / f"call{part}" / ".gpu" / "gguf"
        tree.mkdir(parents=True)
        (tree / "SHA256SUMS").write_text(sums.stdout)
        (tree / f"m.gguf.part-{part}").write_bytes((packed / f"m.gguf.part-{part}").read_bytes())
        script = f"source {ROOT}/benchmarks/gpu/unpack.sh && echo gguf=${{SMOLLM2_GGUF:-}}"
        call = subprocess.run(["bash", "-c", script], cwd=tree.parents[1], capture_output=True,
                              text=True, env={**os.environ, "FERRY": str(ferry)}, check=True)  # fmt: skip
        found.append((call.stdout.strip(), call.stderr.strip()))
    assert found[0] == ("gguf=", "unpack: m.gguf incomplete: parts 00 here so far")
    assert found[1] == ("gguf=", "unpack: m.gguf incomplete: parts 00 01 here so far")
    assert found[2] == (f"gguf={ferry / 'm.gguf'}", "")
    assert (ferry / "m.gguf").read_bytes() == model and not list(ferry.glob("*.part-*"))
