"""The instructions task's pipeline (configs/instructions_smollm2.yaml) end to end on the tiny
test model and the bundled instructions data: every arm, GRPO included, trains a few steps;
the evaluation breaks the gold score down per constraint kind; the report shows the responses
side by side, escaped, and the pass rates. The GPU config is parsed and derived the same way;
the config of two rounds runs too, each round's PPO keeping its best policy on the validation
prompts. The stage configs of PPO on the checker read the pipeline's SFT model and are
evaluated on the test prompts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import ConfigError, SFTConfig, load_config
from rlhfkit.evaluation.evaluate import EvalConfig
from rlhfkit.evaluation.measures import PolicySamples, pass_rates, unasked_rates
from rlhfkit.evaluation.report import load_eval, write_report
from rlhfkit.pipeline.config import PipelineConfig, stage_configs
from rlhfkit.pipeline.rounds import round_summaries
from rlhfkit.pipeline.run import run_pipeline
from rlhfkit.tasks import BREAKDOWNS, INSTRUCTIONS_DATA_DIR
from rlhfkit.trainers.rl_config import RLConfig

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "instructions_smollm2.yaml"
GPU_CONFIG = CONFIG.with_name("instructions_smollm2_gpu.yaml")
ROUNDS_CONFIG = CONFIG.with_name("instructions_smollm2_rounds.yaml")
CHECKER_CONFIG = CONFIG.with_name("instructions_smollm2_ppo_checker.yaml")
CHECKER_EVAL_CONFIG = CONFIG.with_name("instructions_smollm2_ppo_checker_eval.yaml")
LETTER_CASE_SFT_CONFIG = CONFIG.with_name("instructions_smollm2_letter_case_sft.yaml")
LETTER_CASE_GRPO_CONFIG = CONFIG.with_name("instructions_smollm2_grpo_letter_case.yaml")
LETTER_CASE_EVAL_CONFIG = CONFIG.with_name("instructions_smollm2_grpo_letter_case_eval.yaml")
FEW = {"max_steps": 2, "batch_size": 4, "report_to": ["none"], "log_every": 1, "max_length": 96}
SMALL = {
    "sft": {**FEW, "eval_batch_size": 8, "max_train_samples": 8, "max_eval_samples": 4},
    "reward": {**FEW, "eval_batch_size": 8, "max_train_samples": 8, "max_eval_samples": 4},
    "dpo": {**FEW, "eval_batch_size": 8, "max_train_samples": 8, "max_eval_samples": 4},
    "ppo": {
        "max_steps": 2,
        "rollout_batch_size": 4,
        "batch_size": 4,
        "gradient_accumulation_steps": 1,
        "ppo_epochs": 1,
        "max_new_tokens": 8,
        "max_prompt_length": 64,
        "report_to": ["none"],
    },
    "grpo": {
        "max_steps": 2,
        "rollout_batch_size": 2,
        "batch_size": 8,
        "max_new_tokens": 8,
        "max_prompt_length": 64,
        "report_to": ["none"],
    },
    "eval": {
        "max_prompts": 6,
        "batch_size": 16,
        "best_of_n": [1, 2],
        "best_of_n_prompts": 2,
        "max_comparisons": 8,
        "num_samples": 3,
    },
}


def _config(run_dir: Path, model: Path) -> PipelineConfig:
    full = load_config(PipelineConfig, CONFIG)
    sections = {k: {**getattr(full, k), **v} for k, v in SMALL.items()}
    return load_config(
        PipelineConfig,
        CONFIG,
        output_dir=str(run_dir),
        base_model=str(model),
        ppo_eval_every=1,
        ppo_eval_prompts=2,
        **sections,
    )


@pytest.mark.parametrize(
    "config, data",
    [
        (CONFIG, INSTRUCTIONS_DATA_DIR.with_name("instructions_k8")),
        (GPU_CONFIG, INSTRUCTIONS_DATA_DIR.with_name("instructions_k8")),
    ],
    ids=["cpu", "gpu"],
)
def test_config_derives_every_arm_from_the_bundled_data(config, data):
    stages = stage_configs(load_config(PipelineConfig, config, output_dir="runs/x"))
    assert stages.grpo is not None
    assert stages.grpo.reward_functions == ["instructions"] and stages.grpo.reward_model is None
    assert stages.grpo.model == str(stages.sft.final_dir)
    assert set(stages.eval.models) == {"base", "sft", "ppo", "dpo", "grpo"}
    assert stages.eval.task == "instructions" and stages.eval.mixed_precision == "bf16"
    assert Path(stages.sft.train_data).resolve() == data / "sft"  # from the root


def test_the_rounds_config_chooses_each_round_s_policy_on_the_validation_prompts():
    stages = stage_configs(load_config(PipelineConfig, ROUNDS_CONFIG, output_dir="runs/x"))
    prompts = INSTRUCTIONS_DATA_DIR.with_name("instructions_k8") / "prompts"
    assert [r.number for r in stages.rounds] == [2] and stages.grpo is None
    for ppo in (stages.ppo, stages.rounds[0].ppo):
        assert ppo.metric_for_best_model == "eval/gold" and ppo.load_best_model_at_end
        assert ppo.gold_functions == ["instructions"] and ppo.eval_every == 12
        assert Path(ppo.eval_data).resolve() == prompts and ppo.eval_split == "validation"
    assert stages.rounds[0].policy_before == str(stages.ppo.final_dir)
    assert set(stages.eval.models) == {"base", "sft", "ppo", "dpo", "ppo_round2"}


def test_ppo_on_the_checker_starts_from_the_pipeline_s_sft_and_is_evaluated_on_test():
    sft = stage_configs(load_config(PipelineConfig, CONFIG)).sft
    ppo = load_config(RLConfig, CHECKER_CONFIG)
    assert ppo.model == ppo.critic_model == str(sft.final_dir) and ppo.critic == "separate"
    assert ppo.reward_model is None and ppo.reward_functions == ["instructions"]
    assert ppo.score_normalize == "scale" and ppo.kl_coef == 0.03
    prompts = INSTRUCTIONS_DATA_DIR.with_name("instructions_k8") / "prompts"
    assert Path(ppo.train_data).resolve() == Path(ppo.eval_data).resolve() == prompts
    assert (ppo.eval_split, ppo.max_eval_samples) == ("validation", None)
    assert ppo.metric_for_best_model == "eval/gold" and ppo.load_best_model_at_end
    evaluation = load_config(EvalConfig, CHECKER_EVAL_CONFIG)
    assert evaluation.models == {"sft": str(sft.final_dir), "ppo_checker": str(ppo.final_dir)}
    assert evaluation.reference == str(sft.final_dir) and evaluation.reward_model is None
    assert (evaluation.split, evaluation.max_prompts, evaluation.num_samples) == ("test", 256, 256)
    assert Path(evaluation.prompts).resolve() == prompts and evaluation.task == "instructions"


def test_grpo_from_the_letter_case_sft_is_the_pipeline_s_sft_on_more_demonstrations():
    pipeline_sft = stage_configs(load_config(PipelineConfig, CONFIG)).sft
    sft = load_config(SFTConfig, LETTER_CASE_SFT_CONFIG)
    data = INSTRUCTIONS_DATA_DIR.with_name("instructions_letter_case") / "sft"
    assert Path(sft.train_data).resolve() == Path(sft.eval_data).resolve() == data
    moved = {"output_dir", "train_data", "eval_data"}
    differ = {
        k
        for k, v in dataclasses.asdict(sft).items()
        if getattr(pipeline_sft, k) != v and k not in moved
    }
    assert not differ, differ  # every other field as the pipeline's own SFT stage
    grpo = load_config(RLConfig, LETTER_CASE_GRPO_CONFIG, defaults=RLConfig.preset_defaults("grpo"))
    assert grpo.model == str(sft.final_dir) and grpo.reference is None
    assert grpo.reward_model is None and grpo.reward_functions == ["instructions", "unasked_case"]
    assert grpo.reward_weights == [1.0, 0.5]  # the checker, and a charge for an unasked case
    assert (grpo.eval_split, grpo.max_eval_samples, grpo.eval_every) == ("validation", None, 40)
    assert grpo.metric_for_best_model == "eval/gold" and grpo.load_best_model_at_end
    assert grpo.gold_functions == ["instructions"]
    evaluation = load_config(EvalConfig, LETTER_CASE_EVAL_CONFIG)
    assert evaluation.models == {
        "sft": str(pipeline_sft.final_dir),
        "sft_letter_case": str(sft.final_dir),
        "grpo_letter_case": str(grpo.final_dir),
    }
    assert evaluation.reference == str(pipeline_sft.final_dir)
    assert (evaluation.split, evaluation.max_prompts, evaluation.task) == (
        "test",
        256,
        "instructions",
    )


def test_grpo_arm_needs_a_reward_without_a_task():
    with pytest.raises(ConfigError, match="PipelineConfig.grpo"):
        PipelineConfig(task=None, grpo={})
    assert PipelineConfig(task=None, grpo={"reward_functions": ["digits"]}).grpo


@pytest.mark.slow
def test_pipeline_runs_every_arm_and_reports_pass_rates(tmp_path, tiny_model_dir):
    config = _config(tmp_path / "run", tiny_model_dir)
    report = run_pipeline(config)
    run = config.run_dir
    for stage in ("sft", "reward", "ppo", "dpo", "grpo"):
        assert ckpt.is_complete(run / stage), stage
    result = load_eval(run / "eval.json")
    assert [r["model"] for r in result["rows"]] == [
        "base",
        "sft",
        "ppo",
        "dpo",
        "grpo",
        "best-of-2",
    ]
    for row in result["rows"]:
        assert 0.0 <= row["gold"] <= 1.0
    parts = result["pass_rates"]
    assert parts and parts[-1]["part"].startswith("all ")
    for row in parts:
        assert row["asked"] >= 1
        assert all(0.0 <= row[m] <= 1.0 for m in ("base", "sft", "ppo", "dpo", "grpo"))
    shapes = result["unasked"]
    assert [r["shape"] for r in shapes] == ["list", "lowercase", "uppercase"]
    for row in shapes:
        assert row["unasked"] >= 1
        assert all(0.0 <= row[m] <= 1.0 for m in ("base", "sft", "ppo", "dpo", "grpo"))
    text = report.read_text()
    assert "## Pass rate per part of the gold score" in text
    assert "## Shapes nobody asked for" in text
    assert "| grpo |" in text and (run / "plots" / "grpo.png").is_file()


def _samples(prompts: list[str], responses: list[str]) -> PolicySamples:
    return PolicySamples(prompts, responses, torch.ones(len(prompts)))


def test_pass_rates_count_each_kind_and_pool_held_out_ones():
    lower = "Describe a quiet river. Write your entire answer in lowercase letters."
    quoted = "Describe a quiet river. Put your whole reply inside double quotes."
    prompts = [lower, lower, quoted]
    named = {
        "a": _samples(
            prompts,
            ["the river runs slow and wide today.", "The River Runs.", "the river runs deep."],
        ),
        "b": _samples(
            prompts,
            ["the river is calm and quiet here.", "a calm quiet river.", '"the water is still."'],
        ),
    }
    rows = pass_rates(named, BREAKDOWNS["instructions"])
    assert [(r["part"], r["held_out"], r["asked"]) for r in rows] == [
        ("lowercase", False, 2),
        ("quotes", True, 1),
        ("all training parts", False, 2),
        ("all held-out parts", True, 1),
    ]
    assert [(r["a"], r["b"]) for r in rows] == [(0.5, 1.0), (0.0, 1.0), (0.5, 1.0), (0.0, 1.0)]


def test_unasked_rates_count_only_the_prompts_that_leave_a_shape_unasked():
    lower = "Describe a quiet river. Write your entire answer in lowercase letters."
    plain = "Describe a quiet river. Do not use any commas."
    bullets = "Describe a quiet river as a bulleted list of two items."
    prompts = [lower, plain, plain, bullets]
    named = {
        "a": _samples(
            prompts,
            ["the river is slow.", "the river is slow.", "- River\n- Bank", "- Slow\n- Wide"],
        ),
        "b": _samples(
            prompts,
            ["the river is slow.", "The river is slow.", "THE RIVER IS SLOW.", "- slow\n- wide"],
        ),
    }
    rows = unasked_rates(named, BREAKDOWNS["instructions"].unasked)
    assert rows == [
        {"shape": "list", "unasked": 3, "a": 1 / 3, "b": 0.0},
        {"shape": "lowercase", "unasked": 3, "a": 1 / 3, "b": 1 / 3},
        {"shape": "uppercase", "unasked": 3, "a": 0.0, "b": 1 / 3},
    ]


def test_a_guarded_response_misses_every_kind():
    prompt = "Describe a quiet river. Do not use any commas."
    assert BREAKDOWNS["instructions"].parts(prompt, "") == {"no_commas": False}
    assert BREAKDOWNS["instructions"].parts(prompt, "the river flows on and on.") == {
        "no_commas": True
    }


def test_report_escapes_constraint_text_in_the_side_by_side(tmp_path):
    hostile = "<<title>> <script>alert(1)</script> | end"
    result = {
        "rows": [{"model": "sft", "gold": 0.5}],
        "samples": [
            {
                "prompt": "Give a title in <<double brackets>>.",
                "responses": {"sft": {"text": hostile, "gold": 1.0}},
            }
        ],
        "pass_rates": [
            {"part": "title", "held_out": True, "asked": 1, "sft": 1.0},
            {"part": "all held-out parts", "held_out": True, "asked": 1, "sft": 1.0},
        ],
        "unasked": [{"shape": "lowercase", "unasked": 3, "sft": 1 / 3}],
        "config": {},
    }
    text = write_report(tmp_path, result, {}).read_text()
    assert "<script>" not in text and "<<title>>" not in text
    assert "\\| end" in text
    assert "| title | yes | 1 | 1.000 |" in text
    assert "| lowercase | 3 | 0.333 |" in text


@pytest.mark.slow
def test_the_rounds_config_runs_and_each_round_ends_with_its_best_policy(tmp_path, tiny_model_dir):
    full = load_config(PipelineConfig, ROUNDS_CONFIG)
    sections = {k: {**getattr(full, k), **v} for k, v in SMALL.items() if k != "grpo"}
    best = {"eval_every": 1, "max_eval_samples": 2}
    sections["ppo"].update(best)
    config = load_config(
        PipelineConfig,
        ROUNDS_CONFIG,
        output_dir=str(tmp_path / "run"),
        base_model=str(tiny_model_dir),
        ppo_eval_every=0,
        prompts_per_round=4,
        responses_per_prompt=2,
        round_reward={**full.round_reward, **FEW},
        round_ppo={**full.round_ppo, **SMALL["ppo"], **best},
        **sections,
    )
    report = run_pipeline(config)
    kept = []
    for ppo in (config.run_dir / "ppo", config.run_dir / "round_2" / "ppo"):
        state = ckpt.read_json(ppo / "final" / ckpt.STATE_FILE)
        assert state["complete"] and state["best"]["metric"] == "eval/gold"
        assert state["best"]["step"] in (1, 2) and state["step"] == state["best"]["step"]
        assert ckpt.verify(ppo / "final")
        assert not (ppo / "best").exists()  # final/ is its copy, the stage finished: deleted
        kept.append(state["best"]["step"])
    summaries = round_summaries(config, stage_configs(config))
    assert [summary["ppo_kept"] for summary in summaries] == kept
    assert "| ppo_kept |" in report.read_text()
    result = load_eval(config.run_dir / "eval.json")
    assert {r["model"] for r in result["rows"]} >= {"ppo", "ppo_round2"}


def test_the_report_says_which_step_ppo_kept(tmp_path):
    final = tmp_path / "ppo" / "final"
    final.mkdir(parents=True)
    best = {"metric": "eval/gold", "value": 0.318, "step": 24}
    config = {"eval_data": "data/prompts", "eval_split": "validation"}
    state = {"step": 24, "last_step": 72, "best": best, "config": config}
    (final / "trainer_state.json").write_text(json.dumps(state))
    result = {"rows": [{"model": "ppo", "gold": 0.3}], "samples": [], "config": {}}
    text = write_report(tmp_path, result, {"ppo": tmp_path / "ppo"}).read_text()
    assert (
        "PPO's result is its step 24 of 72: the best eval/gold (0.318) of its evaluations on "
        "data/prompts (validation split)" in text
    )
    del state["last_step"]  # final/ is the last step's model: nothing to say
    (final / "trainer_state.json").write_text(json.dumps(state))
    assert (
        "PPO's result" not in write_report(tmp_path, result, {"ppo": tmp_path / "ppo"}).read_text()
    )
