"""The update of every RL stage: PPO's clipped policy loss on a micro-batch of experience,
and the schedule on which each trained model takes one optimiser step per minibatch.

``policy_loss`` is the one policy objective (PPO, GRPO, RLOO, REINFORCE++ alike): the clipped
surrogate with its clip range below and above 1, aggregated over tokens as the stage says,
plus, where the stage puts the KL in the loss rather than in the rewards, beta x the k3
estimate; minus an entropy bonus. Where the update is the first pass of the policy over the
experience (one step from the sampling policy) pi_old is that pass, detached.

Each trained model (the policy, or the separate critic) is an ``optim.MinibatchLearner``:
its own AdamW and schedule with its loss. With a separate critic the two share nothing but
the minibatches (the policy loss does not reach the critic, the value loss does not reach
the policy), so they need not take turns: on a CPU ``update_learners`` runs them side by
side, each on half the cores (``runtime/parallel.py``). AdamW is elementwise, so one
optimiser per model makes the same update as one over both; running side by side changes
float rounding only.

The policy's step is the longer one (its LM head and the log-softmax over the vocabulary),
so side by side it would finish last and leave a core idle. Its last minibatches therefore
wait for the critic and then run on all cores (``POLICY_SHARE_BESIDE_CRITIC``). The share is
fixed, not measured at run time, so the threads each step runs on, and hence its rounding,
are the same in every run and a resumed run continues exactly. The share and its timings:
docs/ppo.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from rlhfkit.experience.rollout import Rollout
from rlhfkit.models.passes import response_logprobs, sequence_inputs
from rlhfkit.ops.logprobs import entropy_from_logits
from rlhfkit.ops.losses import aggregate_token_loss, kl_k3, ppo_policy_loss
from rlhfkit.ops.masks import masked_mean, masked_sum
from rlhfkit.runtime.distributed import shares_over_ranks
from rlhfkit.runtime.parallel import run_parallel
from rlhfkit.trainers.optim import MinibatchLearner, accumulate

# The share of the policy's minibatches that run beside the critic's before the rest run on
# all cores: its step is the longer one (how the share was chosen: docs/ppo.md).
POLICY_SHARE_BESIDE_CRITIC = 0.8

Minibatch = list[tuple[Rollout, float]]  # micro-batches, each with its token weight


@dataclasses.dataclass(frozen=True)
class PolicyLossSettings:
    """The policy objective as a stage's config sets it.

    Attributes:
        temperature: the sampling temperature, at which the log-probs are read.
        clip_range, clip_range_high: the ratio's clip bounds [1 - low, 1 + high]; high None
            = low (DAPO's clip-higher sets it above).
        aggregation, max_tokens: how per-token terms reduce (``ops.losses.aggregate_token_loss``).
        ratio_level: the ratio per token or per response (``ops.losses.importance_log_ratio``).
        kl_in_loss: add kl_coef x the k3 KL to the loss (GRPO), instead of penalising the
            rewards (PPO).
        kl_importance_weight: weight each k3 term by pi / pi_old (1 in value; the gradient
            becomes that of KL(pi || ref) itself).
        entropy_coef: weight of the entropy bonus; 0 computes no entropy with gradient.
    """

    temperature: float
    clip_range: float
    clip_range_high: float | None = None
    aggregation: str = "token_mean"
    max_tokens: int | None = None
    ratio_level: str = "token"
    kl_in_loss: bool = False
    kl_importance_weight: bool = False
    entropy_coef: float = 0.0


def policy_loss(
    model, mb: Rollout, settings: PolicyLossSettings, kl_coef: float, packed: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """The policy's loss on the micro-batch ``mb`` (with gradient through ``model``), its
    statistics (0-dim tensors on the device, read once an update), and the values of a value
    head on the policy's trunk (None without one)."""
    inputs = sequence_inputs(*mb.sequences, packed=packed)
    logprobs, logits, values = response_logprobs(
        model, inputs, mb.response, settings.temperature
    )  # (b, Tr), (b, Tr, V), (b, Tr) or None
    first_pass = mb.logprobs is None  # then the update's pass is pi_old
    old = logprobs.detach() if first_pass else mb.logprobs
    mask = mb.loss_mask
    aggregation = {"aggregation": settings.aggregation, "max_tokens": settings.max_tokens}
    loss, pg_stats = ppo_policy_loss(
        logprobs, old, mb.advantages, mask, settings.clip_range, settings.clip_range_high,
        **aggregation, ratio_level=settings.ratio_level,
    )  # fmt: skip
    stats = {"loss/policy": loss.detach()} | {f"policy/{k}": v for k, v in pg_stats.items()}
    if settings.kl_in_loss and mb.ref_logprobs is not None:
        kl_terms = kl_k3(logprobs, mb.ref_logprobs)  # (b, Tr)
        if settings.kl_importance_weight:
            kl_terms = kl_terms * torch.exp(logprobs - old)
        kl = aggregate_token_loss(kl_terms, mask, **aggregation)
        loss = loss + kl_coef * kl
        stats["loss/kl_k3"] = kl.detach()
    if first_pass:  # what the experience's own pass would have reported
        stats |= _first_pass_stats(logprobs, logits, mb)
    if settings.entropy_coef > 0:
        entropy = masked_mean(entropy_from_logits(logits), mask)
        loss = loss - settings.entropy_coef * entropy
        stats["loss/entropy"] = entropy.detach()
    return loss, stats, values


@torch.no_grad()
def _first_pass_stats(logprobs: torch.Tensor, logits: torch.Tensor, mb: Rollout) -> dict:
    """The policy's entropy and its k1 KL to the reference (summed per response, averaged),
    from the update's pass where it is the first over ``mb``."""
    mask = mb.response_mask
    stats = {"policy/entropy": masked_mean(entropy_from_logits(logits.detach()), mask)}
    if mb.ref_logprobs is not None:
        kl = masked_sum(logprobs.detach() - mb.ref_logprobs, mask) / len(mask)
        stats["kl/ref"] = kl
    return stats


def shuffled_minibatches(
    rollout: Rollout, epochs: int, minibatch_size: int, batch_size: int, generator
) -> list[Minibatch]:
    """``epochs`` passes over ``rollout`` in minibatches of ``minibatch_size`` rows, each a
    list of micro-batches of ``batch_size`` rows (padding columns trimmed) with their
    ``token_weights``. A pass of several minibatches takes the rows in a fresh random order;
    one of a single minibatch takes them as they are (the order of its rows changes
    nothing but rounding)."""
    minibatches = []
    for _ in range(epochs):
        if len(rollout) > minibatch_size:
            order = torch.randperm(len(rollout), generator=generator)
        else:
            order = torch.arange(len(rollout))
        for minibatch in order.to(rollout.query.device).split(minibatch_size):
            minibatches.append([rollout.select(micro) for micro in minibatch.split(batch_size)])
    return token_weights(minibatches)


def token_weights(minibatches: list[list[Rollout]]) -> list[Minibatch]:
    """Each micro-batch with its weight: its share of the response tokens of the micro-batches
    in the same place on every process, times the number of processes.

    A micro-batch's loss is a mean over its tokens and data parallelism averages the
    processes' gradients, so weighting each process's mean this way makes the step the one
    of a mean over all the processes' tokens, as one process holding them all would take.
    With one process every weight is exactly 1.
    """
    micros = [mb for minibatch in minibatches for mb in minibatch]
    weights = iter(shares_over_ranks(torch.stack([mb.response_mask.sum() for mb in micros])))
    return [[(mb, next(weights)) for mb in minibatch] for minibatch in minibatches]


def update_learners(
    learners: list[MinibatchLearner], minibatches: list[Minibatch], parallel: bool
) -> dict[str, float]:
    """Every learner's steps over ``minibatches``; the mean statistics of each step.

    ``learners[0]`` is the policy (or the critic alone, in its warmup). With ``parallel`` and
    a separate critic they run side by side, and the policy's last minibatches on all cores
    once the others are done."""
    policy, *others = learners
    if parallel and others:
        beside = math.ceil(len(minibatches) * POLICY_SHARE_BESIDE_CRITIC)
        tasks = [functools.partial(policy.learn, minibatches[:beside])]
        tasks += [functools.partial(learner.learn, minibatches) for learner in others]
        sums = run_parallel(tasks)
        if beside < len(minibatches):
            accumulate(sums[0], policy.learn(minibatches[beside:]))
    else:
        sums = [policy.learn(minibatches)]
        for learner in others:
            sums.append(learner.learn(minibatches))
    stats: dict[str, float] = {}
    for learner_sums in sums:  # disjoint keys
        stats |= {key: value / len(minibatches) for key, value in learner_sums.items()}
    return stats
