"""Advantage estimators: GAE for PPO with a critic, group baselines for GRPO and RLOO.

- ``gae``: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized
  Advantage Estimation", eq. 16, A_t = sum_l (gamma lam)^l delta_{t+l} with
  delta_t = r_t + gamma V_{t+1} - V_t, computed with the backward recursion
  A_t = delta_t + gamma lam A_{t+1} as in lm-human-preferences and TRL. Departure: padding is
  handled by the mask (TRL slices to the response length instead), see the docstring.
- ``group_advantages``: Shao et al. 2024, "DeepSeekMath" (GRPO), section 4.1.2, outcome
  supervision: (r_i - mean(r)) / std(r) within the group of responses to one prompt. The std
  is unbiased as in TRL's GRPOTrainer. ``scale_by_std=False`` is the Dr. GRPO variant
  (Liu et al. 2025, "Understanding R1-Zero-Like Training"), which only centres.
- ``rloo_advantages``: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
  Optimization for Learning from Human Feedback in LLMs", the RLOO estimator (after Kool et
  al. 2019): the baseline of sample i is the mean reward of the other k - 1 samples.

- ``reinforce_pp_advantages``: Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach
  for Aligning Large Language Models", sec. 3: no critic and no group; each token's return
  (the per-token rewards, KL penalty included, summed to the end of the response) normalised
  over every token of the batch, the batch standing for the baseline.

Groups are contiguous blocks of ``group_size`` rows: rows [0, G) answer prompt 0, and so on.
"""

from __future__ import annotations

import torch

from rlhfkit.ops.masks import Reduce, masked_whiten


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns for (B, T) per-token rewards.

    A position with mask 0 is not the policy's: padding after the response, or inside an
    episode the environment's tokens (a tool's result, the other side's message), which are
    context, not actions. The recursion steps over it, so the policy token before it reads
    the value and the advantage of the policy token after it (verl's multi-turn GAE); after
    the last real token the value is 0 (the episode is finished, nothing follows). Positions
    outside the mask get advantage 0 and return 0, whatever ``rewards`` / ``values`` hold
    there.

    Inputs are detached: advantages and returns are regression and policy targets, and a
    gradient flowing into them through ``values`` would be a bug.

    Args:
        rewards: (B, T) per-token rewards (KL penalty plus the score at the last real token).
        values: (B, T) critic values V(s_t) from the rollout.
        mask: (B, T) response mask, nonzero for the policy's tokens.
        gamma: discount factor.
        lam: GAE lambda (1 = Monte Carlo returns minus values, 0 = one-step TD).

    Returns:
        ``(advantages, returns)``, both (B, T), with ``returns = advantages + values``.
    """
    if not rewards.shape == values.shape == mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must have the same (B, T) shape"
        )
    real = mask != 0
    rewards = torch.where(real, rewards.detach(), 0.0)  # (B, T)
    values = torch.where(real, values.detach(), 0.0)  # (B, T)
    next_value = torch.zeros_like(values[:, 0])  # (B,) V after the last position: episode over
    running = torch.zeros_like(next_value)  # (B,) A_{t+1}
    reversed_advantages = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        # Outside the mask the running advantage and the next value are carried over as
        # they are: the step is skipped, not taken with a reward and a value of 0.
        running = torch.where(real[:, t], delta + gamma * lam * running, running)
        reversed_advantages.append(running)
        next_value = torch.where(real[:, t], values[:, t], next_value)
    advantages = torch.where(real, torch.stack(reversed_advantages[::-1], dim=1), 0.0)  # (B, T)
    return advantages, advantages + values


def _grouped(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    if scores.dim() != 1:
        raise ValueError(f"scores must be (B,), got shape {tuple(scores.shape)}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 (a group of one has no baseline), got {group_size}"
        )
    if scores.shape[0] % group_size:
        raise ValueError(
            f"batch size {scores.shape[0]} is not divisible by group_size {group_size}"
        )
    dtype = torch.promote_types(scores.dtype, torch.float32)  # integer scores become float32
    return scores.detach().to(dtype).view(-1, group_size)  # (B / G, G)


def group_advantages(
    scores: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages: (s - group mean) / (group std + eps), or only centred (Dr. GRPO).

    Args:
        scores: (B,) one reward per response; rows [kG, (k+1)G) share a prompt.
        group_size: G, responses per prompt (>= 2).
        scale_by_std: divide by the unbiased group std (GRPO) or not (Dr. GRPO).
        eps: keeps groups with identical scores at advantage 0 instead of NaN.

    Returns:
        (B,) float advantages, one per response (broadcast over its tokens by the caller).
    """
    grouped = _grouped(scores, group_size)  # (B / G, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_by_std:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.view(-1)


def rloo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out: s_i minus the mean score of the other G - 1 group members.

    Equal to G / (G - 1) * (s_i - group mean).

    Args:
        scores: (B,) one reward per response; rows [kG, (k+1)G) share a prompt.
        group_size: G >= 2.

    Returns:
        (B,) float advantages.
    """
    grouped = _grouped(scores, group_size)  # (B / G, G)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others_mean).view(-1)


def reinforce_pp_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None = None
) -> torch.Tensor:
    """REINFORCE++ advantages of (B, T) per-token rewards: the returns G_t = sum of the
    rewards from t to the end of the response (gamma 1, no critic), whitened over every real
    token of the batch (``reduce``: over the processes too, as ``masks.masked_whiten``).
    Padded positions are 0."""
    returns, _ = gae(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)  # V = 0: A_t = G_t
    return masked_whiten(returns, mask, reduce=reduce)
