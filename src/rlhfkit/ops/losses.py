"""Losses of the RLHF family, as pure functions of per-token or per-sequence tensors.

Sources, one per function (see each docstring):
- KL estimators k1, k2, k3: J. Schulman, "Approximating KL Divergence" (blog, 2020).
- ``ppo_policy_loss``: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7;
  the upper clip bound apart from the lower one ("clip-higher"): Yu et al. 2025, "DAPO: An
  Open-Source LLM Reinforcement Learning System at Scale", eq. 10; the ratio of a whole
  response instead of a token's (``importance_log_ratio``): Zheng et al. 2025, "Group
  Sequence Policy Optimization", eq. 7 (GSPO).
- ``aggregate_token_loss``: the per-token loss reduced over a batch as a mean over all its
  tokens (DAPO, sec. 3.3), a mean of per-sequence means (Shao et al. 2024, "DeepSeekMath",
  eq. 3, GRPO) or a sum over a constant number of tokens (Liu et al. 2025, "Understanding
  R1-Zero-Like Training: A Critical Perspective", sec. 3.1, Dr. GRPO).
- ``ppo_value_loss``: the clipped value loss of OpenAI baselines' ppo2 and lm-human-preferences
  (not in the PPO paper), see Huang et al. 2022, "The N Implementation Details of RLHF with PPO".
- pairwise reward losses: Ouyang et al. 2022 (InstructGPT) eq. 1, Touvron et al. 2023
  (Llama 2) eq. 2 for the margin, ColossalAI Coati's ``LogExpLoss``.
- ``reward_centering``: Eisenstein et al. 2023, "Helping or Herding? Reward Model Ensembles
  Mitigate but do not Eliminate Reward Hacking", eq. 2.
- ``dpo_loss``: Rafailov et al. 2023 (DPO) eq. 7; Mitchell 2023, "A note on DPO with noisy
  preferences & relationship to IPO" (conservative DPO); Azar et al. 2023, "A General
  Theoretical Paradigm to Understand Learning from Human Preferences" (IPO).
- ``rpo_loss``: Pang et al. 2024, "Iterative Reasoning Preference Optimization" (DPO + NLL).

Per-token losses take a mask and average over real tokens of the whole batch (``masked_mean``
with ``dim=None``), as lm-human-preferences and TRL do, unless an ``aggregation`` says
otherwise (``aggregate_token_loss``). Tensors that are targets
(old log-probs, advantages, returns, old values, reference log-probs) are detached here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rlhfkit.ops.masks import masked_mean, masked_sum


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log pi(x) - log ref(x) per token: unbiased for KL(pi || ref), can be negative."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log pi(x) - log ref(x))^2 per token: biased, low variance, >= 0."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = (r - 1) - log r with r = ref(x) / pi(x), per token: unbiased for KL(pi || ref), >= 0.

    Written with ``expm1`` so that r close to 1 keeps its precision.
    """
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) for tokens sampled from pi, no reduction.

    Args:
        logprobs: (B, T) log pi of the sampled tokens (the policy being trained).
        ref_logprobs: (B, T) log ref of the same tokens (the frozen reference, not the
            old policy).
        estimator: "k1" (InstructGPT's per-token penalty), "k2" or "k3".
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator={estimator!r} is not one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)


LOSS_AGGREGATIONS = ("token_mean", "sequence_mean", "constant")


def aggregate_token_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
) -> torch.Tensor:
    """A (B, T) per-token loss reduced to a scalar over the real tokens of ``mask``.

    - ``token_mean``: the sum over every real token of the batch divided by their count, so
      each token weighs the same however long its response (DAPO's token-level loss).
    - ``sequence_mean``: each response's mean over its tokens, then the mean over the
      responses that have any (GRPO as DeepSeekMath writes it: a long response's tokens
      each weigh less).
    - ``constant``: the sum over real tokens divided by B * ``max_tokens``, a constant (Dr.
      GRPO: neither the length of a response nor of the batch's responses scales a token's
      gradient).
    """
    if aggregation == "token_mean":
        return masked_mean(per_token, mask)
    if aggregation == "sequence_mean":
        has_tokens = (mask != 0).any(dim=1)  # (B,)
        per_sequence = masked_mean(per_token, mask, dim=1)  # (B,)
        return masked_sum(per_sequence, has_tokens) / has_tokens.sum().clamp(min=1)
    if aggregation == "constant":
        if max_tokens is None or max_tokens < 1:
            raise ValueError(f"aggregation 'constant' needs max_tokens >= 1, got {max_tokens}")
        return masked_sum(per_token, mask) / (per_token.shape[0] * max_tokens)
    raise ValueError(f"aggregation must be one of {LOSS_AGGREGATIONS}, got {aggregation!r}")


IMPORTANCE_LEVELS = ("token", "sequence")


def importance_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """(B, T) log of the importance ratio pi / pi_old that weighs each response token, 0 at
    padding (an inf there would give NaN gradients).

    - ``token``: log pi(y_t) - log pi_old(y_t), each token its own ratio (PPO, GRPO).
    - ``sequence``: the mean of those over the response's real tokens, the same at each of
      them: the log of GSPO's ratio (pi(y | x) / pi_old(y | x)) ^ (1 / |y|) (Zheng et al.
      2025, eq. 7), so that a response is clipped as a whole, in a range that does not
      depend on its length. Its gradient reaches every token of the response through the
      mean; at pi = pi_old it is the token level's.
    """
    if level not in IMPORTANCE_LEVELS:
        raise ValueError(f"level={level!r} is not one of {list(IMPORTANCE_LEVELS)}")
    real = mask != 0
    log_ratio = torch.where(real, logprobs - old_logprobs.detach(), 0.0)  # (B, T)
    if level == "token":
        return log_ratio
    per_response = log_ratio.sum(dim=1, keepdim=True) / real.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.where(real, per_response, 0.0)  # (B, T)


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float,
    clip_range_high: float | None = None,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
    ratio_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate, negated to be minimised (Schulman et al. 2017, eq. 7).

    loss = aggregate(max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))), r = exp(logprobs - old)
    per token, or per response with ``ratio_level="sequence"`` (GSPO: ``importance_log_ratio``).

    Args:
        logprobs: (B, T) log-probs under the policy being updated (with gradient).
        old_logprobs: (B, T) log-probs recorded at rollout time.
        advantages: (B, T) advantages (usually whitened GAE).
        mask: (B, T) response mask.
        clip_range: eps_low, the policy clip range below 1 (not the value one); and above 1
            too unless ``clip_range_high`` is given.
        clip_range_high: eps_high (DAPO's clip-higher: a larger eps_high lets the probability
            of an unlikely token with a positive advantage grow more in one update, against
            entropy collapse); None = ``clip_range``.
        aggregation, max_tokens: how the per-token terms reduce to the loss
            (``aggregate_token_loss``); the statistics are token means whatever it is.
        ratio_level: "token" or "sequence" (``importance_log_ratio``).

    Returns:
        ``(loss, stats)``; stats (detached scalars): ``clipfrac``, the share of real tokens
        where the clipped term is the active one; ``approx_kl``, masked_mean of
        0.5 (logprobs - old)^2 per token (at either level), the k2 estimate of KL(old || new);
        ``ratio``, the mean ratio at ``ratio_level``.
    """
    high = clip_range if clip_range_high is None else clip_range_high
    if clip_range <= 0 or high <= 0:
        raise ValueError(f"clip ranges must be > 0, got {clip_range} and {high}")
    real = mask != 0
    log_ratio = importance_log_ratio(logprobs, old_logprobs, mask, ratio_level)  # (B, T)
    ratio = torch.exp(log_ratio)
    advantages = torch.where(real, advantages.detach(), 0.0)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate_token_loss(per_token, mask, aggregation, max_tokens)
    with torch.no_grad():
        token_log_ratio = (
            log_ratio
            if ratio_level == "token"
            else importance_log_ratio(logprobs, old_logprobs, mask)
        )  # (B, T)
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "approx_kl": masked_mean(0.5 * token_log_ratio**2, mask),
            "ratio": masked_mean(ratio, mask),
        }
    return loss, stats


def ppo_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss of lm-human-preferences / baselines ppo2 (Huang et al. 2022).

    loss = 0.5 masked_mean(max((v - R)^2, (clip(v, old - eps_v, old + eps_v) - R)^2)).
    ``clip_range=None`` disables clipping (plain 0.5 masked_mean((v - R)^2)).

    Returns:
        ``(loss, stats)`` with ``vf_clipfrac``, the share of real tokens where the clipped
        error is the larger one (detached).
    """
    real = mask != 0
    old_values = torch.where(real, old_values.detach(), 0.0)  # (B, T)
    returns = torch.where(real, returns.detach(), 0.0)  # (B, T)
    values = torch.where(real, values, 0.0)
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return 0.5 * masked_mean(unclipped, mask), {"vf_clipfrac": values.new_zeros(())}
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0 or None, got {clip_range}")
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean((clipped > unclipped).float(), mask)}
    return loss, stats


def pairwise_logsigmoid_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """mean(-log sigmoid(r_chosen - r_rejected - margin)) over (B,) pairs.

    InstructGPT eq. 1 for K = 2; the optional per-pair ``margin`` (B,) is Llama 2's eq. 2
    (a larger margin for pairs the labellers found clearly different).
    """
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff).mean()


def pairwise_logexp_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """mean(log(1 + exp(r_rejected - r_chosen))), Coati's ``LogExpLoss``.

    Mathematically the same as ``pairwise_logsigmoid_loss`` without margin; computed with
    softplus so large differences neither overflow nor lose precision.
    """
    return F.softplus(rejected - chosen).mean()


def ranking_loss(scores: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """InstructGPT's K-way ranking loss (Ouyang et al. 2022, eq. 1).

    Every prompt contributes all C(K, 2) (better, worse) pairs, each -log sigmoid(r_better -
    r_worse), weighted 1 / (number of pairs) so that each prompt counts once; the result is
    the mean over prompts. InstructGPT does this to avoid overfitting to prompts whose K
    responses would otherwise appear in many separate pairs.

    Args:
        scores: (N, K) reward of each response, ordered best first.
        valid: (N, K) mask for prompts with fewer than K responses (nonzero = present);
            pairs are formed among valid responses only, and prompts with fewer than two
            valid responses are left out of the mean.

    Returns:
        A scalar loss.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (N, K) best first, got shape {tuple(scores.shape)}")
    k = scores.shape[1]
    better, worse = torch.triu_indices(k, k, offset=1, device=scores.device)  # (P,) each
    pair_losses = -F.logsigmoid(scores[:, better] - scores[:, worse])  # (N, P)
    if valid is None:
        return pair_losses.mean()
    if valid.shape != scores.shape:
        raise ValueError(
            f"valid shape {tuple(valid.shape)} does not match scores shape {tuple(scores.shape)}"
        )
    present = valid != 0
    pair_valid = present[:, better] & present[:, worse]  # (N, P)
    per_prompt = masked_mean(pair_losses, pair_valid, dim=-1)  # (N,)
    return masked_mean(per_prompt, pair_valid.any(dim=-1))


def reward_centering(scores: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The centring term of Eisenstein et al. 2023 (eq. 2): mean((r_chosen + r_rejected)^2).

    A pairwise reward loss sees only differences, so the rewards may drift by any offset per
    prompt; this term, added to the loss with a small weight, pulls the two rewards of each pair
    to sum to 0, i.e. to be centred. For K > 2 responses it averages (r_i + r_j)^2 over the
    C(K, 2) pairs of each prompt, then over prompts, weighting each prompt once as
    ``ranking_loss`` does; for K = 2 that is the paper's term, as TRL's ``RewardTrainer`` adds
    it (``center_rewards_coefficient``).

    Args:
        scores: (N, K) reward of each response, best first.
        valid: (N, K) mask for prompts with fewer than K responses (nonzero = present).

    Returns:
        A scalar, >= 0.
    """
    k = scores.shape[1]
    first, second = torch.triu_indices(k, k, offset=1, device=scores.device)  # (P,) each
    squares = (scores[:, first] + scores[:, second]) ** 2  # (N, P)
    if valid is None:
        return squares.mean()
    present = valid != 0
    pair_valid = present[:, first] & present[:, second]  # (N, P)
    per_prompt = masked_mean(squares, pair_valid, dim=-1)  # (N,)
    return masked_mean(per_prompt, pair_valid.any(dim=-1))


def _dpo_sigmoid(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """DPO, Rafailov et al. 2023 eq. 7: -log sigmoid(beta h)."""
    if label_smoothing != 0:
        raise ValueError(
            f"label_smoothing={label_smoothing} needs loss_type='conservative' (cDPO); "
            "loss_type='sigmoid' is plain DPO"
        )
    return -F.logsigmoid(beta * h)


def _dpo_conservative(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """cDPO (Mitchell 2023): labels flipped with probability e, -(1-e) ls(b h) - e ls(-b h)."""
    if not 0 < label_smoothing < 0.5:
        raise ValueError(
            f"loss_type='conservative' needs 0 < label_smoothing < 0.5, got {label_smoothing}"
        )
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(
        -beta * h
    )


def _ipo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """IPO (Azar et al. 2023): (h - 1 / (2 beta))^2, beta playing the role of tau."""
    if label_smoothing != 0:
        raise ValueError(f"label_smoothing={label_smoothing} is not used by loss_type='ipo'")
    return (h - 1 / (2 * beta)) ** 2


DPO_LOSSES: dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]] = {
    "sigmoid": _dpo_sigmoid,
    "conservative": _dpo_conservative,
    "ipo": _ipo,
}


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO-family losses from sequence log-probs.

    With h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected), the difference
    of log-ratios: "sigmoid" = -log sigmoid(beta h) (DPO eq. 7); "conservative" = cDPO with
    ``label_smoothing`` e in (0, 0.5); "ipo" = (h - 1/(2 beta))^2. The caller decides what
    log-probs to pass: DPO uses the sum over response tokens, while the IPO paper's
    experiments use the average per token.

    Args:
        policy_chosen, policy_rejected, ref_chosen, ref_rejected: (B,) sequence log-probs;
            the reference ones are detached.
        beta: inverse temperature (DPO's beta, IPO's tau).

    Returns:
        ``(losses (B,), chosen_rewards (B,), rejected_rewards (B,))``; the implicit rewards
        beta (log pi - log ref) are detached, for logging and reward accuracy.
    """
    if loss_type not in DPO_LOSSES:
        raise ValueError(f"loss_type={loss_type!r} is not one of {sorted(DPO_LOSSES)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen_log_ratio = policy_chosen - ref_chosen.detach()  # (B,)
    rejected_log_ratio = policy_rejected - ref_rejected.detach()  # (B,)
    losses = DPO_LOSSES[loss_type](chosen_log_ratio - rejected_log_ratio, beta, label_smoothing)
    return losses, beta * chosen_log_ratio.detach(), beta * rejected_log_ratio.detach()


def rpo_loss(
    dpo_losses: torch.Tensor,
    chosen_logps: torch.Tensor,
    chosen_tokens: torch.Tensor,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RPO's loss (Pang et al. 2024): the DPO loss plus ``alpha`` times the negative
    log-likelihood of the chosen responses, which keeps their likelihood up.

    loss = mean(dpo_losses) + alpha * nll, nll = -sum(chosen_logps) / sum(chosen_tokens):
    the NLL per token over every chosen token of the batch, as TRL computes it (its
    ``rpo_alpha``, now ``loss_type=["sigmoid", "sft"]`` with ``loss_weights=[1, alpha]``),
    so a longer chosen response weighs more; the paper normalises each pair's NLL by that
    pair's own length.

    Args:
        dpo_losses: (B,) per-pair losses (``dpo_loss``).
        chosen_logps: (B,) log-prob of each chosen response, summed over its tokens (EOS
            included), with gradient.
        chosen_tokens: (B,) number of tokens of each chosen response.
        alpha: weight of the NLL term, >= 0.

    Returns:
        ``(loss, nll)``: the scalar loss and the NLL per token (detached).
    """
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    nll = -chosen_logps.sum() / chosen_tokens.sum().clamp(min=1)
    return dpo_losses.mean() + alpha * nll, nll.detach()
