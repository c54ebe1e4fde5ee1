"""AdamW and its learning-rate schedule, as every rlhfkit trainer builds them, the
``Learner`` that holds one trained model with its own pair, and the ``MinibatchLearner`` that
takes its optimiser steps over accumulated micro-batches.

AdamW (Loshchilov and Hutter 2019) with decoupled weight decay on weight matrices only, never
on biases and norm gains; linear warmup, then linear, cosine or constant decay (transformers'
``get_scheduler``), stepped once per optimiser step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import get_scheduler

from rlhfkit.config import TrainConfig
from rlhfkit.errors import require_finite


def build_optimizer(
    model: nn.Module, config: TrainConfig, learning_rate: float | None = None
) -> torch.optim.AdamW:
    """AdamW over trainable parameters; no weight decay on biases and norm gains (1-D tensors).
    Its peak learning rate is ``learning_rate``, else the config's.

    The fused kernel: one kernel per step instead of about ten per parameter tensor (the same
    update to float rounding, faster steps: docs/ppo.md)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=config.learning_rate if learning_rate is None else learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        fused=True,
    )


def clip_grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)``, the same numbers bit for bit, in
    less time on a CPU; the total 2-norm of the gradients before clipping, read to the host
    once (the optimiser step's one wait for the device). ``max_norm`` None or 0 measures
    without clipping.

    On a CPU torch loops over the tensors in Python unless told to use its foreach kernels,
    and it multiplies every gradient by the clipping coefficient even when that is 1. Here the
    kernels are the foreach ones on a CPU too, and the multiplication is skipped when the
    coefficient would be 1 (it is exact). Timings: docs/ppo.md.
    """
    grads = [p.grad for p in params if p.grad is not None]
    foreach = True if all(g.device.type == "cpu" for g in grads) else None
    norm = torch.nn.utils.get_total_norm(grads, foreach=foreach)
    total = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # of sharded ones
    # torch's coefficient, max_norm / (norm + 1e-6), clamped to 1
    if max_norm and max_norm / (total + 1e-6) < 1:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=foreach)
    return total


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int):
    """Linear warmup, then the configured decay, stepped once per optimiser step."""
    warmup = config.warmup_for(total_steps)
    name = config.lr_scheduler
    if name == "constant" and warmup > 0:
        name = "constant_with_warmup"
    return get_scheduler(
        name, optimizer, num_warmup_steps=warmup, num_training_steps=max(total_steps, 1)
    )


@dataclasses.dataclass
class Learner:
    """One trained model with its AdamW and learning-rate schedule: the model of a stage, or
    PPO's policy and its separate critic (one each, so that the value loss's gradients never
    shrink the policy's clipped step)."""

    name: str
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    max_grad_norm: float | None
    lr_metric: str = "lr"  # the name its learning rate is logged under
    params: list[nn.Parameter] = dataclasses.field(init=False)  # the trained ones, for clipping

    def __post_init__(self) -> None:
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    @classmethod
    def build(
        cls,
        name: str,
        module: nn.Module,
        config: TrainConfig,
        total_steps: int,
        optimizer: torch.optim.Optimizer | None = None,
        lr_metric: str = "lr",
    ) -> Learner:
        """AdamW (``build_optimizer``, unless given) and a schedule over ``total_steps``."""
        optimizer = optimizer or build_optimizer(module, config)
        scheduler = build_scheduler(optimizer, config, total_steps)
        return cls(name, module, optimizer, scheduler, config.max_grad_norm, lr_metric)

    def step(self) -> dict[str, float]:
        """Clip this model's gradients, step and clear; the norm before clipping and the
        learning rate of the step. A norm that is NaN or inf stops before the optimiser step
        (`NonFiniteError`): one such step would turn every weight into NaN. The norm is of the
        gradients reduced over the processes, so every process stops alike."""
        stats = {
            f"grad_norm/{self.name}": clip_grad_norm(self.params, self.max_grad_norm),
            self.lr_metric: self.scheduler.get_last_lr()[0],
        }
        require_finite(f"grad_norm/{self.name}", stats[f"grad_norm/{self.name}"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats


def accumulate(totals: dict[str, Any], values: dict[str, Any], weight: float = 1.0) -> None:
    """Add ``weight * values`` to ``totals`` key by key. A tensor value (a 0-dim statistic
    of a micro-batch, possibly carrying gradient) is added on its device, detached, in float32:
    nothing waits for the device until ``host_floats`` reads the sums."""
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().float()
        totals[key] = totals.get(key, 0.0) + weight * value


def host_floats(values: dict[str, Any]) -> dict[str, float]:
    """``values`` as Python floats, their tensors read from the device in one transfer."""
    tensors = [key for key, value in values.items() if isinstance(value, torch.Tensor)]
    read = torch.stack([values[key] for key in tensors]).tolist() if tensors else []
    floats = dict(zip(tensors, read, strict=True))
    return {key: floats[key] if key in floats else float(value) for key, value in values.items()}


@dataclasses.dataclass
class MinibatchLearner:
    """A ``Learner`` with its loss: one optimiser step per minibatch of micro-batches (of
    training data, or of experience). The one gradient-accumulation loop of every stage."""

    learner: Learner
    loss: Callable[[Any, float], tuple[torch.Tensor, dict[str, Any]]]  # (micro-batch, weight)
    accumulation: int  # micro-batches per optimiser step
    autocast: Callable[[], AbstractContextManager]
    no_sync: Callable[[], AbstractContextManager]  # holds the gradients' all-reduce back
    # Sees a minibatch's statistics before its optimiser step (the loop's loss check).
    before_step: Callable[[dict[str, Any]], None] | None = None

    @property
    def name(self) -> str:
        return self.learner.name

    def learn(self, minibatches: list[list[tuple[Any, float]]]) -> dict[str, float]:
        """One optimiser step per minibatch (a list of micro-batches, each with the weight of
        its loss); the sums over the minibatches of each step's statistics (their means over
        its micro-batches). On several processes the gradients are averaged over them once per
        minibatch, after its last micro-batch. The statistics stay on the device until the last
        step: each optimiser step waits for it once, for its gradient norm."""
        sums: dict[str, Any] = {}
        for micros in minibatches:
            step: dict[str, Any] = {}
            for index, (mb, weight) in enumerate(micros):
                last = index == len(micros) - 1
                with nullcontext() if last else self.no_sync():
                    with self.autocast():
                        loss, stats = self.loss(mb, weight)
                    (loss / self.accumulation).backward()
                accumulate(step, stats, 1 / self.accumulation)
            if self.before_step is not None:
                self.before_step(step)
            accumulate(step, self.learner.step())
            accumulate(sums, step)
        return host_floats(sums)
