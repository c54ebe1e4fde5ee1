"""`clip_grad_norm`: torch's clipping, bit for bit, whether or not it clips; the statistics of
the optimiser steps summed on the device and read once."""

import warnings
from contextlib import nullcontext

import pytest
import torch

from helpers import stage_config
from rlhfkit.config import SFTConfig
from rlhfkit.trainers.optim import (
    Learner,
    MinibatchLearner,
    accumulate,
    clip_grad_norm,
    host_floats,
)


def params_with_grads(scale: float) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (7, 5, 3), (1,)]
    params = [torch.nn.Parameter(torch.randn(*s, generator=generator)) for s in shapes]
    for p in params:
        p.grad = scale * torch.randn(*p.shape, generator=generator)
    params.append(torch.nn.Parameter(torch.zeros(3)))  # no gradient: left out, as by torch
    return params


@pytest.mark.parametrize(
    ("scale", "max_norm"),
    [(1.0, 1.0), (1e-3, 1.0), (1.0, 1e6), (1.0, None), (1.0, 0.0)],
    ids=["clips", "small-gradients", "large-max-norm", "no-max-norm", "max-norm-0"],
)
def test_clip_grad_norm_equals_torchs(scale, max_norm):
    ours, theirs = params_with_grads(scale), params_with_grads(scale)
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm or float("inf"))
    assert isinstance(norm, float) and norm == float(expected)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)


def test_clip_grad_norm_scales_to_max_norm():
    params = params_with_grads(1.0)
    before = clip_grad_norm(params, 0.5)
    after = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params[:-1]]))
    assert before > 0.5
    assert after == pytest.approx(0.5, rel=1e-5)


def test_statistics_are_summed_on_the_device_and_read_once():
    loss = torch.tensor(2.0, requires_grad=True) * 1.0  # carries gradient, like a micro-batch's
    totals = {}
    accumulate(totals, {"loss": loss, "clipfrac": torch.tensor(0.25), "lr": 1e-3}, 0.5)
    accumulate(totals, {"loss": torch.tensor(4.0), "clipfrac": torch.tensor(0.75), "lr": 1e-3}, 0.5)
    assert isinstance(totals["loss"], torch.Tensor) and totals["loss"].grad_fn is None
    read = host_floats(totals)
    assert read == {"loss": 3.0, "clipfrac": 0.5, "lr": pytest.approx(1e-3)}
    assert list(read) == ["loss", "clipfrac", "lr"] and all(type(v) is float for v in read.values())


@pytest.mark.cuda
def test_a_learner_waits_for_the_device_once_a_step_and_once_at_the_end():
    """Three optimiser steps of four micro-batches each: the gradient norm of each step and the
    statistics at the end are the only reads from the device (each is one host sync)."""
    model = torch.nn.Linear(16, 4).cuda()
    config = stage_config(SFTConfig, "unused", max_grad_norm=1.0)
    learner = Learner.build("model", model, config, total_steps=3)

    def loss(x, weight):
        out = model(x)  # (8, 4)
        return weight * out.pow(2).mean(), {"loss": out.pow(2).mean(), "max": out.abs().max()}

    steps = MinibatchLearner(learner, loss, 4, nullcontext, nullcontext)
    minibatches = [[(torch.randn(8, 16, device="cuda"), 1.0)] * 4 for _ in range(3)]
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            sums = steps.learn(minibatches)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 3 + 1, [str(w.message) for w in syncs]
    assert set(sums) == {"loss", "max", "grad_norm/model", "lr"}
