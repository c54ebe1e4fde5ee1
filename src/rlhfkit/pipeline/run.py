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
Gao et al. 2022. PPO is run in slices with ``PPOTrainer.train(stop_after=...)``, which
checkpoints at the end of each slice and resumes exactly, so the evaluation points do not
change the training trajectory.

The settings, and how each stage's config is derived from them: ``pipeline/config.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import (
    load_config,
)
from rlhfkit.evaluation.evaluate import EvalConfig, evaluate
from rlhfkit.evaluation.measures import evaluate_policy, gold_scorer
from rlhfkit.evaluation.report import TABLE_COLUMNS, format_table, load_eval, write_report
from rlhfkit.pipeline.config import (
    DemoConfig,
    PipelineConfig,
    Stages,
    demo_config_path,
    stage_configs,
)
from rlhfkit.tracking import Tracker, format_metrics, read_jsonl

logger = logging.getLogger(__name__)

TIMINGS_FILE = "pipeline.json"
PPO_EVAL_DIR = "ppo_eval"
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


def run_ppo_stage(config: PipelineConfig, stages: Stages) -> None:
    """PPO in slices of ``ppo_eval_every`` iterations, one evaluation point after each."""
    from rlhfkit.trainers.ppo import PPOTrainer

    trainer = PPOTrainer.from_config(stages.ppo)
    if config.ppo_eval_every == 0:
        trainer.train()
        return
    fresh = not stages.ppo.resume or ckpt.latest_checkpoint(stages.ppo.output_dir) is None
    if fresh:  # points of an earlier run would mix with this one's
        shutil.rmtree(config.run_dir / PPO_EVAL_DIR, ignore_errors=True)
    points = PPOEvalPoints(config, stages, trainer)
    if fresh:
        points.record(0)  # the SFT model itself: KL 0, the curves' origin
    while not trainer.state.complete:
        trainer.train(stop_after=config.ppo_eval_every)
        points.record(trainer.state.step)


class PPOEvalPoints:
    """Gold, proxy and KL of the PPO policy on held-out prompts, logged per iteration to
    ``<run>/ppo_eval/metrics.jsonl`` (and TensorBoard)."""

    def __init__(self, config: PipelineConfig, stages: Stages, trainer) -> None:
        from rlhfkit.data import encode_prompts, load_records
        from rlhfkit.experience.generation import SamplingConfig

        ev, ppo = stages.eval, stages.ppo
        records = load_records(ev.prompts, "prompts", split=ev.split, limit=config.ppo_eval_prompts)
        self.prompts, _ = encode_prompts(
            records,
            trainer.tokenizer,
            ev.max_prompt_length,
            chat_template=trainer.config.chat_template,
        )
        self.sampling = SamplingConfig(ppo.max_new_tokens, ppo.temperature)
        self.trainer, self.gold, self.eval = trainer, gold_scorer(config.task), ev
        self.dir = config.run_dir / PPO_EVAL_DIR
        self.done = {row["step"] for row in read_jsonl(self.dir / "metrics.jsonl")}

    def record(self, iteration: int) -> None:
        from rlhfkit.models.passes import causal_lm

        if iteration in self.done:
            return
        trainer = self.trainer
        with ckpt.preserved_rng():
            samples = evaluate_policy(
                causal_lm(trainer.policy),
                trainer.models.reference,
                trainer.tokenizer,
                self.prompts,
                self.sampling,
                reward=trainer.scorer,
                gold=self.gold,
                seed=self.eval.seed,
                batch_size=self.eval.batch_size,
            )
        point = {
            "kl": samples.kl.mean().item(),
            "reward": samples.reward.mean().item(),
            "prompts": len(self.prompts),
        }
        if samples.gold is not None:
            point["gold"] = samples.gold.mean().item()
        with Tracker(self.dir, tensorboard=trainer.config.tensorboard) as tracker:
            tracker.log(point, iteration)
        self.done.add(iteration)
        logger.info("PPO iteration %d on held-out prompts: %s", iteration, format_metrics(point))


def ppo_points(run_dir: Path) -> list[dict]:
    """The PPO evaluation points, as the report tabulates them."""
    rows = read_jsonl(run_dir / PPO_EVAL_DIR / "metrics.jsonl")
    return [
        {
            "iteration": r["step"],
            **{k: r.get(k) for k in ("kl", "reward", "gold")},
            "prompts": int(r.get("prompts", 0)),  # the tracker stores every value as a float
        }
        for r in rows
    ]


def run_eval_stage(config: PipelineConfig, stages: Stages) -> None:
    evaluate(stages.eval)


def eval_is_current(stages: Stages) -> bool:
    """Whether ``eval.json`` exists, was made with this config, and after every model."""
    path = Path(stages.eval.output)
    if not path.is_file():
        return False
    trained = (stages.sft, stages.reward, stages.ppo, stages.dpo)
    finals = [Path(c.final_dir) / ckpt.STATE_FILE for c in trained]
    newest = max((f.stat().st_mtime for f in finals if f.is_file()), default=0.0)
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
    "eval": run_eval_stage,
}


# --------------------------------------------------------------------------- the run
def run_pipeline(config: PipelineConfig) -> Path:
    """Run every stage not yet done, then write the report; returns the report's path."""
    stages = stage_configs(config)
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    timings_path = run_dir / TIMINGS_FILE
    timings = ckpt.read_json(timings_path) if timings_path.is_file() else {}
    started = time.perf_counter()
    for number, (stage, runner) in enumerate(RUNNERS.items(), start=1):
        if _is_done(stage, stages):
            logger.info("stage %d/%d %s: already done, skipped", number, len(RUNNERS), stage)
            timings.setdefault(stage, {"seconds": None})["status"] = "skipped (done before)"
            continue
        logger.info("stage %d/%d %s: starting", number, len(RUNNERS), stage)
        stage_started = time.perf_counter()
        runner(config, stages)
        seconds = time.perf_counter() - stage_started
        timings[stage] = {"seconds": seconds, "status": "done"}
        ckpt.write_json(timings, timings_path)
        logger.info("stage %d/%d %s: done in %.1f s", number, len(RUNNERS), stage, seconds)
    result = load_eval(stages.eval.output)
    stage_dirs = {s: getattr(stages, s).output_dir for s in TRAINING_STAGES}
    report_started = time.perf_counter()
    report = write_report(
        run_dir,
        result,
        stage_dirs,
        ppo_points=ppo_points(run_dir),
        timings=timings,
        title=f"rlhfkit pipeline `{run_dir}`",
    )
    timings["report"] = {"seconds": time.perf_counter() - report_started, "status": "done"}
    ckpt.write_json(timings, timings_path)
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
