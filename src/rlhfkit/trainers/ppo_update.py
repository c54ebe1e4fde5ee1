"""The PPO update's schedule: each trained model takes one optimiser step per minibatch.

A ``Learner`` is one trained model with its own AdamW and learning-rate schedule: the policy,
or the separate critic. With a separate critic the two share nothing but the minibatches
(the policy loss does not reach the critic, the value loss does not reach the policy), so
they need not take turns: on a CPU ``update_learners`` runs them side by side, each on half
the cores (``parallel.py``). AdamW is elementwise, so one optimiser per model makes the same
update as one over both; running side by side changes float rounding only.

The policy's step is the longer one (its LM head and the log-softmax over the vocabulary),
so side by side it would finish last and leave a core idle. Its last minibatches therefore
wait for the critic and then run on all cores (``POLICY_SHARE_BESIDE_CRITIC``). The share is
fixed, not measured at run time, so the threads each step runs on, and hence its rounding,
are the same in every run and a resumed run continues exactly.

Measured on ``benchmarks/bench_ppo.py``'s workload (16 minibatches of 8 sequences; 2 cores):
the update takes 1.24 s against 1.51 s one after the other (``--one-after-the-other``). In a
one-off micro-benchmark of the same 16 steps, 16 of 16 policy steps beside the critic took
1.29 s and 13 of 16 (the other 3 on both cores) 1.18 s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import nn

from rlhfkit.config import TrainConfig
from rlhfkit.experience.rollout import Rollout
from rlhfkit.runtime.parallel import run_parallel
from rlhfkit.trainers.optim import build_optimizer, build_scheduler, clip_grad_norm

# The share of the policy's minibatches that run beside the critic's before the rest run on
# all cores: its step costs ~1.25x the critic's on the benchmark (13 of 16 measured best).
POLICY_SHARE_BESIDE_CRITIC = 0.8

LossFn = Callable[[Rollout], tuple[torch.Tensor, dict[str, float]]]


def accumulate(totals: dict[str, float], values: dict[str, float], weight: float = 1.0) -> None:
    """Add ``weight * values`` to ``totals`` key by key."""
    for key, value in values.items():
        totals[key] = totals.get(key, 0.0) + weight * value


@dataclasses.dataclass
class Learner:
    """One trained model of the update, with its loss, AdamW and schedule."""

    name: str
    module: nn.Module
    loss: LossFn  # one micro-batch -> (loss, statistics)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    autocast: Callable[[], AbstractContextManager]
    accumulation: int  # micro-batches per optimiser step
    max_grad_norm: float | None
    params: list[nn.Parameter] = dataclasses.field(init=False)  # the trained ones, for clipping

    def __post_init__(self) -> None:
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    @classmethod
    def build(
        cls,
        name: str,
        module: nn.Module,
        loss: LossFn,
        config: TrainConfig,
        total_steps: int,
        autocast: Callable[[], AbstractContextManager],
    ) -> Learner:
        optimizer = build_optimizer(module, config)
        scheduler = build_scheduler(optimizer, config, total_steps)
        accumulation = config.gradient_accumulation_steps
        return cls(
            name, module, loss, optimizer, scheduler, autocast, accumulation, config.max_grad_norm
        )

    def learn(self, minibatches: list[list[Rollout]]) -> dict[str, float]:
        """One optimiser step per minibatch (a list of micro-batches); the sums of the
        statistics over the minibatches."""
        sums: dict[str, float] = {}
        for micros in minibatches:
            for mb in micros:
                with self.autocast():
                    loss, stats = self.loss(mb)
                (loss / self.accumulation).backward()
                accumulate(sums, stats, 1 / self.accumulation)
            accumulate(sums, self.step())
        return sums

    def step(self) -> dict[str, float]:
        """Clip this model's gradients (per model: the value loss's larger gradients would
        otherwise shrink the policy's step), step and clear; the norm before clipping and
        the learning rate."""
        norm = clip_grad_norm(self.params, self.max_grad_norm)
        stats = {f"grad_norm/{self.name}": norm.item(), "lr": self.scheduler.get_last_lr()[0]}
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats


def shuffled_minibatches(
    rollout: Rollout, epochs: int, minibatch_size: int, batch_size: int, generator
) -> list[list[Rollout]]:
    """``epochs`` shuffled passes over ``rollout`` in minibatches of ``minibatch_size`` rows,
    each a list of micro-batches of ``batch_size`` rows (padding columns trimmed)."""
    minibatches = []
    for _ in range(epochs):
        order = torch.randperm(len(rollout), generator=generator)
        for minibatch in order.to(rollout.query.device).split(minibatch_size):
            minibatches.append([rollout.select(micro) for micro in minibatch.split(batch_size)])
    return minibatches


def update_learners(
    learners: list[Learner], minibatches: list[list[Rollout]], parallel: bool
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
