"""`GRPOConfig` and `RLOOConfig`: the settings of critic-free RL with group baselines
(trained by `trainers/grpo.py`).

Batch vocabulary: a micro-batch is `batch_size` prompts, each answered `num_generations`
times; an iteration (a step of the loop) samples `steps_per_generation` x
`gradient_accumulation_steps` micro-batches, then makes `num_iterations` passes over them,
one optimiser step per `gradient_accumulation_steps` micro-batches. With the defaults (1 and
1) an iteration is one optimiser step on freshly sampled responses, as TRL's GRPOTrainer
with `num_iterations=1`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rlhfkit.config import require
from rlhfkit.experience.rewards import ScoreOptions
from rlhfkit.experience.rollout import RolloutSettings
from rlhfkit.trainers.ppo_update import PolicyLossSettings
from rlhfkit.trainers.rl_config import RLConfig


@dataclass
class GRPOConfig(RLConfig):
    """Critic-free RL with group baselines: GRPO (Shao et al. 2024) or RLOO (Ahmadian et al.
    2024), and REINFORCE++ (Hu 2025): `batch_size` prompts per micro-batch, each answered
    `num_generations` times; by default one optimiser step per sampled batch."""

    output_dir: str = "runs/grpo"
    """Directory for checkpoints, metrics, samples, TensorBoard events and `final/`."""
    advantage: Literal["grpo", "rloo", "reinforce++"] = "grpo"
    """Baseline: 'grpo' = (score - group mean) [/ group std]; 'rloo' = leave-one-out;
    'reinforce++' = no group: each token's return (KL penalty per token, as PPO) whitened over
    the micro-batch (the KL is then always in the rewards)."""
    scale_rewards: bool = True
    """GRPO only: divide by the group std (False = Dr. GRPO, centring only)."""
    num_generations: int = 4
    """Responses sampled per prompt (the group size k, >= 2)."""
    beta: float = 0.04
    """Weight of the k3 KL(pi || ref) term in the loss; 0 drops it and the reference model."""
    kl_importance_weight: bool = False
    """Weight each token's k3 term by the ratio pi / pi_old (DeepSeek-V3.2's unbiased KL
    estimate; TRL's use_bias_correction_kl, on there by default): the same value at one update
    per batch, but the gradient of KL(pi || ref) itself, (log pi - log ref) grad log pi, where
    k3's is (1 - ref / pi) grad log pi."""
    kl_in_reward: bool = False
    """Put the KL in the scores instead of the loss: each response's score less beta x its k1
    KL summed over its tokens, before the group baseline (as PPO puts it in the rewards)."""
    num_iterations: int = 1
    """Passes of the update over each iteration's responses (TRL's num_iterations; PPO's
    ppo_epochs): from the second on, the ratio to the sampling policy moves from 1 and the
    clip acts."""
    steps_per_generation: int = 1
    """Optimiser steps per pass over an iteration's responses: each iteration samples this
    many steps' worth of micro-batches at once, and the later steps learn from responses of
    an older policy (the clip acts)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """The ratio pi / pi_old of the clipped objective: each token's own ('token') or one per
    response, the geometric mean of its tokens' ratios, clipped as a whole ('sequence': GSPO,
    Zheng et al. 2025, which clips in a far narrower range, e.g. clip_range 3e-4 and
    clip_range_high 4e-4, with loss_aggregation 'sequence_mean'). At the sampling policy both
    give the same gradient, so it acts only with num_iterations or steps_per_generation above
    1. 'sequence' needs one advantage per response ('grpo' or 'rloo')."""
    loss_aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    """How the per-token loss reduces over a micro-batch: 'token_mean' (every response token
    weighs the same; DAPO), 'sequence_mean' (each response's token mean, then their mean;
    GRPO as published) or 'constant' (the sum over max_new_tokens x responses; Dr. GRPO)."""
    skip_uniform_groups: bool = False
    """Leave groups whose scores are all equal out of the loss (DAPO's dynamic sampling,
    without the re-sampling): their advantages are 0, so they only dilute the token mean and
    the KL term; `score/groups_without_signal` counts them."""
    mask_truncated_completions: bool = False
    """Leave responses that ran out of tokens (no EOS within max_new_tokens) out of the loss
    (DAPO's overlong filtering): a cut-off answer is neither rewarded nor punished for where
    it was cut. Their scores still count in their group's baseline; missing_eos_penalty
    lowers their score instead."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self, "num_generations", self.num_generations >= 2, "an integer >= 2")
        require(self, "beta", 0 <= self.beta < math.inf, "a number >= 0")
        for name in ("num_iterations", "steps_per_generation"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(
            self,
            "importance_sampling_level",
            self.importance_sampling_level == "token" or self.advantage != "reinforce++",
            "'token' with advantage 'reinforce++' (its advantages differ from token to token; "
            "a ratio per response needs one advantage per response)",
        )

    @property
    def kl_in_rewards(self) -> bool:
        """Whether the KL penalises the rewards (no KL term in the loss)."""
        return self.kl_in_reward or self.advantage == "reinforce++"

    @property
    def rollout_size(self) -> int:
        """Responses sampled per micro-batch: batch_size prompts x num_generations."""
        return self.batch_size * self.num_generations

    @property
    def micro_batches_per_iteration(self) -> int:
        """Micro-batches of prompts one iteration samples, on each process."""
        return self.steps_per_generation * self.gradient_accumulation_steps

    @property
    def optimizer_steps_per_iteration(self) -> int:
        return self.steps_per_generation * self.num_iterations

    def loop_steps(self, num_examples: int, batches_per_epoch: int) -> int:
        """Iterations of the run: each takes ``micro_batches_per_iteration`` micro-batches."""
        if self.max_steps is not None:
            return self.max_steps
        return max(self.num_epochs * batches_per_epoch // self.micro_batches_per_iteration, 1)

    def optimizer_steps(self, loop_steps: int, world: int) -> int:
        return loop_steps * self.optimizer_steps_per_iteration

    @property
    def rollout_settings(self) -> RolloutSettings:
        """How each micro-batch's experience is made: no critic, the baseline of `advantage`,
        the KL in the scores where `kl_in_rewards`; the policy's own no-grad pass only where
        the update is not one step from the sampling policy."""
        return RolloutSettings(
            sampling=self.sampling,
            estimator=self.advantage,
            group_size=self.num_generations,
            scale_by_std=self.scale_rewards,
            skip_uniform_groups=self.skip_uniform_groups,
            mask_truncated=self.mask_truncated_completions,
            whiten_advantages=False,
            policy_pass=self.optimizer_steps_per_iteration > 1,
            scores=ScoreOptions.of(self),
        )

    @property
    def loss_settings(self) -> PolicyLossSettings:
        """The policy objective: the KL in the loss unless it is in the rewards."""
        return PolicyLossSettings(
            temperature=self.temperature,
            clip_range=self.clip_range,
            clip_range_high=self.clip_range_high,
            aggregation=self.loss_aggregation,
            ratio_level=self.importance_sampling_level,
            max_tokens=self.max_new_tokens,
            kl_in_loss=not self.kl_in_rewards,
            kl_importance_weight=self.kl_importance_weight,
        )


@dataclass
class RLOOConfig(GRPOConfig):
    """REINFORCE leave-one-out (Ahmadian et al. 2024): `GRPOConfig` with the RLOO baseline."""

    output_dir: str = "runs/rloo"
    """Directory for checkpoints, metrics, samples, TensorBoard events and `final/`."""
    advantage: Literal["grpo", "rloo", "reinforce++"] = "rloo"
    """Baseline: 'grpo' = (score - group mean) [/ group std]; 'rloo' = leave-one-out;
    'reinforce++' = no group: each token's return (KL penalty per token, as PPO) whitened over
    the micro-batch (the KL is then always in the rewards)."""
