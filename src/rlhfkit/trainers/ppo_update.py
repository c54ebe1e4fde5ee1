"""The PPO update's schedule: each trained model takes one optimiser step per minibatch.

A ``MinibatchLearner`` is one ``Learner`` (a trained model with its own AdamW and schedule:
the policy, or the separate critic) with its loss. With a separate critic the two share nothing but the minibatches
(the policy loss does not reach the critic, the value loss does not reach the policy), so
they need not take turns: on a CPU ``update_learners`` runs them side by side, each on half
the cores (``runtime/parallel.py``). AdamW is elementwise, so one optimiser per model makes the same
update as one over both; running side by side changes float rounding only.

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
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from rlhfkit.experience.rollout import Rollout
from rlhfkit.runtime.distributed import shares_over_ranks
from rlhfkit.runtime.parallel import run_parallel
from rlhfkit.trainers.loop import accumulate
from rlhfkit.trainers.optim import Learner

# The share of the policy's minibatches that run beside the critic's before the rest run on
# all cores: its step is the longer one (how the share was chosen: docs/ppo.md).
POLICY_SHARE_BESIDE_CRITIC = 0.8

LossFn = Callable[[Rollout, float], tuple[torch.Tensor, dict[str, float]]]
Minibatch = list[tuple[Rollout, float]]  # micro-batches, each with its token weight


@dataclasses.dataclass
class MinibatchLearner:
    """A ``Learner`` with its loss: one optimiser step per minibatch of the rollout."""

    learner: Learner
    loss: LossFn  # (micro-batch, token weight) -> (loss, statistics)
    accumulation: int  # micro-batches per optimiser step
    autocast: Callable[[], AbstractContextManager]
    no_sync: Callable[[], AbstractContextManager]  # holds the gradients' all-reduce back

    @property
    def name(self) -> str:
        return self.learner.name

    def learn(self, minibatches: list[Minibatch]) -> dict[str, float]:
        """One optimiser step per minibatch (a list of micro-batches); the sums of the
        statistics over the minibatches. On several processes the gradients are averaged
        over them once per minibatch, after its last micro-batch."""
        sums: dict[str, float] = {}
        for micros in minibatches:
            for index, (mb, weight) in enumerate(micros):
                last = index == len(micros) - 1
                with nullcontext() if last else self.no_sync():
                    with self.autocast():
                        loss, stats = self.loss(mb, weight)
                    (loss / self.accumulation).backward()
                accumulate(sums, stats, 1 / self.accumulation)
            accumulate(sums, self.learner.step())
        return sums


def shuffled_minibatches(
    rollout: Rollout, epochs: int, minibatch_size: int, batch_size: int, generator
) -> list[Minibatch]:
    """``epochs`` shuffled passes over ``rollout`` in minibatches of ``minibatch_size`` rows,
    each a list of micro-batches of ``batch_size`` rows (padding columns trimmed) with their
    ``token_weights``."""
    minibatches = []
    for _ in range(epochs):
        order = torch.randperm(len(rollout), generator=generator)
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

    ``learners[0]`` is the policy. With ``parallel`` and a separate critic they run side by
    side, and the policy's last minibatches on all cores once the others are done."""
    policy, *others = learners
    beside = len(minibatches)
    if parallel and others:
        beside = math.ceil(len(minibatches) * POLICY_SHARE_BESIDE_CRITIC)
    tasks = [functools.partial(policy.learn, minibatches[:beside])]
    tasks += [functools.partial(learner.learn, minibatches) for learner in others]
    sums = run_parallel(tasks, enabled=parallel)
    if beside < len(minibatches):
        accumulate(sums[0], policy.learn(minibatches[beside:]))
    stats: dict[str, float] = {}
    for learner_sums in sums:  # disjoint keys but "lr", which all learners share
        stats |= {key: value / len(minibatches) for key, value in learner_sums.items()}
    return stats
