"""The table GELU: torch's tanh GELU for every 16-bit input, and its gradient."""

import math

import pytest
import torch
from torch.nn import functional

from rlhfkit.runtime.activations import TABLE_DTYPES, gelu_tanh


def _every_value(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(2**16, dtype=torch.int32).to(torch.uint16).view(dtype)


def _exact(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tanh GELU and its derivative in float64, from the formula."""
    x = x.double()
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (x + 0.044715 * x**3))
    slope = 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2)
    return 0.5 * x * (1 + t), slope


@pytest.mark.parametrize("dtype", TABLE_DTYPES)
def test_table_gelu_is_torchs_gelu_at_every_16_bit_value(dtype):
    # Shuffled and shaped as an activation: nothing depends on where a value sits.
    x = _every_value(dtype)[torch.randperm(2**16, generator=torch.Generator().manual_seed(0))]
    x = x.view(64, 1024)
    got = gelu_tanh(x)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(
        got, functional.gelu(x, approximate="tanh"), rtol=0, atol=0, equal_nan=True
    )
    # And both are the function rounded to the dtype, to one unit, but where torch's fp32
    # 1 + tanh cancels (x < -4, GELU below 1e-5): there the error is absolute, under 1e-6.
    finite = x.isfinite() & got.isfinite()
    exact, _ = _exact(x[finite])
    assert torch.allclose(got[finite].double(), exact, rtol=torch.finfo(dtype).eps, atol=1e-6)


@pytest.mark.parametrize("dtype", TABLE_DTYPES)
def test_table_gelu_gradient_matches_torch_and_the_formula(dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(37, 129, generator=gen) * 3).to(dtype).requires_grad_()  # odd shape
    upstream = torch.randn(37, 129, generator=gen).to(dtype)
    (grad,) = torch.autograd.grad(gelu_tanh(x), x, upstream)
    (torch_grad,) = torch.autograd.grad(functional.gelu(x, approximate="tanh"), x, upstream)
    assert grad.dtype == dtype
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(grad, torch_grad, rtol=ulp, atol=ulp)
    _, slope = _exact(x.detach())
    torch.testing.assert_close(grad.double(), slope * upstream.double(), rtol=2 * ulp, atol=1e-4)


def test_table_gelu_on_non_contiguous_input_and_inside_autocast():
    x = torch.randn(8, 16, 32).to(torch.bfloat16).transpose(0, 2)  # strided view
    torch.testing.assert_close(gelu_tanh(x), functional.gelu(x, approximate="tanh"), rtol=0, atol=0)
    linear = torch.nn.Linear(32, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = linear(torch.randn(4, 32))
        out = gelu_tanh(hidden)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, functional.gelu(hidden, approximate="tanh"), rtol=0, atol=0)


def test_other_dtypes_use_torchs_kernel_with_its_gradients():
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(gelu_tanh(x), functional.gelu(x, approximate="tanh"))
    assert torch.autograd.gradcheck(gelu_tanh, (x,))
    assert torch.autograd.gradgradcheck(gelu_tanh, (x,))
