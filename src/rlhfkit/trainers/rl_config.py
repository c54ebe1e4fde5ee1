"""`RLConfig`: the settings every RL stage shares (PPO, GRPO, RLOO, REINFORCE++), declared once.

`PPOConfig` (``ppo_config.py``) and `GRPOConfig` (``grpo_config.py``) add what their
algorithms do differently; what both read - the policy to start from, the prompts, sampling,
the scorer and the gold functions, the reference, LoRA, the clip of the policy objective and
the samples logged - is here, with one name, one docstring and one check each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rlhfkit.config import (
    DEMO_DATA,
    EvalPromptOptions,
    LoRAOptions,
    ReferenceOptions,
    SamplingOptions,
    ScorerOptions,
    TrainConfig,
    require,
)


@dataclass
class RLConfig(
    EvalPromptOptions, SamplingOptions, ScorerOptions, ReferenceOptions, LoRAOptions, TrainConfig
):
    """The fields of every RL stage: a policy trained on prompts against a scorer, with a KL
    to a frozen reference."""

    model: str = "runs/sft/final"
    """Policy to start from (the SFT model); also the frozen reference of the KL unless
    `reference` names another."""
    learning_rate: float = 1e-5
    """Peak learning rate of the policy's AdamW (reached after warmup), and of a separate
    critic's unless `critic_learning_rate` is set."""
    lr_scheduler: Literal["linear", "cosine", "constant"] = "linear"
    """Learning-rate decay over all optimiser steps of the run: linear to 0, cosine to 0, or
    constant."""
    log_every: int = 1
    """Log training metrics every this many iterations."""
    train_data: str = f"{DEMO_DATA}/prompts"
    """Prompts (any record kind with a prompt): .jsonl/.json/.parquet, dataset dir or hub name;
    every other column of a row reaches the reward functions by name."""
    train_split: str = "train"
    """Split to read from `train_data` when it is a dataset with splits."""
    max_train_samples: int | None = None
    """Use only the first this many training prompts; None uses all."""
    max_prompt_length: int = 128
    """Prompts longer than this many tokens keep their last tokens."""
    clip_range: float = 0.2
    """Policy ratio clip range epsilon of the clipped objective (below 1, and above unless
    `clip_range_high` is set)."""
    clip_range_high: float | None = None
    """Upper clip range: the ratio is clipped to [1 - clip_range, 1 + clip_range_high]
    (DAPO's clip-higher, e.g. 0.28 with clip_range 0.2); None = clip_range. Acts only where
    the policy has moved since sampling (more than one update per sampled batch)."""
    disable_dropout: bool = True
    """Turn dropout off in every model, so sampling and the update see the same policy (the
    ratio starts at exactly 1, as in TRL)."""
    sample_every: int = 10
    """Log sample texts (prompt, response, score) every this many iterations, so that reward
    hacking is seen."""
    num_samples: int = 4
    """Samples logged each time."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_lora()
        self._check_sampling()
        self._check_scorers()
        self._check_eval_prompts()
        self._check_reference()
        require(self, "train_data", bool(self.train_data), "a data file, directory or hub name")
        limit = self.max_train_samples
        require(self, "max_train_samples", limit is None or limit >= 1, "None or an integer >= 1")
        for name in ("max_prompt_length", "sample_every", "num_samples"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(self, "clip_range", 0 < self.clip_range < math.inf, "a number > 0")
        high = self.clip_range_high
        require(self, "clip_range_high", high is None or 0 < high < math.inf, "None or > 0")
