"""The machine a run uses, chosen once at start-up: device, precision, attention kernel and the
speed-ups that belong to a kind of device, so that no algorithm's signature carries them.

``Runtime.from_config(config)`` reads the fields every stage has (``cpu``,
``mixed_precision``, ``attn_implementation`` through ``config.attention``,
``gradient_checkpointing``, ``fsdp``, and PPO's ``parallel_critic``) and decides:

- the device: the GPU when there is one and ``cpu`` is off, else the CPU;
- the precision: bf16 autocast or none (weights, optimiser state and loss math stay fp32);
- the attention kernel of every model the run touches (``prepare``), with the fused GELU and,
  where asked, padding-free passes (``packing.py``);
- on a CPU, a thread for each core other processes leave free (``threads.py``), memory kept
  for the next step (``allocator.py``) and independent model work side by side on half the
  cores each (``parallel.py``); on a GPU, none of them. A bound on the memory
  held (``allocator.bound_held_memory``) must come before any model is loaded: it is the
  CLI's ``--bounded-memory``;
- the processes of a data-parallel run (``distributed.py``): making the runtime joins the
  launcher's processes (accelerate's ``PartialState``), and each process takes its own GPU.
  Side by side is off with several processes: its threads would issue the two models'
  collectives in an order that differs between processes. The trained models are replicated
  (DDP, through accelerate) or, with ``fsdp``, sharded (``sharding.py``). A launcher's single
  process shards too, over a group of one (the whole FSDP path on one GPU, weights held as
  shards of their full size); a process started without a launcher has no group to shard
  over, and runs its models whole (with a warning);
- activation checkpointing of the trained models, where asked.

Like nanoGPT's flagged lines at the edge of its loop, these are the only places where the
device shows; the trainers, the experience maker and the losses ask this object.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import DistributedType, PartialState
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from rlhfkit.runtime.activations import fuse_gelu
from rlhfkit.runtime.allocator import retain_freed_memory
from rlhfkit.runtime.packing import enable_packing
from rlhfkit.runtime.sharding import is_sharded
from rlhfkit.runtime.threads import choose_threads

logger = logging.getLogger(__name__)

FSDP_ENV = "ACCELERATE_USE_FSDP"  # set by `accelerate launch` with an FSDP config


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
    rank: int = 0
    """This process's index in a data-parallel run."""
    world: int = 1
    """Processes in the run."""
    checkpointing: bool = False
    """Trained models recompute their blocks' activations in the backward pass."""
    sharded: bool = False
    """Trained models are sharded over the processes (FSDP2) instead of replicated (DDP)."""

    @classmethod
    def from_config(cls, config: Any) -> Runtime:
        """The runtime a stage's config asks for (see the module docstring)."""
        cuda = torch.cuda.is_available() and not config.cpu
        state = PartialState(cpu=not cuda)  # joins the launcher's processes, if any
        device = state.device if cuda else torch.device("cpu")
        side_by_side = getattr(config, "parallel_critic", None)
        if side_by_side is None:
            side_by_side = device.type == "cpu"
        fsdp = getattr(config, "fsdp", False) or os.environ.get(FSDP_ENV, "").lower() == "true"
        launched = state.distributed_type != DistributedType.NO
        if fsdp and not launched:
            logger.warning(
                "fsdp: one process has no others to shard its models over; they run whole. "
                "Launch several (torchrun --nproc_per_node N, docs/distributed.md)"
            )
        return cls(
            device=device,
            bf16=config.mixed_precision == "bf16",
            attention=config.attention,
            side_by_side=side_by_side and state.num_processes == 1,
            rank=state.process_index,
            world=state.num_processes,
            checkpointing=getattr(config, "gradient_checkpointing", False),
            sharded=fsdp and launched,
        )

    @classmethod
    def inference(cls, device: torch.device, bf16: bool = False) -> Runtime:
        """One process sampling and scoring, outside a run: each model's own attention, one
        pass at a time, bf16 autocast where asked."""
        return cls(device=device, bf16=bf16, attention=None, side_by_side=False)

    def start(self) -> None:
        """Process-wide settings, once: on a CPU, a thread for each core other processes
        leave free (``threads.py``), and freed memory kept for the next step (no page faults
        on each step's activations)."""
        choose_threads(self.device)
        retain_freed_memory(self.device)

    def autocast(self) -> torch.autocast:
        """The precision context of a model pass."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @contextmanager
    def frozen_weights_cast(self, models: Iterable[nn.Module | None]) -> Iterator[None]:
        """Under bf16 autocast, the frozen linear weights of ``models`` held in bf16 while the
        block runs (``frozen_weights_cast_once``): one cast for a whole iteration's sampling,
        passes and update instead of one per pass. The same numbers; not for sharded models
        (their weights are gathered per pass)."""
        if not self.bf16 or self.sharded:
            yield
            return
        # As one module: a weight two of them share (a LoRA policy and its base view) is cast once.
        together = nn.ModuleList([model for model in models if model is not None])
        with parameters_cast(together, torch.bfloat16, _frozen_linear_weight):
            yield

    def prepare(self, model: nn.Module, packed: bool = False, trained: bool = False) -> nn.Module:
        """``model`` on this device with this attention kernel, the fused GELU and, with
        ``packed``, padding-free passes; a ``trained`` model with activation checkpointing
        where asked."""
        if trained and self.checkpointing:
            checkpoint_activations(model)
        return prepare_model(model, self.attention, packed).to(self.device)


@contextmanager
def parameters_cast(
    model: nn.Module,
    dtype: torch.dtype,
    select: Callable[[nn.Module, str, nn.Parameter], bool] | None = None,
) -> Iterator[None]:
    """``model``'s float32 parameters (those ``select(module, name, parameter)`` picks, or
    all) held as ``dtype`` copies while the block runs, then put back: the same tensors. A
    parameter that several picked places share stays shared."""
    copies: dict[int, nn.Parameter] = {}
    swapped = []
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.dtype != torch.float32:
                continue
            if select is None or select(module, name, param):
                if id(param) not in copies:
                    copies[id(param)] = nn.Parameter(param.detach().to(dtype), requires_grad=False)
                module._parameters[name] = copies[id(param)]
                swapped.append((module, name, param))
    try:
        yield
    finally:
        for module, name, param in swapped:
            module._parameters[name] = param


def _frozen_linear_weight(module: nn.Module, name: str, param: nn.Parameter) -> bool:
    """A frozen weight or bias of a layer autocast runs in lower precision (``F.linear``, and
    GPT-2's ``Conv1D``, an ``addmm``)."""
    linear = isinstance(module, nn.Linear | Conv1D)
    return linear and name in ("weight", "bias") and not param.requires_grad


@contextmanager
def frozen_weights_cast_once(model: nn.Module) -> Iterator[None]:
    """Under autocast, the frozen weights and biases of ``model``'s linear layers held in the
    autocast dtype while the block runs, then put back as they were: the same numbers, one
    cast.

    Autocast keeps its cast of a weight that takes gradients for the whole autocast region,
    but casts a frozen one again at every call: in a decode loop, a LoRA model's base
    weights, a tied LM head or a reference model are copied into bf16 once per token
    (timings: docs/results/instructions.md, "Two fixes"). Weights that take gradients are left to autocast;
    a sharded model is left alone (its weights are gathered per pass)."""
    first = next(model.parameters(), None)
    device = first.device.type if first is not None else "cpu"
    if not torch.is_autocast_enabled(device) or is_sharded(model):
        yield
        return
    with parameters_cast(model, torch.get_autocast_dtype(device), _frozen_linear_weight):
        yield


def checkpoint_activations(model: nn.Module) -> nn.Module:
    """Turn on transformers' activation checkpointing (non-reentrant, so frozen inputs and
    LoRA need no special care) in every transformer inside ``model``."""
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and module.supports_gradient_checkpointing:
            module.activation_checkpointing_enable({"use_reentrant": False})
    return model
