"""`clip_grad_norm`: torch's clipping, bit for bit, whether or not it clips."""

import pytest
import torch

from rlhfkit.trainers.optim import clip_grad_norm


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
    assert torch.equal(norm, expected)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)


def test_clip_grad_norm_scales_to_max_norm():
    params = params_with_grads(1.0)
    before = clip_grad_norm(params, 0.5)
    after = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params[:-1]]))
    assert before > 0.5
    assert after == pytest.approx(0.5, rel=1e-5)
