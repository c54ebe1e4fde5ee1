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
import shutil
import time
from pathlib import Path

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import load_config
from rlhfkit.evaluation.evaluate import EvalConfig, evaluate
from rlhfkit.evaluation.report import (
    load_eval,
    results_table,
    reward_model_lines,
    write_report,
)
from rlhfkit.pipeline import runners
from rlhfkit.pipeline.arms import Arms
from rlhfkit.pipeline.config import (
    DemoConfig,
    PipelineConfig,
    Stages,
    demo_config_path,
    stage_configs,
)
from rlhfkit.pipeline.ppo_eval import PPO_EVAL_DIR, ppo_points
from rlhfkit.pipeline.rounds import (
    LabelsPending,
    RoundPlan,
    Step,
    plan_rounds,
    round_steps,
    round_summaries,
)
from rlhfkit.runtime.allocator import peak_resident_gib, release_freed_memory
from rlhfkit.runtime.distributed import rank
from rlhfkit.trainers.loop import BEST_DIR

logger = logging.getLogger(__name__)

TIMINGS_FILE = "pipeline.json"
TRAINING_STAGES = ("sft", "reward", "ppo", "dpo")


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


def arm_names(stages: Stages) -> tuple[str, ...]:
    """The comparison arms, which need only the SFT model: DPO, and GRPO where asked."""
    return ("dpo",) + (("grpo",) if stages.grpo is not None else ())


def pipeline_steps(
    config: PipelineConfig, stages: Stages, plan: RoundPlan | None, arms: Arms | None = None
) -> list[Step]:
    """The stages in order: SFT, reward, PPO, DPO, GRPO where asked, the rounds >= 2
    (``rounds.py``), eval. With ``arms`` (``parallel_arms``), DPO and GRPO train in their own
    processes, started after SFT, and their steps wait for those: the arms run beside the
    reward model and PPO, and are done before a round can stop the pipeline for labels."""

    def stage(name: str) -> Step:
        return Step(
            name,
            functools.partial(_is_done, name, stages),
            functools.partial(runners.RUNNERS[name], config, stages),
        )

    def waited(name: str) -> Step:
        done = functools.partial(_is_done, name, stages)
        return Step(
            name,
            lambda: not arms.is_running(name) and done(),
            functools.partial(arms.join, name),
            functools.partial(arms.measured, name),
        )

    rounds = round_steps(config, stages, plan) if plan is not None else []
    side = [stage(name) if arms is None else waited(name) for name in arm_names(stages)]
    return [stage("sft"), stage("reward"), stage("ppo"), *side, *rounds, stage("eval")]


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
    arms = Arms(config) if config.parallel_arms else None
    steps = pipeline_steps(config, stages, plan, arms)
    try:
        for number, step in enumerate(steps, start=1):
            pending = _run_step(step, f"stage {number}/{len(steps)} {step.name}", timings)
            ckpt.write_json(timings, timings_path)
            if not config.keep_checkpoints:
                _delete_finished_checkpoints(stages)
            if isinstance(pending, LabelsPending):
                return pending
            if arms is not None and step.name == "sft":
                _start_arms(arms, stages)
    finally:
        if arms is not None:
            arms.stop()  # only those not waited for: the pipeline stopped first
    return _write_report(config, stages, timings, started)


def _delete_finished_checkpoints(stages: Stages) -> None:
    """Delete the checkpoints of every stage whose ``final/`` is complete (``keep_checkpoints``
    off): a finished stage is skipped, never resumed. An arm still training is not complete.
    With ``load_best_model_at_end`` its ``best/`` goes too: ``final/`` is a copy of it."""
    if rank() != 0:
        return
    for stage in _trained(stages):
        if ckpt.is_complete(stage.output_dir):
            copied = [Path(stage.output_dir) / BEST_DIR] if stage.load_best_model_at_end else []
            for old in [*ckpt.checkpoint_dirs(stage.output_dir), *copied]:
                if old.is_dir():
                    logger.info("%s is finished: deleting %s", stage.output_dir, old.name)
                    shutil.rmtree(old)


def _start_arms(arms: Arms, stages: Stages) -> None:
    """Start every arm not done yet, each in a process of its own."""
    for name in arm_names(stages):
        if not _is_done(name, stages):
            arms.start(name)


def _run_step(step: Step, title: str, timings: dict) -> LabelsPending | None:
    """Run ``step`` unless it is done, and note its time and status in ``timings``."""
    if step.done():
        logger.info("%s: already done, skipped", title)
        timings.setdefault(step.name, {"seconds": None})["status"] = "skipped (done before)"
        return None
    logger.info("%s: starting", title)
    stage_started = time.perf_counter()
    pending = step.run()
    release_freed_memory()  # the next stage's models are not to come on top of these blocks
    status = "waiting for labels" if isinstance(pending, LabelsPending) else "done"
    entry = {
        "seconds": time.perf_counter() - stage_started,
        "status": status,
        "peak_memory_gib": peak_resident_gib(),  # of this process so far
    }
    entry.update((step.measured() if step.measured is not None else None) or {})
    timings[step.name] = entry
    if isinstance(pending, LabelsPending):
        logger.info("%s: %s", title, pending.message())
        return pending
    logger.info("%s: done in %.1f s", title, entry["seconds"])
    return None


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
        results_table(result["rows"]),
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
    """``rlhfkit eval``: evaluate, log the table and the reward model's accuracy, return where
    the results are."""
    rows = evaluate(config)
    if rows:
        logger.info("results on held-out prompts:\n%s", results_table(rows))
    accuracy = load_eval(config.output).get("reward_model")
    if accuracy:
        lines = "\n".join(reward_model_lines(accuracy, parts=False))
        logger.info("the reward model on held-out comparisons:\n%s", lines)
    return Path(config.output)
