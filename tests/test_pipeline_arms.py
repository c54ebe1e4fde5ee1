"""`parallel_arms`: DPO and the GRPO arm in processes of their own beside the reward model and
PPO, with real processes on the tiny model. They train exactly what the pipeline trains in
process; a failing arm stops the pipeline with its own message; a pipeline that stops first
stops them, and the next start resumes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import tiny_pipeline_config, write_pipeline_data
from rlhfkit import checkpoint as ckpt
from rlhfkit.errors import RunError, UsageError
from rlhfkit.evaluation.report import load_eval
from rlhfkit.pipeline import runners
from rlhfkit.pipeline.config import PipelineConfig
from rlhfkit.pipeline.run import run_pipeline

GRPO = {
    "max_steps": 2,
    "rollout_batch_size": 2,
    "batch_size": 8,
    "max_new_tokens": 8,
    "report_to": ["none"],
}
ARMS = ("dpo", "grpo")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny_data")
    write_pipeline_data(root)
    return root


@pytest.fixture(autouse=True)
def arm_processes_on_one_thread(monkeypatch):
    """The arm processes compute as this one does (conftest: one intra-op thread)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _config(run_dir: Path, data: Path, model: Path, **fields) -> PipelineConfig:
    """The tiny pipeline with a GRPO arm, so that both arms run."""
    return tiny_pipeline_config(run_dir, data, model, **{"grpo": GRPO, **fields})


def _weights(run: Path, stage: str) -> dict:
    return load_file(run / stage / "final" / "model.safetensors")


def test_arms_in_their_own_processes_train_what_the_pipeline_trains(
    tmp_path, tiny_data, tiny_model_dir
):
    serial = _config(tmp_path / "serial", tiny_data, tiny_model_dir)
    side = _config(tmp_path / "side", tiny_data, tiny_model_dir, parallel_arms=True)
    run_pipeline(serial)
    run_pipeline(side)

    for run in (serial.run_dir, side.run_dir):  # keep_checkpoints off: finished, then deleted
        for stage in ("sft", "reward", "ppo", *ARMS):
            assert ckpt.is_complete(run / stage) and not ckpt.checkpoint_dirs(run / stage)
    for stage in ARMS:
        expected, got = _weights(serial.run_dir, stage), _weights(side.run_dir, stage)
        assert expected.keys() == got.keys()
        assert all((expected[k] == got[k]).all() for k in expected), stage
        log = (side.run_dir / "arms" / f"{stage}.log").read_text()
        assert f"{stage}: done in" in log
    rows = load_eval(side.run_dir / "eval.json")["rows"]
    assert rows == load_eval(serial.run_dir / "eval.json")["rows"]
    assert [r["model"] for r in rows][:5] == ["base", "sft", "ppo", "dpo", "grpo"]

    timings = json.loads((side.run_dir / "pipeline.json").read_text())
    for stage in ARMS:  # the arm's own time and memory, as its process measured them
        own = json.loads((side.run_dir / "arms" / f"{stage}.json").read_text())
        assert own["seconds"] > 0 and own["peak_memory_gib"] > 0
        assert timings[stage] == {**own, "status": "done"}


def test_a_failing_arm_stops_the_pipeline_with_its_message(
    tmp_path, tiny_data, tiny_model_dir, monkeypatch
):
    module = tmp_path / "failing_reward.py"
    module.write_text("def score(prompts, completions, **kw):\n    raise ValueError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    grpo = {**GRPO, "reward_functions": ["failing_reward:score"]}
    config = _config(tmp_path / "run", tiny_data, tiny_model_dir, grpo=grpo, parallel_arms=True)

    with pytest.raises(RunError) as failure:
        run_pipeline(config)
    message = str(failure.value)
    assert "the grpo arm" in message and "boom" in message
    assert str(config.run_dir / "arms" / "grpo.log") in message
    assert "Traceback" not in message
    for stage in ("sft", "reward", "ppo", "dpo"):  # the rest ran to the end
        assert ckpt.is_complete(config.run_dir / stage)
    assert not (config.run_dir / "eval.json").exists()


def test_a_pipeline_that_stops_first_stops_its_arms_and_resumes_them(
    tmp_path, tiny_data, tiny_model_dir, monkeypatch, caplog
):
    config = _config(tmp_path / "run", tiny_data, tiny_model_dir, parallel_arms=True)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setitem(runners.RUNNERS, "reward", interrupted)
    caplog.set_level("INFO", logger="rlhfkit.pipeline.arms")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(config)
    for stage in ARMS:
        assert f"{stage}: its process stopped; the next start resumes it" in caplog.text
        assert not ckpt.is_complete(config.run_dir / stage)

    monkeypatch.undo()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_pipeline(config)
    for stage in ("reward", "ppo", *ARMS):
        assert ckpt.is_complete(config.run_dir / stage)
    assert (config.run_dir / "report.md").is_file()


def test_parallel_arms_are_refused_under_a_launcher(
    tmp_path, tiny_data, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = _config(tmp_path / "run", tiny_data, tiny_model_dir, parallel_arms=True)
    with pytest.raises(UsageError, match="parallel_arms"):
        run_pipeline(config)
    assert not (config.run_dir / "sft").exists()
