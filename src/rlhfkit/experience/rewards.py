"""From scores to the per-token rewards PPO learns from (the scores themselves come from
``scorers.py``).

- Missing-EOS penalty: TRL's ``missing_eos_penalty`` (subtract a constant) or
  lm-human-preferences' ``penalty_reward_value`` (replace the score) for responses that ran
  out of tokens before EOS.
- Score normalisation with running moments (Welford / Chan et al. parallel update, as TRL's
  ``RunningMoments``) and clipping (TRL's ``use_score_scaling`` / ``use_score_norm`` /
  ``score_clip``).
- ``shape_rewards``: Ziegler et al. 2019 / InstructGPT per-token rewards, -beta * KL(pi || ref)
  at every response token plus the score at the last real token.
- KL controllers: fixed, or adaptive as in Ziegler et al. 2019, section 2.2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlhfkit.ops.losses import kl_penalty
from rlhfkit.ops.masks import last_token_index
from rlhfkit.runtime.distributed import gather_over_ranks


# --------------------------------------------------------------------------- score processing
class RunningMoments:
    """Running mean and standard deviation over every score seen (Chan et al. 1979 update)."""

    def __init__(self):
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    @property
    def std(self) -> float:
        """Unbiased standard deviation (1.0 before two values were seen)."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 1.0

    def update(self, values: torch.Tensor) -> None:
        values = values.detach().double().flatten()
        n = values.numel()
        if n == 0:
            return
        batch_mean = values.mean().item()
        batch_m2 = ((values - batch_mean) ** 2).sum().item()
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta**2 * self.count * n / total
        self.count = total

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean, self.m2 = (
            int(state["count"]),
            float(state["mean"]),
            float(state["m2"]),
        )


@dataclass
class ScoreOptions:
    """How raw scores become the score added at the last token (all off by default).

    Attributes:
        missing_eos_penalty: subtracted from the score of a response without EOS (TRL's
            ``missing_eos_penalty``); None turns it off.
        missing_eos_replace: instead of subtracting, set such a score to -missing_eos_penalty
            (lm-human-preferences' ``penalty_reward_value``).
        normalize: "none"; "scale" divides by the running std; "standardize" also subtracts
            the running mean. Statistics include the current batch.
        clip: clamp the processed score to [-clip, clip]; None turns it off.
    """

    missing_eos_penalty: float | None = None
    missing_eos_replace: bool = False
    normalize: str = "none"
    clip: float | None = None

    @classmethod
    def of(cls, config) -> ScoreOptions:
        """The options of a stage config with ``ScorerOptions``' fields (PPO, GRPO, RLOO)."""
        return cls(
            config.missing_eos_penalty,
            config.missing_eos_replace,
            config.score_normalize,
            config.score_clip,
        )

    def __post_init__(self):
        if self.normalize not in ("none", "scale", "standardize"):
            raise ValueError(
                f"normalize={self.normalize!r}: allowed 'none', 'scale', 'standardize'"
            )
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip={self.clip}: must be > 0 or None")
        if self.missing_eos_replace and self.missing_eos_penalty is None:
            raise ValueError("missing_eos_replace=True needs missing_eos_penalty (the value)")


def process_scores(
    scores: torch.Tensor, eos_emitted: torch.Tensor, options: ScoreOptions, moments: RunningMoments
) -> torch.Tensor:
    """Apply, in order, the missing-EOS penalty, running normalisation and clipping.

    ``scores`` (B,), ``eos_emitted`` (B,) bool. ``moments`` is updated with the penalised
    scores of this batch (only when normalising); in a data-parallel run, with every
    process's scores, in rank order, so that each process normalises as one would.
    """
    if options.missing_eos_penalty is not None:
        penalised = (
            torch.full_like(scores, -options.missing_eos_penalty)
            if options.missing_eos_replace
            else scores - options.missing_eos_penalty
        )
        scores = torch.where(eos_emitted, scores, penalised)
    if options.normalize != "none":
        moments.update(gather_over_ranks(scores))
        shift = moments.mean if options.normalize == "standardize" else 0.0
        scores = (scores - shift) / max(moments.std, 1e-8)
    if options.clip is not None:
        scores = scores.clamp(-options.clip, options.clip)
    return scores


# --------------------------------------------------------------------------- reward shaping
def shape_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: -kl_coef * KL(pi || ref) at each real token, + score at the last one.

    Ziegler et al. 2019 eq. 2 / InstructGPT eq. 2, spread over tokens as lm-human-preferences
    and TRL do. The last real token is found from the mask (``ops.masks.last_token_index``),
    so it is the EOS when one was emitted and the final token otherwise.

    Args:
        scores: (B,) processed scores.
        logprobs, ref_logprobs: (B, Tr) of the sampled tokens under the policy and reference.
        response_mask: (B, Tr).
        kl_coef: beta.
        estimator: "k1" (default, InstructGPT), "k2" or "k3" (see ``ops.losses``).

    Returns:
        ``(rewards, kl)``, both (B, Tr) and 0 at padding; ``kl`` is the per-token estimate.
    """
    real = response_mask != 0
    kl = torch.where(real, kl_penalty(logprobs, ref_logprobs, estimator), 0.0)  # (B, Tr)
    rewards = -kl_coef * kl  # (B, Tr)
    last = last_token_index(response_mask)  # (B,)
    rewards = rewards.scatter_add(1, last[:, None], scores[:, None].to(rewards.dtype))
    return rewards, kl


# --------------------------------------------------------------------------- KL controllers
class FixedKLController:
    """A constant KL coefficient beta."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """Ziegler et al. 2019, section 2.2 (lm-human-preferences' ``AdaptiveKLController``).

    e = clip(KL / target - 1, -0.2, 0.2); beta <- beta * (1 + e * n_steps / horizon), where
    KL is the current KL(pi || ref) per sequence and n_steps the episodes since the last update.
    """

    def __init__(self, kl_coef: float, target: float, horizon: int):
        if not target > 0 or not horizon > 0:
            raise ValueError(f"target={target}, horizon={horizon}: both must be > 0")
        super().__init__(kl_coef)
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
