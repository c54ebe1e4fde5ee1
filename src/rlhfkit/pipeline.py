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
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from argparse import ArgumentError
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rlhfkit
from rlhfkit.config import (
    ConfigError,
    RewardConfig,
    SFTConfig,
    _require,
    config_from_namespace,
    config_parser,
    load_config,
)
from rlhfkit.evaluate import EvalConfig, evaluate
from rlhfkit.measures import evaluate_policy, gold_scorer
from rlhfkit.report import TABLE_COLUMNS, format_table, load_eval, write_report
from rlhfkit.tasks import BASE_MODEL_DIR, DEMO_DATA_DIR, REWARD_FUNCTIONS
from rlhfkit.tracking import Tracker, read_jsonl
from rlhfkit.trainers import checkpoint as ckpt
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.ppo_config import PPOConfig

logger = logging.getLogger(__name__)

TIMINGS_FILE = "pipeline.json"
PPO_EVAL_DIR = "ppo_eval"
TRAINING_STAGES = ("sft", "reward", "ppo", "dpo")


@dataclass
class PipelineConfig:
    """The whole pipeline: where it runs, what it starts from, and each stage's settings."""

    output_dir: str = "runs/pipeline"
    """Run directory; each stage writes to a subdirectory (sft, reward, ppo, dpo) and the
    evaluation and report land at its top."""
    base_model: str | None = None
    """Model to start from (hub name or directory); None = the bundled tiny English GPT-2."""
    data_dir: str | None = None
    """Folder with prompts/, sft/ and comparisons/ (each with train and test files);
    None = the bundled demo data."""
    reward_data: str = "comparisons"
    """Folder of `data_dir` the reward model trains on: 'comparisons' (pairs) or 'rankings'
    (K responses best first, InstructGPT's format); DPO always uses the comparisons."""
    task: str | None = "sentiment"
    """Gold judge of the evaluation ('sentiment', 'digits'); None when the task has none."""
    seed: int = 42
    """Seed of every stage (a stage's own `seed` overrides it)."""
    ppo_eval_every: int = 0
    """Evaluate the PPO policy on held-out prompts every this many iterations (gold, proxy and
    KL: the over-optimisation curve); 0 = only the final evaluation."""
    ppo_eval_prompts: int = 32
    """Held-out prompts per PPO evaluation point."""
    sft: dict[str, Any] = field(default_factory=dict)
    """`SFTConfig` fields (`rlhfkit sft --help`) to set, beside those the pipeline derives."""
    reward: dict[str, Any] = field(default_factory=dict)
    """`RewardConfig` fields (`rlhfkit rm --help`)."""
    ppo: dict[str, Any] = field(default_factory=dict)
    """`PPOConfig` fields (`rlhfkit ppo --help`)."""
    dpo: dict[str, Any] = field(default_factory=dict)
    """`DPOConfig` fields (`rlhfkit dpo --help`)."""
    eval: dict[str, Any] = field(default_factory=dict)
    """`EvalConfig` fields (`rlhfkit eval --help`)."""

    def __post_init__(self) -> None:
        _require(self, "output_dir", bool(self.output_dir), "a directory path")
        _require(
            self,
            "task",
            self.task is None or self.task in REWARD_FUNCTIONS,
            f"None or one of {sorted(REWARD_FUNCTIONS)}",
        )
        _require(self, "reward_data", bool(self.reward_data), "a folder name under data_dir")
        _require(self, "ppo_eval_every", self.ppo_eval_every >= 0, "an integer >= 0")
        _require(self, "ppo_eval_prompts", self.ppo_eval_prompts >= 1, "an integer >= 1")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir)

    def data(self, kind: str) -> str:
        """The data folder of one kind: prompts, sft, comparisons or rankings."""
        return str(Path(self.data_dir) / kind if self.data_dir else DEMO_DATA_DIR / kind)


@dataclass
class Stages:
    """The configs of every stage, derived from a ``PipelineConfig``."""

    sft: SFTConfig
    reward: RewardConfig
    ppo: PPOConfig
    dpo: DPOConfig
    eval: EvalConfig


def _build(cls: type, section: str, overrides: dict[str, Any], **derived: Any):
    """``cls`` from the pipeline-derived values, then the user's, type-checked by jsonargparse."""
    parser = config_parser(cls, exit_on_error=False)
    try:
        namespace = parser.parse_object({**derived, **overrides})
        return config_from_namespace(cls, namespace)
    except (ArgumentError, ValueError) as error:  # jsonargparse's, or the config's own check
        raise ConfigError(f"PipelineConfig.{section}: {error}") from error


def stage_configs(config: PipelineConfig) -> Stages:
    """Every stage's config, each stage reading the previous stages' outputs."""
    run, seed = config.run_dir, config.seed
    base = config.base_model or str(BASE_MODEL_DIR)
    sft_data, comparisons = config.data("sft"), config.data("comparisons")
    split = {"train_split": "train", "eval_split": "test", "seed": seed}
    sft = _build(
        SFTConfig,
        "sft",
        config.sft,
        model=base,
        output_dir=str(run / "sft"),
        train_data=sft_data,
        eval_data=sft_data,
        **split,
    )
    sft_final = str(sft.final_dir)
    reward = _build(
        RewardConfig,
        "reward",
        config.reward,
        model=sft_final,
        output_dir=str(run / "reward"),
        train_data=config.data(config.reward_data),
        eval_data=comparisons,
        normalize_data=sft_data,
        **split,
    )
    ppo = _build(
        PPOConfig,
        "ppo",
        config.ppo,
        model=sft_final,
        reward_model=str(reward.final_dir),
        output_dir=str(run / "ppo"),
        train_data=config.data("prompts"),
        train_split="train",
        eval_data=config.data("prompts"),
        eval_split="test",
        seed=seed,
    )
    dpo = _build(
        DPOConfig,
        "dpo",
        config.dpo,
        model=sft_final,
        output_dir=str(run / "dpo"),
        train_data=comparisons,
        eval_data=comparisons,
        **split,
    )
    models = {"base": base, "sft": sft_final, "ppo": str(ppo.final_dir), "dpo": str(dpo.final_dir)}
    evaluation = _build(
        EvalConfig,
        "eval",
        config.eval,
        models=models,
        reference=sft_final,
        reward_model=str(reward.final_dir),
        task=config.task,
        prompts=config.data("prompts"),
        comparisons=comparisons,
        split="test",
        max_new_tokens=ppo.max_new_tokens,
        temperature=ppo.temperature,
        output=str(run / "eval.json"),
        seed=seed,
    )
    return Stages(sft, reward, ppo, dpo, evaluation)


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
        points.record(trainer.state.iteration)


class PPOEvalPoints:
    """Gold, proxy and KL of the PPO policy on held-out prompts, logged per iteration to
    ``<run>/ppo_eval/metrics.jsonl`` (and TensorBoard)."""

    def __init__(self, config: PipelineConfig, stages: Stages, trainer) -> None:
        from rlhfkit.data import encode_prompts, load_records
        from rlhfkit.generation import SamplingConfig

        ev, ppo = stages.eval, stages.ppo
        records = load_records(ev.prompts, "prompts", split=ev.split, limit=config.ppo_eval_prompts)
        self.prompts, _ = encode_prompts(records, trainer.tokenizer, ev.max_prompt_length)
        self.sampling = SamplingConfig(ppo.max_new_tokens, ppo.temperature)
        self.trainer, self.gold, self.eval = trainer, gold_scorer(config.task), ev
        self.dir = config.run_dir / PPO_EVAL_DIR
        self.done = {row["step"] for row in read_jsonl(self.dir / "metrics.jsonl")}

    def record(self, iteration: int) -> None:
        from rlhfkit.rollout import causal_lm

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
        logger.info("PPO iteration %d on held-out prompts: %s", iteration, point)


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
@dataclass
class DemoConfig:
    """The pipeline on the bundled tiny English model and demo data (configs/demo.yaml)."""

    output_dir: str = "runs/demo"
    """Run directory of the demo."""
    pipeline_config: str | None = None
    """Pipeline YAML to run; None = configs/demo.yaml of the source tree (or the current
    directory)."""


def demo_config_path() -> Path:
    """configs/demo.yaml next to the package's source tree, else in the current directory."""
    candidates = [
        Path(rlhfkit.__file__).resolve().parents[2] / "configs" / "demo.yaml",
        Path.cwd() / "configs" / "demo.yaml",
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"configs/demo.yaml not found; looked in {candidates}")


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
