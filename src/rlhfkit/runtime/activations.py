"""GPT-2's GELU (the tanh approximation), read from a table for 16-bit floats on a CPU.

gelu(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (Hendrycks and Gimpel 2016,
section 2; GPT-2's ``gelu_new``; torch's ``gelu(approximate="tanh")``).

A bf16 or fp16 tensor holds at most 65,536 distinct values, so the GELU and its derivative
are two tables of 65,536 entries, computed once per dtype by torch's own kernels; a call reads
them at the input's bit patterns. torch's CPU kernel evaluates ``tanh`` per element, which is
what dominates its cost, so a lookup is several times faster even inside a PPO step, where the
tables share the cache with the matrix products (measurements: docs/ppo.md, speed on a CPU).
The forward is torch's own result for every input; the
backward multiplies the fp32 derivative by the incoming gradient in fp32 and rounds once, as
torch's kernel does.

Every other dtype or device goes to torch's kernel. The table version has no double backward.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional
from transformers.activations import GELUTanh, NewGELUActivation

TABLE_DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def _tables(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU (in ``dtype``) and its derivative (fp32) at every bit pattern of ``dtype``, indexed
    by that pattern read as an unsigned 16-bit integer."""
    values = torch.arange(2**16, dtype=torch.int32).to(torch.uint16).view(dtype)  # (65536,)
    gelu = functional.gelu(values, approximate="tanh")
    slope = torch.ops.aten.gelu_backward(
        torch.ones(2**16), values.float(), approximate="tanh"
    )  # (65536,) fp32
    return gelu, slope


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The bit pattern of each element of a 16-bit ``x`` as a flat int32 table index."""
    return x.view(torch.uint16).to(torch.int32).reshape(-1)


class _TableGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        gelu, _ = _tables(x.dtype)
        ctx.save_for_backward(x)
        return torch.index_select(gelu, 0, _bits(x)).view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        _, slope = _tables(x.dtype)
        slopes = torch.index_select(slope, 0, _bits(x)).view(x.shape)  # fp32
        return slopes.mul_(grad).to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.gelu(x, approximate="tanh")``; from tables for bf16 and fp16 on
    a CPU (see the module docstring)."""
    if x.device.type == "cpu" and x.dtype in TABLE_DTYPES:
        return _TableGELU.apply(x)
    return functional.gelu(x, approximate="tanh")


class TanhGELU(nn.Module):
    """GPT-2's tanh GELU as one call of ``gelu_tanh`` (tables for 16-bit floats on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh(x)


def fuse_gelu(model: nn.Module) -> nn.Module:
    """Swap the tanh GELU of GPT-2-style models (transformers' ``NewGELUActivation`` and
    ``GELUTanh``) for ``TanhGELU``, in place.

    ``NewGELUActivation`` runs ~8 elementwise kernels forward and more backward; torch's
    ``gelu(approximate="tanh")`` is the same function to float rounding in one kernel, and
    under bf16 autocast ``gelu_tanh`` reads it from a table (timings: docs/ppo.md). Every model rlhfkit loads gets it (training, evaluation, sampling, chat),
    and every trainer gives it to the models it is handed. The weights and the saved model
    are untouched: a checkpoint loads into stock transformers as before.
    """
    for module in model.modules():
        for name, child in module.named_children():
            if type(child) in (NewGELUActivation, GELUTanh):
                setattr(module, name, TanhGELU())
    return model
