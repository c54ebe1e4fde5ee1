"""`GRPOConfig` and `RLOOConfig`: the settings of critic-free RL with group baselines
(trained by `trainers/grpo.py`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rlhfkit.config import (
    DEMO_DATA,
    EvalPromptOptions,
    LoRAOptions,
    SamplingOptions,
    ScorerOptions,
    TrainConfig,
    require,
)


@dataclass
class GRPOConfig(EvalPromptOptions, SamplingOptions, ScorerOptions, LoRAOptions, TrainConfig):
    """Critic-free RL with group baselines: GRPO (Shao et al. 2024) or RLOO (Ahmadian et al.
    2024). One optimiser step per sampled batch: `batch_size` prompts per micro-batch, each
    answered `num_generations` times."""

    model: str = "runs/sft/final"
    """Policy to start from (the SFT model); also the frozen reference of the KL term."""
    output_dir: str = "runs/grpo"
    """Directory for checkpoints, metrics, samples, TensorBoard events and `final/`."""
    learning_rate: float = 1e-5
    """Peak learning rate of AdamW (reached after warmup)."""
    lr_scheduler: Literal["linear", "cosine", "constant"] = "linear"
    """Learning-rate decay after warmup: linear to 0, cosine to 0, or constant."""
    log_every: int = 1
    """Log training metrics every this many optimiser steps."""
    train_data: str = f"{DEMO_DATA}/prompts"
    """Prompts (any record kind with a prompt): .jsonl/.json/.parquet, dataset dir or hub name."""
    train_split: str = "train"
    """Split to read from `train_data` when it is a dataset with splits."""
    max_train_samples: int | None = None
    """Use only the first this many training prompts; None uses all."""
    max_prompt_length: int = 128
    """Prompts longer than this many tokens keep their last tokens."""
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
    clip_range: float = 0.2
    """Policy ratio clip range epsilon of the clipped objective."""
    loss_aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    """How the per-token loss reduces over a micro-batch: 'token_mean' (every response token
    weighs the same; DAPO), 'sequence_mean' (each response's token mean, then their mean;
    GRPO as published) or 'constant' (the sum over max_new_tokens x responses; Dr. GRPO)."""
    skip_uniform_groups: bool = False
    """Leave groups whose scores are all equal out of the loss (DAPO's dynamic sampling,
    without the re-sampling): their advantages are 0, so they only dilute the token mean and
    the KL term; `score/groups_without_signal` counts them."""
    reference: str | None = None
    """Reference model name or directory; None uses the starting model `model`."""
    disable_dropout: bool = True
    """Turn dropout off, so sampling and the update see the same policy (ratio exactly 1)."""
    sample_every: int = 10
    """Log sample texts (prompt, response, score, advantage) every this many steps."""
    num_samples: int = 4
    """Samples logged each time."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_lora()
        self._check_sampling()
        self._check_scorers()
        require(self, "train_data", bool(self.train_data), "a data file, directory or hub name")
        for name in ("max_prompt_length", "sample_every", "num_samples"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        self._check_eval_prompts()
        limit = self.max_train_samples
        require(self, "max_train_samples", limit is None or limit >= 1, "None or an integer >= 1")
        require(self, "num_generations", self.num_generations >= 2, "an integer >= 2")
        require(self, "beta", 0 <= self.beta < math.inf, "a number >= 0")
        require(self, "clip_range", 0 < self.clip_range < math.inf, "a number > 0")
        require(
            self,
            "reference",
            not (self.lora and self.reference),
            "None with lora=True (the reference is the model with its adapter disabled)",
        )

    @property
    def kl_in_rewards(self) -> bool:
        """Whether the KL penalises the rewards (no KL term in the loss)."""
        return self.kl_in_reward or self.advantage == "reinforce++"

    @property
    def rollout_size(self) -> int:
        """Responses sampled per micro-batch: batch_size prompts x num_generations."""
        return self.batch_size * self.num_generations


@dataclass
class RLOOConfig(GRPOConfig):
    """REINFORCE leave-one-out (Ahmadian et al. 2024): `GRPOConfig` with the RLOO baseline."""

    output_dir: str = "runs/rloo"
    """Directory for checkpoints, metrics, samples, TensorBoard events and `final/`."""
    advantage: Literal["grpo", "rloo", "reinforce++"] = "rloo"
    """Baseline: 'grpo' = (score - group mean) [/ group std]; 'rloo' = leave-one-out;
    'reinforce++' = no group: each token's return (KL penalty per token, as PPO) whitened over
    the micro-batch (the KL is then always in the rewards)."""
