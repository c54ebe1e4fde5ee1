"""The InstructGPT pipeline end to end, and the demo: SFT -> reward model -> PPO, with DPO and
best-of-n as comparison arms, then evaluation and the report.

Ouyang et al. 2022 (InstructGPT), figure 2: (1) SFT on demonstrations; (2) a reward model on
comparisons, started from the SFT model; (3) PPO against it with a KL penalty to the SFT
model, the critic started from the reward model. Beside step 3, DPO (Rafailov et al. 2023)
trains the SFT model on the same comparisons, and best-of-n samples the SFT model n times
and keeps the reward model's favourite. Evaluation (``evaluate.py``) then compares base, SFT,
PPO, DPO and best-of-n on held-out prompts, and ``report.py`` writes ``report.md``.

Each stage's output feeds the next: ``sft/final`` is the policy and reference of PPO and
DPO's start; ``reward/final`` is PPO's scorer and critic initialisation. A stage whose run
directory holds a complete ``final/`` (the trainers' marker) is skipped when the pipeline is
started again; an interrupted one resumes from its newest checkpoint (the trainers' resume).

During PPO, every ``ppo_eval_every`` iterations, the policy is evaluated on held-out prompts
(gold score, reward-model score, KL to the SFT model): the over-optimisation picture of
Gao et al. 2022 (``ppo_eval.py``: PPO in slices that checkpoint and resume exactly, so the
evaluation points do not change the training trajectory).

With ``rounds`` > 1, InstructGPT's loop follows DPO: comparisons of the last policy, a new
reward model on every comparison so far, PPO again (``rounds.py``), each round's steps resumed
as the stages are. With people as labellers the pipeline stops while a round's votes are
missing, and started again goes on.

The settings, and how each stage's config is derived from them: ``pipeline/config.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import load_config
from rlhfkit.evaluation.evaluate import EvalConfig, evaluate
from rlhfkit.evaluation.report import TABLE_COLUMNS, format_table, load_eval, write_report
from rlhfkit.pipeline.config import (
    DemoConfig,
    PipelineConfig,
    Stages,
    demo_config_path,
    stage_configs,
)
from rlhfkit.pipeline.ppo_eval import PPO_EVAL_DIR, ppo_points, train_ppo
from rlhfkit.pipeline.rounds import (
    LabelsPending,
    RoundPlan,
    Step,
    plan_rounds,
    round_steps,
    round_summaries,
)

logger = logging.getLogger(__name__)

TIMINGS_FILE = "pipeline.json"
TRAINING_STAGES = ("sft", "reward", "ppo", "dpo")


# --------------------------------------------------------------------------- stages
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
    from rlhfkit.trainers.grpo import run_grpo

    run_grpo(stages.grpo)


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


def _trained(stages: Stages) -> list:
    """The configs of every model the evaluation reads."""
    rounds = [c for r in stages.rounds for c in (r.reward, r.ppo)]
    arms = [stages.grpo] if stages.grpo is not None else []
    return [stages.sft, stages.reward, stages.ppo, stages.dpo, *arms, *rounds]


def eval_is_current(stages: Stages) -> bool:
    """Whether ``eval.json`` exists, was made with this config, and after every model."""
    path = Path(stages.eval.output)
    if not path.is_file():
        return False
    finals = [Path(c.final_dir) / ckpt.STATE_FILE for c in _trained(stages)]
    if not all(f.is_file() for f in finals):
        return False
    newest = max(f.stat().st_mtime for f in finals)
    saved = load_eval(path).get("config")
    return saved == dataclasses.asdict(stages.eval) and path.stat().st_mtime >= newest


def _is_done(stage: str, stages: Stages) -> bool:
    if stage == "eval":
        return eval_is_current(stages)
    return ckpt.is_complete(getattr(stages, stage).output_dir)


RUNNERS: dict[str, Callable[[PipelineConfig, Stages], None]] = {
    "sft": run_sft_stage,
    "reward": run_reward_stage,
    "ppo": run_ppo_stage,
    "dpo": run_dpo_stage,
    "grpo": run_grpo_stage,
    "eval": run_eval_stage,
}


def pipeline_steps(config: PipelineConfig, stages: Stages, plan: RoundPlan | None) -> list[Step]:
    """The stages in order: SFT, reward, PPO, DPO, GRPO where asked, the rounds >= 2
    (``rounds.py``), eval."""

    def stage(name: str) -> Step:
        return Step(
            name,
            functools.partial(_is_done, name, stages),
            functools.partial(RUNNERS[name], config, stages),
        )

    rounds = round_steps(config, stages, plan) if plan is not None else []
    arms = ("sft", "reward", "ppo", "dpo") + (("grpo",) if stages.grpo is not None else ())
    return [*map(stage, arms), *rounds, stage("eval")]


# --------------------------------------------------------------------------- the run
def run_pipeline(config: PipelineConfig) -> Path | LabelsPending:
    """Run every stage not yet done, then write the report; returns the report's path, or,
    while a round waits for people's votes, the ``LabelsPending`` that says where and how many."""
    stages = stage_configs(config)
    plan = plan_rounds(config, stages)  # the rounds' prompts checked before any training
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    timings_path = run_dir / TIMINGS_FILE
    timings = ckpt.read_json(timings_path) if timings_path.is_file() else {}
    started = time.perf_counter()
    steps = pipeline_steps(config, stages, plan)
    for number, step in enumerate(steps, start=1):
        if step.done():
            logger.info("stage %d/%d %s: already done, skipped", number, len(steps), step.name)
            timings.setdefault(step.name, {"seconds": None})["status"] = "skipped (done before)"
            continue
        logger.info("stage %d/%d %s: starting", number, len(steps), step.name)
        stage_started = time.perf_counter()
        pending = step.run()
        seconds = time.perf_counter() - stage_started
        status = "waiting for labels" if isinstance(pending, LabelsPending) else "done"
        timings[step.name] = {"seconds": seconds, "status": status}
        ckpt.write_json(timings, timings_path)
        if isinstance(pending, LabelsPending):
            logger.info("stage %d/%d %s: %s", number, len(steps), step.name, pending.message())
            return pending
        logger.info("stage %d/%d %s: done in %.1f s", number, len(steps), step.name, seconds)
    return _write_report(config, stages, timings, started)


def _write_report(config: PipelineConfig, stages: Stages, timings: dict, started: float) -> Path:
    run_dir = config.run_dir
    result = load_eval(stages.eval.output)
    stage_dirs = {s: getattr(stages, s).output_dir for s in TRAINING_STAGES}
    if stages.grpo is not None:
        stage_dirs["grpo"] = stages.grpo.output_dir
    report_started = time.perf_counter()
    report = write_report(
        run_dir,
        result,
        stage_dirs,
        ppo_points=ppo_points(run_dir / PPO_EVAL_DIR),
        timings=timings,
        title=f"rlhfkit pipeline `{run_dir}`",
        rounds=round_summaries(config, stages) if stages.rounds else (),
    )
    timings["report"] = {"seconds": time.perf_counter() - report_started, "status": "done"}
    ckpt.write_json(timings, run_dir / TIMINGS_FILE)
    logger.info(
        "pipeline finished in %.1f s; results on held-out prompts:\n%s\nreport: %s",
        time.perf_counter() - started,
        format_table(result["rows"], TABLE_COLUMNS),
        report.resolve(),
    )
    return report


# --------------------------------------------------------------------------- the demo
def run_demo(config: DemoConfig) -> Path:
    """``rlhfkit demo``: the pipeline as configs/demo.yaml says, into ``output_dir``."""
    path = Path(config.pipeline_config) if config.pipeline_config else demo_config_path()
    logger.info("demo: running the pipeline of %s into %s", path, config.output_dir)
    return run_pipeline(load_config(PipelineConfig, path, output_dir=config.output_dir))


def run_eval(config: EvalConfig) -> Path:
    """``rlhfkit eval``: evaluate, log the table, return where the results are."""
    rows = evaluate(config)
    logger.info("results on held-out prompts:\n%s", format_table(rows, TABLE_COLUMNS))
    return Path(config.output)
