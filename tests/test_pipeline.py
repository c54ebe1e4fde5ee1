"""The whole pipeline end to end on a tiny model and tiny data (tests/pipeline_tiny.yaml), and
its restart behaviour: finished stages are skipped, an interrupted one resumes."""

import json
import logging
import math
import shutil
from pathlib import Path

import pytest

from helpers import tiny_pipeline_config, write_jsonl, write_pipeline_data
from rlhfkit import checkpoint as ckpt
from rlhfkit.cli import main
from rlhfkit.config import ConfigError, load_config
from rlhfkit.evaluation.report import (
    EPISODE_COLUMNS,
    TABLE_COLUMNS,
    load_eval,
    overoptimization,
    overoptimization_sentence,
)
from rlhfkit.models.loading import RewardModel, ValueModel, load_causal_lm
from rlhfkit.pipeline.config import PipelineConfig, stage_configs
from rlhfkit.pipeline.run import run_pipeline

STAGES = ("sft", "reward", "ppo", "dpo", "eval")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """prompts/, sft/ and comparisons/ with train and test files, as the demo data has."""
    root = tmp_path_factory.mktemp("tiny_data")
    write_pipeline_data(root)
    return root


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_data, tiny_model_dir):
    # The checkpoints are kept so that the rerun test can interrupt PPO after its last one;
    # test_pipeline_arms runs the default, which deletes them.
    config = tiny_pipeline_config(
        tmp_path_factory.mktemp("run"), tiny_data, tiny_model_dir, keep_checkpoints=True
    )
    return config, run_pipeline(config)


def test_every_stage_leaves_a_loadable_model_and_the_report_is_filled(finished):
    config, report = finished
    run = config.run_dir
    for stage in ("sft", "ppo", "dpo"):
        assert ckpt.is_complete(run / stage)
        assert ckpt.checkpoint_dirs(run / stage)  # keep_checkpoints
        assert load_causal_lm(run / stage / "final").config.n_layer == 2
    assert RewardModel.from_pretrained(run / "reward" / "final").per_token is False
    assert ValueModel.from_pretrained(run / "ppo" / "final" / "critic").per_token is True

    result = load_eval(run / "eval.json")
    rows = result["rows"]
    assert [r["model"] for r in rows] == ["base", "sft", "ppo", "dpo", "best-of-4"]
    # all but IFEval's figures (the demo's prompts carry no IFEval columns) and the episodes'
    shown = [c for c in TABLE_COLUMNS[1:] if c not in EPISODE_COLUMNS]
    for row in rows:
        for column in [c for c in shown if not c.startswith("ifeval_")]:
            assert isinstance(row[column], float) and math.isfinite(row[column]), (row, column)
        assert not any(c.startswith("ifeval_") or c in EPISODE_COLUMNS for c in row)
    assert rows[1]["kl"] == 0.0 and rows[1]["win_rate_gold"] == 0.5  # SFT is the reference
    assert result["reward_model"]["pairs"] > 0

    text = report.read_text()
    for row in rows:
        assert f"| {row['model']} |" in text
    for png in ("gold_proxy_vs_kl", "sft", "reward", "ppo", "dpo"):
        assert (run / "plots" / f"{png}.png").stat().st_size > 0
        assert f"plots/{png}.png" in text
    points = [json.loads(line) for line in (run / "ppo_eval" / "metrics.jsonl").open()]
    assert [p["step"] for p in points] == [0, 1, 2]
    assert points[0]["kl"] == 0.0  # the SFT model against itself
    # The curve's last point is the table's PPO row: the same prompts (ppo_eval_prompts =
    # max_prompts), seed and precision, the live policy against the saved one.
    ppo_row = next(r for r in rows if r["model"] == "ppo")
    assert points[-1]["kl"] == pytest.approx(ppo_row["kl"], abs=1e-5)
    assert points[-1]["gold"] == pytest.approx(ppo_row["gold"], abs=1e-6)
    timings = json.loads((run / "pipeline.json").read_text())
    assert all(timings[s]["status"] == "done" and timings[s]["seconds"] > 0 for s in STAGES)
    peaks = [timings[s]["peak_memory_gib"] for s in STAGES]  # one process's high-water mark
    assert peaks[0] > 0 and peaks == sorted(peaks)


def test_rerun_skips_finished_stages_and_resumes_an_interrupted_one(finished, caplog):
    config, _ = finished
    run = config.run_dir
    finals = {s: (run / s / "final" / ckpt.STATE_FILE).stat().st_mtime for s in ("sft", "dpo")}
    caplog.set_level(logging.INFO, logger="rlhfkit.pipeline.run")
    run_pipeline(config)
    for stage in STAGES:
        assert f"{stage}: already done, skipped" in caplog.text
    assert finals == {s: (run / s / "final" / ckpt.STATE_FILE).stat().st_mtime for s in finals}

    # PPO interrupted after its last checkpoint, before writing final/: it resumes there,
    # makes no iteration again, and the evaluation is redone against the new PPO model.
    shutil.rmtree(run / "ppo" / "final")
    metrics_before = (run / "ppo" / "metrics.jsonl").read_text()
    caplog.clear()
    run_pipeline(config)
    assert "ppo: starting" in caplog.text and "eval: starting" in caplog.text
    assert "sft: already done, skipped" in caplog.text
    assert ckpt.is_complete(run / "ppo")
    assert (run / "ppo" / "metrics.jsonl").read_text() == metrics_before


def test_unknown_stage_field_is_named(tmp_path):
    config = PipelineConfig(output_dir=str(tmp_path), sft={"learning_rat": 1e-4})
    with pytest.raises(ConfigError, match="PipelineConfig.sft"):
        stage_configs(config)


@pytest.mark.parametrize("section", ["sft", "reward", "ppo", "dpo", "eval", "round_ppo"])
def test_a_stage_set_to_null_is_a_config_error(tmp_path, section):
    with pytest.raises(ConfigError, match=rf"PipelineConfig\.{section} = None .*grpo: null"):
        PipelineConfig(output_dir=str(tmp_path), **{section: None})


def test_a_stage_set_to_null_on_the_command_line_is_named(tmp_path, capsys):
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"output_dir: {tmp_path / 'run'}\nreward: null\n")
    with pytest.raises(SystemExit) as info:
        main(["pipeline", "--config", str(config)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "PipelineConfig.reward = None is not allowed" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_report_from_fake_results(tmp_path):
    from rlhfkit.evaluation.report import format_table, write_report

    stage = tmp_path / "ppo"
    write_jsonl(
        stage / "metrics.jsonl",
        [{"step": s, "train/score/mean": s / 10, "train/kl/ref": s} for s in (1, 2, 3)],
    )
    rows = [
        {"model": "sft", "gold": 0.1, "reward": 0.0, "kl": 0.0, "win_rate_rm": 0.5},
        {"model": "ppo", "gold": 0.4, "reward": 1.5, "kl": 3.2, "win_rate_rm": 0.8},
    ]
    result = {
        "rows": rows,
        "best_of_n": [
            {"n": 1, "kl": 0.0, "reward": 0.0, "gold": 0.1},
            {"n": 4, "kl": 0.64, "reward": 1.0, "gold": 0.3},
        ],
        "reward_model": {
            "pairs": 10,
            "accuracy": 0.7,
            "accuracy_gold": 0.8,
            "label_gold_agreement": 0.75,
        },
        "samples": [{"prompt": "It was", "responses": {"sft": {"text": " a | b", "gold": 0.5}}}],
        "config": {"max_prompts": 2},
    }
    points = [
        {"iteration": 0, "kl": 0.0, "reward": 0.0, "gold": 0.1},
        {"iteration": 3, "kl": 3.0, "reward": 1.4, "gold": 0.35},
    ]
    report = write_report(
        tmp_path,
        result,
        {"ppo": stage, "dpo": tmp_path / "missing"},
        ppo_points=points,
        timings={
            "sft": {"seconds": 1.5, "status": "done", "peak_memory_gib": 2.25},
            "reward": {"seconds": 2.0, "status": "done", "peak_memory_gib": 3.5},
            "report": {"seconds": 0.5, "status": "done"},
        },
    )
    text = report.read_text()
    assert "| ppo | 0.400 | 1.500 | 3.200 | 0.800 |" in text
    assert "accuracy against the gold judge's order: 0.800" in text
    assert "a \\| b **(+0.50)**" in text  # a '|' inside a sample stays in its cell
    assert (tmp_path / "plots" / "ppo.png").is_file() and not (
        tmp_path / "plots" / "dpo.png"
    ).exists()
    assert (tmp_path / "plots" / "gold_proxy_vs_kl.png").stat().st_size > 10_000
    assert "| sft | 1.500 | done | 2.250 |" in text and "| report | 0.500 | done | - |" in text
    assert "| total | 4.000 |  | 3.500 |" in text  # the most any stage's process held
    assert "No over-optimisation within this run: gold is highest at the last point" in text
    assert format_table([{"a": None, "b": 1}]).splitlines()[-1] == "| - | 1 |"


def test_overoptimization_is_found_and_stated():
    """Gao et al.'s picture in words: the point of highest gold, then after it the lowest gold
    among the points whose proxy is higher (the first points of a real H100 run, with made-up
    standard errors)."""
    points = [
        {"iteration": 0, "kl": 0.0, "reward": -0.606, "gold": 0.242, "gold_se": 0.03},
        {"iteration": 10, "kl": 5.305, "reward": -0.012, "gold": 0.188, "gold_se": 0.04},
        {"iteration": 20, "kl": 6.856, "reward": 0.026, "gold": 0.156, "gold_se": 0.04},
        {"iteration": 30, "kl": 5.726, "reward": 0.099, "gold": 0.195, "gold_se": 0.04},
    ]
    found = overoptimization(points)
    assert found["peak"] is points[0] and found["fall"] is points[2]
    assert found["z"] == pytest.approx(0.086 / 0.05)  # sqrt(0.03^2 + 0.04^2) = 0.05
    assert overoptimization_sentence(points) == (
        "Over-optimisation from the start: gold is highest at iteration 0 (KL 0.00, gold "
        "0.242), and by iteration 20 (KL 6.86) the proxy rose from -0.606 to 0.026 while gold "
        "fell from 0.242 to 0.156, 1.7 standard errors of the difference (within noise)."
    )

    def point(iteration, reward, gold):
        return {"iteration": iteration, "kl": iteration / 10, "reward": reward, "gold": gold}

    # A lower gold with a lower proxy is not over-optimisation; the later higher proxy is.
    middle = [point(0, 0.0, 0.1), point(8, 0.5, 0.3), point(16, 0.4, 0.2), point(24, 0.9, 0.25)]
    found = overoptimization(middle)
    assert found["peak"]["iteration"] == 8 and found["fall"]["iteration"] == 24
    assert found["z"] is None  # no standard errors given
    sentence = overoptimization_sentence(middle)
    assert sentence.startswith(
        "Over-optimisation after iteration 8 (KL 0.80, gold 0.300): by iteration 24"
    )
    assert sentence.endswith("(no standard errors recorded: it may be noise).")
    rising = [point(0, 0.0, 0.1), point(8, 0.5, 0.3)]
    assert overoptimization(rising)["fall"] is None
    assert overoptimization_sentence(rising).startswith("No over-optimisation within this run")
    falling_with_proxy = [point(0, 0.5, 0.3), point(8, 0.2, 0.1)]
    assert overoptimization_sentence(falling_with_proxy).startswith("Gold peaks at iteration 0")
    assert overoptimization([point(0, 0.0, None), point(8, 0.5, None)]) is None


def test_demo_config_is_valid_for_every_stage():
    from rlhfkit.pipeline.config import demo_config_path

    stages = stage_configs(load_config(PipelineConfig, demo_config_path(), output_dir="runs/x"))
    assert stages.ppo.model == stages.dpo.model == stages.eval.reference == "runs/x/sft/final"
    assert stages.ppo.reward_model == stages.eval.reward_model == "runs/x/reward/final"
    assert max(stages.eval.best_of_n) == 16
    assert stages.eval.max_prompt_length == stages.ppo.max_prompt_length  # prompts as PPO saw them
