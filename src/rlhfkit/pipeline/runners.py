"""What each stage of the pipeline runs: its trainer (or the evaluation) on the config
``pipeline/config.py`` derives for it. ``run.py`` calls these in order; with
``parallel_arms`` an arm's own process calls one (``arms.py``)."""

from __future__ import annotations

from collections.abc import Callable

from rlhfkit.evaluation.evaluate import evaluate
from rlhfkit.pipeline.config import PipelineConfig, Stages
from rlhfkit.pipeline.ppo_eval import PPO_EVAL_DIR, train_ppo


def run_sft_stage(config: PipelineConfig, stages: Stages) -> None:
    from rlhfkit.trainers.sft import run_sft

    run_sft(stages.sft)


def run_reward_stage(config: PipelineConfig, stages: Stages) -> None:
    from rlhfkit.trainers.reward import run_reward

    run_reward(stages.reward)


def run_dpo_stage(config: PipelineConfig, stages: Stages) -> None:
    from rlhfkit.trainers.dpo import run_dpo

    run_dpo(stages.dpo)


def run_grpo_stage(config: PipelineConfig, stages: Stages) -> None:
    from rlhfkit.trainers.rl import run_rl

    run_rl(stages.grpo)


def run_ppo_stage(config: PipelineConfig, stages: Stages) -> None:
    """PPO in slices of ``ppo_eval_every`` iterations, one evaluation point after each."""
    train_ppo(
        stages.ppo,
        stages.eval,
        eval_every=config.ppo_eval_every,
        eval_prompts=config.ppo_eval_prompts,
        eval_dir=config.run_dir / PPO_EVAL_DIR,
        task=config.task,
    )


def run_eval_stage(config: PipelineConfig, stages: Stages) -> None:
    evaluate(stages.eval)


RUNNERS: dict[str, Callable[[PipelineConfig, Stages], None]] = {
    "sft": run_sft_stage,
    "reward": run_reward_stage,
    "ppo": run_ppo_stage,
    "dpo": run_dpo_stage,
    "grpo": run_grpo_stage,
    "eval": run_eval_stage,
}
