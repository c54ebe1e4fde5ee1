"""Critic-free RL on the shared loop: GRPO and RLOO with group baselines instead of a critic.

- GRPO: Shao et al. 2024, "DeepSeekMath", sec. 4.1 (outcome supervision): sample a group of
  k responses per prompt, advantage = (score - group mean) / group std, the same for every
  token of a response; PPO's clipped objective; a k3 estimate of KL(pi || ref) added to the
  loss with weight beta (not folded into the reward as in PPO). ``scale_rewards=False`` is
  Dr. GRPO (Liu et al. 2025): centre only.
- RLOO: Ahmadian et al. 2024, "Back to Basics": the baseline of each response is the mean
  score of the other k - 1 in its group (``ops.advantages.rloo_advantages``).

Every formula comes from ``ops`` (group advantages, ``ppo_policy_loss``, ``kl_k3``), sampling
from the experience maker (``rollout.ExperienceMaker.sample``), scoring from ``rewards``.

Data parallel: each process takes its own prompts and samples their whole groups (a group
never spans processes), from a stream seeded by the batch's place in the data, so N processes
with a micro-batch each sample and learn what one process with N accumulated micro-batches
does.

One optimiser step per sampled batch, as TRL's ``GRPOTrainer`` with ``num_iterations=1``:
each micro-batch samples its own groups from the current policy, so the "old" log-probs of
the ratio are the current ones detached (the ratio is 1 and the clip is inactive; the
gradient is the policy gradient of the clipped objective at the sampling point, and the
sampling forward pass is saved). By default the loss is averaged over all response tokens of
the micro-batch (TRL's ``loss_type="bnpo"``, and its default "dapo" with one micro-batch on
one process); ``loss_aggregation`` also gives DeepSeekMath's mean of per-sequence means and
Dr. GRPO's constant normaliser (``ops.losses.aggregate_token_loss``), and
``skip_uniform_groups`` leaves groups without signal out of the loss (DAPO). Rewards from a
reward model are read at the EOS the policy emitted, as the reward model was trained; TRL's
GRPO scores the text without EOS.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.data import PromptCollator, load_prompts
from rlhfkit.experience.rewards import (
    RunningMoments,
    ScoreOptions,
    process_scores,
    shape_rewards,
)
from rlhfkit.experience.rollout import (
    ExperienceMaker,
    RolloutModels,
    RolloutSettings,
    require_finite_values,
)
from rlhfkit.experience.scorer_loading import build_scorer
from rlhfkit.experience.scorers import ScoreInput, Scorer, prepare_scorer
from rlhfkit.models.loading import load_causal_lm, load_tokenizer
from rlhfkit.models.passes import response_logprobs, sequence_inputs
from rlhfkit.ops.advantages import group_advantages, reinforce_pp_advantages, rloo_advantages
from rlhfkit.ops.logprobs import entropy_from_logits
from rlhfkit.ops.losses import aggregate_token_loss, kl_k3, ppo_policy_loss
from rlhfkit.ops.masks import masked_mean, masked_sum
from rlhfkit.runtime.distributed import stream_seed
from rlhfkit.runtime.packing import enable_packing
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.loop import WATCH_RL, Batch
from rlhfkit.trainers.policy import PolicyTrainer

logger = logging.getLogger(__name__)


def group_baseline_advantages(scores: torch.Tensor, config: GRPOConfig) -> torch.Tensor:
    """(B,) advantages of contiguous groups of ``num_generations`` scores, per ``advantage``."""
    if config.advantage == "rloo":
        return rloo_advantages(scores, config.num_generations)
    return group_advantages(scores, config.num_generations, scale_by_std=config.scale_rewards)


class GRPOTrainer(PolicyTrainer):
    """GRPO / RLOO on tokenised prompts (lists of ids) against ``scorer``.

    Args:
        config: a `GRPOConfig`.
        model: the policy (a causal LM matched to ``tokenizer``); LoRA is added here if set.
        tokenizer: distinct pad and EOS; decodes texts for the scorer and the logs.
        prompts: training prompts as token id lists (``data.encode_prompts``).
        scorer: gives one score per response (``scorers.Scorer``).
        eval_prompts: held-out prompts scored at evaluation (one sample each, fixed seed).
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
        prompts: Sequence[list[int]],
        scorer: Scorer,
        eval_prompts: Sequence[list[int]] = (),
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
        if config.padding_free:
            for policy_or_reference in (self.unwrapped_model, self.reference):
                if policy_or_reference is not None:
                    enable_packing(policy_or_reference)
        scorer = prepare_scorer(scorer, self.runtime, config.padding_free)
        settings = RolloutSettings(
            sampling=config.sampling,
            scores=ScoreOptions.of(config),
        )
        models = RolloutModels(self.unwrapped_model, self.reference, None)
        self.maker = ExperienceMaker(models, scorer, tokenizer, settings, self.runtime)
        # The policy's and the reference's passes take packed inputs only if both can.
        self.packed = models.packed
        self.eval_prompts = list(eval_prompts)
        self.sample_generator = torch.Generator(self.accelerator.device)
        self.moments = RunningMoments()  # of every score seen, for score_normalize

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
        self, query: torch.Tensor, query_mask: torch.Tensor, generator=None
    ) -> tuple[ScoreInput, torch.Tensor]:
        """One response per row of the left-padded ``query`` (B, Tq), sampled in eval mode by
        the experience maker. Returns the batch as scorers see it and ``eos_emitted`` (B,)."""
        lm = self.unwrapped_model
        was_training = lm.training
        try:
            out = self.maker.sample(query, query_mask, generator)
        finally:
            lm.train(was_training)
        batch = ScoreInput.from_ids(
            self.tokenizer, query, query_mask, out.response, out.response_mask
        )
        return batch, out.eos_emitted

    def reference_logprobs(self, inputs: dict[str, torch.Tensor], response: torch.Tensor):
        """(B, Tr) log ref(token) of the response tokens, without gradient."""
        temperature = self.config.temperature
        with torch.no_grad(), self.reference_model() as reference:
            return response_logprobs(reference, inputs, response, temperature).logprobs

    # ----------------------------------------------------------------- loss
    def compute_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        """Sample k responses per prompt, score, group advantages, clipped loss + beta * k3."""
        cfg = self.config
        started = time.perf_counter()
        k = cfg.num_generations
        query = batch["query"].repeat_interleave(k, dim=0)  # (B, Tq), groups contiguous
        query_mask = batch["query_mask"].repeat_interleave(k, dim=0)  # (B, Tq)
        if "sample_seed" in batch:  # from next_batch; other batches draw on where it stands
            self.sample_generator.manual_seed(batch["sample_seed"])
        samples, eos_emitted = self.sample(query, query_mask, self.sample_generator)
        generated = time.perf_counter()
        raw_scores = self.scorer(samples)  # (B,)
        options = self.maker.settings.scores
        scores = process_scores(raw_scores, eos_emitted, options, self.moments)

        response, mask = samples.response, samples.response_mask  # (B, Tr) each
        inputs = sequence_inputs(query, query_mask, response, mask, packed=self.packed)
        logprobs, logits, _ = response_logprobs(self.model, inputs, response, cfg.temperature)
        ref_logprobs = None
        if cfg.beta > 0:
            ref_logprobs = self.reference_logprobs(inputs, response)  # (B, Tr)
        token_advantages = self._advantages(scores, logprobs.detach(), ref_logprobs, mask)
        advantages = masked_mean(token_advantages, mask, dim=1)  # (B,) for the logs
        require_finite_values("scores", scores)
        require_finite_values("advantages", advantages)
        loss_mask = self._loss_mask(scores, mask)  # (B, Tr)
        aggregation = {"aggregation": cfg.loss_aggregation, "max_tokens": cfg.max_new_tokens}
        # One step per sample: the sampling policy is the current one, so old = current.
        loss, pg_stats = ppo_policy_loss(
            logprobs, logprobs.detach(), token_advantages, loss_mask, cfg.clip_range, **aggregation
        )
        metrics: dict[str, Any] = {"loss/policy": loss.detach()}
        if ref_logprobs is not None:
            if not cfg.kl_in_rewards:
                kl_terms = kl_k3(logprobs, ref_logprobs)  # (B, Tr)
                if cfg.kl_importance_weight:  # 1 in value; the gradient becomes k1's
                    kl_terms = kl_terms * torch.exp(logprobs - logprobs.detach())
                kl = aggregate_token_loss(kl_terms, loss_mask, **aggregation)
                loss = loss + cfg.beta * kl
                metrics["loss/kl_k3"] = kl.detach()
            # Per response, summed over tokens, k1: the same number PPO logs as kl/ref.
            metrics["kl/ref"] = masked_sum(logprobs.detach() - ref_logprobs, mask) / len(mask)
        with torch.no_grad():
            metrics["policy/entropy"] = masked_mean(entropy_from_logits(logits.detach()), mask)
        metrics.update(self._sample_stats(raw_scores, advantages, mask, eos_emitted, pg_stats))
        metrics["time/generate"] = generated - started
        metrics["time/update_forward"] = time.perf_counter() - generated
        self._log_samples(samples, raw_scores, advantages)
        return loss, metrics

    def _advantages(self, scores, logprobs, ref_logprobs, mask) -> torch.Tensor:
        """(B, Tr) advantages of the response tokens from the processed ``scores`` (B,).

        A group baseline gives each token its response's advantage; with the KL in the
        rewards each score first loses beta x its response's k1 KL. REINFORCE++ spreads the
        rewards over the tokens as PPO does (-beta x k1 per token, the score at the last) and
        whitens each token's return over the micro-batch."""
        cfg = self.config
        if cfg.advantage == "reinforce++":
            beta = cfg.beta if ref_logprobs is not None else 0.0
            reference = logprobs if ref_logprobs is None else ref_logprobs
            rewards, _ = shape_rewards(scores, logprobs, reference, mask, beta, "k1")
            return reinforce_pp_advantages(rewards, mask)
        if cfg.kl_in_rewards and ref_logprobs is not None:
            scores = scores - cfg.beta * masked_sum(logprobs - ref_logprobs, mask, 1)
        advantages = group_baseline_advantages(scores, cfg)  # (B,)
        return advantages[:, None].expand_as(logprobs)

    def _loss_mask(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The response mask (B, Tr) of the tokens in the loss: all of them, or with
        ``skip_uniform_groups`` those of the groups whose scores differ."""
        if not self.config.skip_uniform_groups:
            return mask
        grouped = scores.view(-1, self.config.num_generations)  # (P, k)
        varied = grouped.amax(dim=1) > grouped.amin(dim=1)  # (P,)
        keep = varied.repeat_interleave(self.config.num_generations)  # (B,)
        return mask * keep[:, None].to(mask.dtype)

    def _sample_stats(self, raw_scores, advantages, mask, eos_emitted, pg_stats) -> dict:
        """Metrics named as PPO's (`rollout.rollout_stats`) where they mean the same."""
        grouped = raw_scores.view(-1, self.config.num_generations)  # (P, k)
        group_std = grouped.std(dim=1)  # (P,)
        return {
            "score/mean": raw_scores.mean(),
            "score/std": raw_scores.std(),
            "score/group_std": group_std.mean(),
            "score/groups_without_signal": (group_std == 0).float().mean(),
            "advantage/abs_mean": advantages.abs().mean(),
            "response/length": mask.sum(1).float().mean(),
            "response/eos_rate": eos_emitted.float().mean(),
            "policy/clipfrac": pg_stats["clipfrac"],
            "policy/ratio": pg_stats["ratio"],
        }

    def _log_samples(self, samples: ScoreInput, scores, advantages) -> None:
        """Sample texts every `sample_every` steps (first micro-batch), so hacking is seen."""
        step = self.state.step + 1
        if self.tracker is None or (step != 1 and step % self.config.sample_every):
            return
        if getattr(self, "_samples_logged_at", None) == step:
            return
        self._samples_logged_at = step
        n = min(self.config.num_samples, len(samples.prompts))
        rows = [
            {
                "prompt": samples.prompts[i],
                "response": samples.responses[i],
                "score": float(scores[i]),
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
        """Mean score and length of one fixed-seed sample per held-out prompt."""
        if not self.eval_prompts:
            return {}
        generator = torch.Generator(self.accelerator.device).manual_seed(self.config.seed + 1)
        scores, lengths = [], []
        for batch in self.eval_batches(self.eval_prompts, self.collate_fn):
            samples, _ = self.sample(batch["query"], batch["query_mask"], generator)
            scores.append(self.scorer(samples).cpu())
            lengths.append(samples.response_mask.sum(1).float().cpu())
        return {
            "score": torch.cat(scores).mean().item(),
            "length": torch.cat(lengths).mean().item(),
        }


def run_grpo(config: GRPOConfig) -> Path:
    """Load policy, reference, scorer and prompts from ``config``, train, and return the final
    model's directory (the ``rlhfkit grpo`` and ``rlhfkit rloo`` commands; an `RLOOConfig`
    is a `GRPOConfig` whose ``advantage`` defaults to 'rloo')."""
    if config.resume and ckpt.is_complete(config.output_dir):
        logger.info("%s is already complete; nothing to do", config.output_dir)
        return config.final_dir
    trust = config.trust_remote_code
    tokenizer = load_tokenizer(config.model, trust_remote_code=trust)
    # The data first: a data error stops the run before any model is loaded.
    length = config.max_prompt_length
    template = config.chat_template
    prompts = load_prompts(
        config.train_data,
        config.train_split,
        tokenizer,
        length,
        config.max_train_samples,
        chat_template=template,
    )
    eval_prompts: list[list[int]] = []
    if config.eval_data:
        eval_prompts = load_prompts(
            config.eval_data,
            config.eval_split,
            tokenizer,
            length,
            config.max_eval_samples,
            chat_template=template,
        )
    set_seed(config.seed)
    model = load_causal_lm(config.model, tokenizer=tokenizer, trust_remote_code=trust)
    reference = None
    if config.reference and config.beta > 0:
        reference = load_causal_lm(config.reference, tokenizer=tokenizer, trust_remote_code=trust)
    scorer = build_scorer(
        config.reward_model,
        config.reward_functions,
        config.reward_weights,
        tokenizer=tokenizer,
        trust_remote_code=trust,
    )
    trainer = GRPOTrainer(
        config, model, tokenizer, prompts, scorer, eval_prompts, reference=reference
    )
    trainer.train()
    return config.final_dir
