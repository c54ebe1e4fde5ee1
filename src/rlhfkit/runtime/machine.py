"""The machine a run uses, chosen once at start-up: device, precision, attention kernel and the
speed-ups that belong to a kind of device, so that no algorithm's signature carries them.

``Runtime.from_config(config)`` reads four fields every stage has (``cpu``,
``mixed_precision``, ``attn_implementation`` through ``config.attention``, and PPO's
``parallel_critic``) and decides:

- the device: the GPU when there is one and ``cpu`` is off, else the CPU;
- the precision: bf16 autocast or none (weights, optimiser state and loss math stay fp32);
- the attention kernel of every model the run touches (``prepare``), with the fused GELU and,
  where asked, padding-free passes (``packing.py``);
- on a CPU, memory kept for the next step (``allocator.py``) and independent model work side
  by side on half the cores each (``parallel.py``); on a GPU, neither.

Like nanoGPT's flagged lines at the edge of its loop, these are the only places where the
device shows; the trainers, the experience maker and the losses ask this object.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from rlhfkit.runtime.activations import fuse_gelu
from rlhfkit.runtime.allocator import retain_freed_memory
from rlhfkit.runtime.packing import enable_packing


def prepare_model(
    model: nn.Module, attention: str | None = None, packed: bool = False
) -> nn.Module:
    """What a run does to each model it runs: the fused GELU (``fuse_gelu``) and, when given,
    the attention kernel (``"eager"`` or ``"sdpa"``) of every transformer in it (a policy, a
    reference, a scalar-head model's backbone, a peft-wrapped model); with ``packed``, packed
    inputs where the model supports them (``packing.enable_packing``)."""
    fuse_gelu(model)
    if attention is not None:
        for module in model.modules():
            if isinstance(module, PreTrainedModel):
                module.set_attn_implementation(attention)
    if packed:
        enable_packing(model)
    return model


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Where and how the models of one run compute."""

    device: torch.device
    bf16: bool
    """bf16 autocast around every model pass (weights, optimiser and loss math stay fp32)."""
    attention: str | None
    """The attention kernel set on every model; None keeps each model's own."""
    side_by_side: bool
    """Independent model passes run at once, each on half the CPU's threads."""

    @classmethod
    def from_config(cls, config: Any) -> Runtime:
        """The runtime a stage's config asks for (see the module docstring)."""
        cuda = torch.cuda.is_available() and not config.cpu
        device = torch.device("cuda" if cuda else "cpu")
        side_by_side = getattr(config, "parallel_critic", None)
        return cls(
            device=device,
            bf16=config.mixed_precision == "bf16",
            attention=config.attention,
            side_by_side=device.type == "cpu" if side_by_side is None else side_by_side,
        )

    def start(self) -> None:
        """Process-wide settings, once: on a CPU, freed memory is kept for the next step (no
        page faults on each step's activations)."""
        retain_freed_memory(self.device)

    def autocast(self) -> torch.autocast:
        """The precision context of a model pass."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def prepare(self, model: nn.Module, packed: bool = False) -> nn.Module:
        """``model`` on this device with this attention kernel, the fused GELU and, with
        ``packed``, padding-free passes."""
        return prepare_model(model, self.attention, packed).to(self.device)
