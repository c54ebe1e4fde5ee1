"""Pure tensor math for RLHF (torch only, no state): log-probs, masks, advantages and losses.

Every function names its source in its docstring; trainers call these and never inline math.
"""

from rlhfkit.ops.advantages import gae, group_advantages, rloo_advantages
from rlhfkit.ops.ensembles import ENSEMBLE_RULES, combine_scores
from rlhfkit.ops.logprobs import (
    check_token_ids,
    entropy_from_logits,
    log_perplexity,
    shifted_logprobs,
    token_logprobs,
)
from rlhfkit.ops.losses import (
    DPO_LOSSES,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    aggregate_token_loss,
    dpo_loss,
    importance_log_ratio,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalty,
    pairwise_logexp_loss,
    pairwise_logsigmoid_loss,
    ppo_policy_loss,
    ppo_value_loss,
    ranking_loss,
    reward_centering,
    rpo_loss,
)
from rlhfkit.ops.masks import (
    last_token_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    position_ids_from_mask,
    truncate_after_eos,
)

__all__ = [
    "DPO_LOSSES",
    "ENSEMBLE_RULES",
    "IMPORTANCE_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "aggregate_token_loss",
    "check_token_ids",
    "combine_scores",
    "dpo_loss",
    "entropy_from_logits",
    "gae",
    "group_advantages",
    "importance_log_ratio",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
    "last_token_index",
    "log_perplexity",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "pairwise_logexp_loss",
    "pairwise_logsigmoid_loss",
    "position_ids_from_mask",
    "ppo_policy_loss",
    "ppo_value_loss",
    "ranking_loss",
    "reward_centering",
    "rloo_advantages",
    "rpo_loss",
    "shifted_logprobs",
    "token_logprobs",
    "truncate_after_eos",
]
