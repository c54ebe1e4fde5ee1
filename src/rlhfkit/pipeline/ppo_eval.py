"""PPO as the pipeline runs it: in slices of ``ppo_eval_every`` iterations, with the policy
evaluated on held-out prompts after each (gold score, reward-model score, KL to the SFT
model): the over-optimisation picture of Gao et al. 2022. The slices use
``RLTrainer.train(stop_after=...)``, which checkpoints at the end of each slice and resumes
exactly, so the evaluation points do not change the training trajectory. Round 1 of the
pipeline and every later round of iterated RLHF (``rounds.py``) train PPO this way.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from rlhfkit import checkpoint as ckpt
from rlhfkit.evaluation.evaluate import EvalConfig
from rlhfkit.evaluation.measures import evaluate_policy, gold_scorer, standard_error
from rlhfkit.runtime.machine import Runtime
from rlhfkit.tracking import Tracker, format_metrics, read_jsonl
from rlhfkit.trainers.rl_config import RLConfig

logger = logging.getLogger(__name__)

PPO_EVAL_DIR = "ppo_eval"


def train_ppo(
    ppo: RLConfig,
    ev: EvalConfig,
    *,
    eval_every: int,
    eval_prompts: int,
    eval_dir: Path,
    task: str | None,
    init_policy: str | None = None,
) -> None:
    """PPO as ``ppo`` says, with an evaluation point every ``eval_every`` iterations (0 = none)
    logged to ``eval_dir``. ``init_policy``: a causal LM whose weights the policy starts from
    instead of ``ppo.model``, which stays the KL reference (taken only on a fresh start: a
    resumed run has its own weights in its checkpoint)."""
    from rlhfkit.trainers.rl import RLTrainer

    trainer = RLTrainer.from_config(ppo)
    fresh = not ppo.resume or ckpt.latest_checkpoint(ppo.output_dir) is None
    if fresh and init_policy is not None:
        _load_policy_weights(trainer, init_policy)
    if eval_every == 0:
        trainer.train()
        return
    if fresh:  # points of an earlier run would mix with this one's
        shutil.rmtree(eval_dir, ignore_errors=True)
    points = PPOEvalPoints(trainer, ev, eval_prompts, eval_dir, task)
    if not fresh:  # load the checkpoint (no step made): a run killed before its point records it
        trainer.train(stop_after=0)
    points.record(trainer.state.step)  # fresh: the starting policy, the curve's origin
    while not trainer.state.complete:
        trainer.train(stop_after=eval_every)
        points.record(trainer.state.step)


def _load_policy_weights(trainer, path: str) -> None:
    """Copy the weights of the causal LM at ``path`` into the trainer's policy."""
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.models.passes import causal_lm

    logger.info("PPO policy starts from %s (reference: %s)", path, trainer.config.model)
    source = load_causal_lm(path, tokenizer=trainer.tokenizer)
    causal_lm(trainer.models.policy).load_state_dict(source.state_dict())


class PPOEvalPoints:
    """Gold, proxy and KL of the PPO policy on held-out prompts, logged per iteration to
    ``<eval_dir>/metrics.jsonl`` (and TensorBoard)."""

    def __init__(self, trainer, ev: EvalConfig, count: int, eval_dir: Path, task: str | None):
        from rlhfkit.data import load_prompts
        from rlhfkit.experience.generation import SamplingConfig
        from rlhfkit.experience.scorer_loading import reward_data_check

        checked = [*trainer.config.reward_functions, *([task] if task else [])]
        self.prompts = load_prompts(
            ev.prompts,
            ev.split,
            trainer.tokenizer,
            ev.max_prompt_length,
            count,
            chat_template=trainer.config.chat_template,
            check=reward_data_check(checked),
        )
        ppo = trainer.config
        self.sampling = SamplingConfig(ppo.max_new_tokens, ppo.temperature)
        # sampled and scored at the final evaluation's precision, so its table continues the curve
        self.runtime = Runtime.inference(trainer.runtime.device, ev.mixed_precision == "bf16")
        self.trainer, self.gold, self.eval = trainer, gold_scorer(task), ev
        self.dir = eval_dir
        self.done = {row["step"] for row in read_jsonl(self.dir / "metrics.jsonl")}

    def record(self, iteration: int) -> None:
        from rlhfkit.models.passes import causal_lm

        if iteration in self.done:
            return
        trainer = self.trainer
        with ckpt.preserved_rng(), self.runtime.autocast():
            samples = evaluate_policy(
                causal_lm(trainer.models.policy),
                trainer.models.reference,
                trainer.tokenizer,
                self.prompts,
                self.sampling,
                reward=trainer.scorer,
                gold=self.gold,
                seed=self.eval.seed,
                batch_size=self.eval.batch_size,
                runtime=self.runtime,
            )
        point = {
            "kl": samples.kl.mean().item(),
            "reward": samples.reward.mean().item(),
            "prompts": len(self.prompts),
        }
        if samples.gold is not None:
            point["gold"] = samples.gold.mean().item()
            point["gold_se"] = standard_error(samples.gold)
        # TensorBoard only: a wandb or mlflow run per point would be one run per point
        tensorboard = [name for name in trainer.config.report_to if name == "tensorboard"]
        with Tracker(self.dir, report_to=tensorboard) as tracker:
            tracker.log(point, iteration)
        self.done.add(iteration)
        logger.info("PPO iteration %d on held-out prompts: %s", iteration, format_metrics(point))


def ppo_points(eval_dir: Path) -> list[dict]:
    """The PPO evaluation points logged in ``eval_dir``, as the report tabulates them."""
    rows = read_jsonl(eval_dir / "metrics.jsonl")
    return [
        {
            "iteration": r["step"],
            **{k: r.get(k) for k in ("kl", "reward", "gold", "gold_se")},
            "prompts": int(r.get("prompts", 0)),  # the tracker stores every value as a float
        }
        for r in rows
    ]
