"""Critic-free RL on the shared loop: GRPO, RLOO and REINFORCE++, baselines instead of a critic.

- GRPO: Shao et al. 2024, "DeepSeekMath", sec. 4.1 (outcome supervision): sample a group of
  k responses per prompt, advantage = (score - group mean) / group std, the same for every
  token of a response; PPO's clipped objective; a k3 estimate of KL(pi || ref) added to the
  loss with weight beta (not folded into the reward as in PPO). ``scale_rewards=False`` is
  Dr. GRPO (Liu et al. 2025): centre only.
- RLOO: Ahmadian et al. 2024, "Back to Basics": the baseline of each response is the mean
  score of the other k - 1 in its group.
- REINFORCE++: Hu 2025: no group; each token's return, the KL penalty in the rewards as PPO
  has it, whitened over the micro-batch.

An iteration is PPO's, without the critic: the experience maker (``rollout.ExperienceMaker``)
samples, scores and computes the advantages by the estimator the config names, and the update
(``ppo_update``) makes ``num_iterations`` passes over the experience, one optimiser step per
``gradient_accumulation_steps`` micro-batches, with the one policy loss every RL stage has.
With the defaults (one pass, one step per iteration) the update's own forward pass gives the
"old" log-probs (the ratio is 1 and the clip inactive: the gradient is the policy gradient of
the clipped objective at the sampling point, and the experience needs no policy pass of its
own), as TRL's ``GRPOTrainer`` with ``num_iterations=1``. More passes or steps per generation
run the policy's pass while making experience, and the clip acts.

The experience is made, and the loss aggregated, per micro-batch of ``batch_size`` prompts
x ``num_generations`` responses: by default the loss is averaged over all response tokens of
the micro-batch (TRL's ``loss_type="bnpo"``, and its default "dapo" with one micro-batch on
one process); ``loss_aggregation`` also gives DeepSeekMath's mean of per-sequence means and
Dr. GRPO's constant normaliser (``ops.losses.aggregate_token_loss``);
``importance_sampling_level="sequence"`` clips one ratio per response instead of one per
token (GSPO, ``ops.losses.importance_log_ratio``); ``skip_uniform_groups`` leaves groups
without signal out of the loss and ``mask_truncated_completions`` the responses cut off
without EOS (both DAPO). Rewards from a
reward model are read at the EOS the policy emitted, as the reward model was trained; TRL's
GRPO scores the text without EOS.

Data parallel: each process takes its own prompts and samples their whole groups (a group
never spans processes), from a stream seeded by the batch's place in the data, so N processes
with a micro-batch each sample and learn what one process with N accumulated micro-batches
does.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.data import PromptCollator, PromptColumns, PromptExample
from rlhfkit.experience.rewards import RunningMoments
from rlhfkit.experience.rollout import ExperienceMaker, Rollout, RolloutModels, rollout_stats
from rlhfkit.experience.scorers import ScoreInput, Scorer, prepare_scorer
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.ops.masks import masked_mean
from rlhfkit.runtime.distributed import stream_seed
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.loop import WATCH_RL, Batch
from rlhfkit.trainers.optim import MinibatchLearner, accumulate
from rlhfkit.trainers.policy import PolicyTrainer
from rlhfkit.trainers.ppo_update import policy_loss, update_learners
from rlhfkit.trainers.rl_inputs import load_rl_prompts

logger = logging.getLogger(__name__)


class GRPOTrainer(PolicyTrainer):
    """GRPO / RLOO / REINFORCE++ on tokenised prompts (lists of ids) against ``scorer``.

    Args:
        config: a `GRPOConfig`.
        model: the policy (a causal LM matched to ``tokenizer``); LoRA is added here if set.
        tokenizer: distinct pad and EOS; decodes texts for the scorer and the logs.
        prompts: training prompts: token id lists (``data.encode_prompts``), or
            ``data.PromptExample``s, whose prompts as written and columns reach the reward
            functions (``data.load_prompts``).
        scorer: gives one score per response (``scorers.Scorer``).
        eval_prompts: held-out prompts as ``prompts``, scored at evaluation (one sample each,
            fixed seed).
        reference: the frozen reference; None uses a copy of the starting ``model`` (with LoRA:
            ``model`` with its adapter disabled). Not used when ``config.beta == 0``.
    """

    plot_keys = (
        "train/score/mean",
        "train/kl/ref",
        "train/policy/entropy",
        "train/response/length",
    )
    watch = WATCH_RL

    def __init__(
        self,
        config: GRPOConfig,
        model: nn.Module,
        tokenizer: Any,
        prompts: Sequence[list[int] | PromptExample],
        scorer: Scorer,
        eval_prompts: Sequence[list[int] | PromptExample] = (),
        *,
        reference: nn.Module | None = None,
        accelerator=None,
    ) -> None:
        super().__init__(
            config,
            model,
            list(prompts),
            PromptCollator(tokenizer.pad_token_id),
            tokenizer=tokenizer,
            reference=reference,
            needs_reference=config.beta > 0,
            accelerator=accelerator,
        )
        scorer = prepare_scorer(scorer, self.runtime, config.padding_free)
        self.gold = config.gold_scorer(tokenizer)
        has_reference = config.beta > 0
        models = RolloutModels(self.unwrapped_model, self.reference, None, has_reference)
        settings = config.rollout_settings
        self.maker = ExperienceMaker(models, scorer, tokenizer, settings, self.runtime)
        # The policy's and the reference's passes take packed inputs only if both can.
        self.packed = models.packed
        self.eval_prompts = list(eval_prompts)
        self.sample_generator = torch.Generator(self.accelerator.device)
        self.moments = RunningMoments()  # of every score seen, for score_normalize
        self.learner = MinibatchLearner(
            self.learners[self.learner_name],
            self.policy_loss,
            config.gradient_accumulation_steps,
            self.runtime.autocast,
            functools.partial(self.no_sync, self.model),
        )

    def next_batch(self) -> Batch:
        """The next prompts, with the seed of their samples (``sample_seed``), drawn from their
        place in the data: a batch's groups are the same whichever process samples them, on
        any number of processes, and after a resume (nothing to save)."""
        batch = super().next_batch()
        number = self.stream.number(self.state.batch_index - 1)
        batch["sample_seed"] = stream_seed(self.config.seed, self.state.epoch, number)
        return batch

    @property
    def scorer(self) -> Scorer:
        return self.maker.scorer

    # ----------------------------------------------------------------- experience
    @torch.no_grad()
    def sample(
        self,
        query: torch.Tensor,
        query_mask: torch.Tensor,
        generator=None,
        prompt_columns: PromptColumns | None = None,
    ) -> tuple[ScoreInput, torch.Tensor]:
        """One response per row of the left-padded ``query`` (B, Tq), sampled in eval mode by
        the experience maker. Returns the batch as scorers see it (with ``prompt_columns``)
        and ``eos_emitted`` (B,)."""
        lm = self.unwrapped_model
        was_training = lm.training
        try:
            out = self.maker.sample(query, query_mask, generator)
        finally:
            lm.train(was_training)
        batch = ScoreInput.from_ids(
            self.tokenizer, query, query_mask, out.response, out.response_mask, prompt_columns
        )
        return batch, out.eos_emitted

    # ----------------------------------------------------------------- one iteration
    def train_step(self) -> dict[str, float]:
        """One iteration: experience from the next ``micro_batches_per_iteration`` batches of
        prompts, then ``num_iterations`` passes over it in order, one optimiser step per
        ``gradient_accumulation_steps`` micro-batches. Returns the mean statistics."""
        cfg = self.config
        started = time.perf_counter()
        count = cfg.micro_batches_per_iteration
        with self.maker.frozen_weights_cast():
            rollouts = [self.make_experience(self.next_batch()) for _ in range(count)]
            update_started = time.perf_counter()
            self.model.train()
            # A micro-batch's loss is its own token mean: each counts alike (weight 1).
            size = cfg.gradient_accumulation_steps
            minibatches = [
                [(r, 1.0) for r in rollouts[i : i + size]] for i in range(0, count, size)
            ]
            metrics = update_learners([self.learner], minibatches * cfg.num_iterations, False)
        for rollout in rollouts:
            stats = rollout_stats(rollout, cfg.num_generations)
            accumulate(metrics, stats, 1 / len(rollouts))
        metrics["time/update"] = time.perf_counter() - update_started
        metrics["time/iteration"] = time.perf_counter() - started
        self._log_samples(rollouts[0])
        return metrics

    def make_experience(self, batch: Batch) -> Rollout:
        """``num_generations`` responses per prompt of ``batch`` (groups contiguous), scored,
        with their advantages: one micro-batch of experience, checked finite."""
        cfg = self.config
        k = cfg.num_generations
        query = batch["query"].repeat_interleave(k, dim=0)  # (B, Tq)
        query_mask = batch["query_mask"].repeat_interleave(k, dim=0)  # (B, Tq)
        columns = batch.get("prompt_columns")
        if "sample_seed" in batch:  # from next_batch; other batches draw on where it stands
            self.sample_generator.manual_seed(batch["sample_seed"])
        rollout = self.maker.make(
            query,
            query_mask,
            kl_coef=cfg.beta if cfg.kl_in_rewards else 0.0,
            moments=self.moments,
            generator=self.sample_generator,
            prompt_columns=columns.repeat(k) if columns is not None else None,
        )
        rollout.check_finite()
        return rollout

    def policy_loss(self, mb: Rollout, weight: float = 1.0) -> tuple[torch.Tensor, dict]:
        """The loss of one micro-batch of experience (``ppo_update.policy_loss``)."""
        cfg = self.config
        loss, stats, _ = policy_loss(self.model, mb, cfg.loss_settings, cfg.beta, self.packed)
        return weight * loss, stats

    def _log_samples(self, rollout: Rollout) -> None:
        """Sample texts every `sample_every` steps (first micro-batch), so hacking is seen."""
        step = self.state.step + 1
        if self.tracker is None or (step != 1 and step % self.config.sample_every):
            return
        n = min(self.config.num_samples, len(rollout))
        advantages = masked_mean(rollout.advantages, rollout.response_mask, dim=1)  # (B,)
        rows = [
            {
                "prompt": rollout.prompts[i],
                "response": rollout.responses[i],
                "score": float(rollout.raw_scores[i]),
                "advantage": float(advantages[i]),
            }
            for i in range(n)
        ]
        self.tracker.log_samples(rows, step)

    def extra_state(self) -> dict[str, Any]:
        return {"score_moments": self.moments.state_dict()}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        self.moments.load_state_dict(saved["score_moments"])

    def evaluate(self) -> dict[str, float]:
        """Mean score (and each part's, for a scorer of several), length and gold functions'
        score of one fixed-seed sample per held-out prompt."""
        if not self.eval_prompts:
            return {}
        generator = torch.Generator(self.accelerator.device).manual_seed(self.config.seed + 1)
        parts: dict[str, list[torch.Tensor]] = {"score": [], "length": [], "gold": []}
        for batch in self.eval_batches(self.eval_prompts, self.collate_fn):
            query, query_mask = batch["query"], batch["query_mask"]
            samples, _ = self.sample(query, query_mask, generator, batch.get("prompt_columns"))
            scores, score_parts = self.scorer.scored(samples)
            parts["score"].append(scores.cpu())
            for key, values in score_parts.items():
                parts.setdefault(f"score/{key}", []).append(values.cpu())
            parts["length"].append(samples.response_mask.sum(1).float().cpu())
            if self.gold is not None:
                parts["gold"].append(self.gold(samples).cpu())
        return {key: torch.cat(values).mean().item() for key, values in parts.items() if values}

    # ----------------------------------------------------------------- from a config
    @classmethod
    def from_config(cls, config: GRPOConfig) -> GRPOTrainer:
        """Load tokenizer, prompts, policy, reference and scorer as ``config`` says (the data
        first: a data error stops the run before any model is loaded)."""
        trust = config.trust_remote_code
        tokenizer = load_tokenizer(config.model, trust_remote_code=trust)
        prompts, eval_prompts = load_rl_prompts(config, tokenizer)
        set_seed(config.seed)
        model = load_causal_lm(config.model, tokenizer=tokenizer, trust_remote_code=trust)
        reference = None
        if config.reference and config.beta > 0:
            reference = load_causal_lm(
                config.reference, tokenizer=tokenizer, trust_remote_code=trust
            )
        scorer = config.scorer(tokenizer=tokenizer, trust=config.trust_remote_code)
        return cls(config, model, tokenizer, prompts, scorer, eval_prompts, reference=reference)


def run_grpo(config: GRPOConfig) -> Path:
    """Build a ``GRPOTrainer`` from ``config``, train it, and return the final model's
    directory (the ``rlhfkit grpo`` and ``rlhfkit rloo`` commands; an `RLOOConfig` is a
    `GRPOConfig` whose ``advantage`` defaults to 'rloo'). A complete run is not loaded
    again."""
    if config.resume and ckpt.is_complete(config.output_dir):
        logger.info("%s is already complete; nothing to do", config.output_dir)
        return config.final_dir
    GRPOTrainer.from_config(config).train()
    return config.final_dir
