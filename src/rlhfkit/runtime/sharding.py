"""Sharded data parallelism with torch's FSDP2 (``fully_shard``): each of N processes holds 1/N
of a trained model's weights, gradients and optimiser state, and gathers a block's weights just
before the block runs (ZeRO stage 3).

Units: every transformer block (the classes a transformers model lists in
``_no_split_modules``: ``GPT2Block``, ``LlamaDecoderLayer``, ...), then the whole model for the
rest (embeddings, final norm, heads). rlhfkit shards the models itself rather than through
accelerate's FSDP plugin, which accelerate 1.15 ignores on a CPU (it falls back to DDP there),
so that one code path runs, and is tested, on CPU processes and on GPUs alike.

Saving and resuming reuse the code every stage has for a plain model: ``whole()`` gathers the
full weights into a plain copy of the model (on the main process, or on every process), made
from a skeleton taken before sharding whose parameters live on the meta device (no memory), and
``load_whole()`` puts a plain copy's weights back into the shards. The optimiser state stays
sharded on disk: each process writes and reads its own part (``local_optimizer_state``), so a
resume needs the same number of processes.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from rlhfkit.runtime.distributed import rank


def block_classes(model: nn.Module) -> set[str]:
    """The class names of the transformer blocks in ``model``, as transformers lists them."""
    names: set[str] = set()
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            names.update(module._no_split_modules or ())
    return names


def shard_units(model: nn.Module) -> list[nn.Module]:
    """What ``fully_shard`` wraps, innermost first: every transformer block, then each
    outermost transformers model in ``model`` (``model`` itself, or a value head's LM, a peft
    model's base, a reward model's backbone) and each other module that holds parameters
    outside them (a value or score head). The last ones are separate roots rather than parts
    of one wrapper unit, because rlhfkit also calls a wrapped LM on its own (to sample), and
    FSDP wants a unit called first to stay the root. A transformers model nested in another
    is no unit of its own: its parameters can be tied to the outer one's (GPT-2's LM head to
    its embedding)."""
    blocks = block_classes(model)
    units = [m for m in model.modules() if type(m).__name__ in blocks]
    roots: list[nn.Module] = []
    for module in model.modules():
        if any(module in set(root.modules()) for root in roots):
            continue
        holds = any(True for _ in module.parameters(recurse=False))
        if isinstance(module, PreTrainedModel) or holds:
            roots.append(module)
    return [*units, *roots]


def shard(model: nn.Module) -> nn.Module:
    """``model`` sharded in place over the processes (``shard_units``): a trained model, or a
    frozen one (a reference, a reward model) that then also takes 1/N of the memory."""
    # FSDP warns at each unit whose output is a view (a backbone's hidden states, a head's
    # squeezed scores), in case the caller modifies it in place; rlhfkit's passes never do.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    for unit in shard_units(model):
        fully_shard(unit)
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` runs sharded (``shard``): then every process must run each of its
    forward passes, since each gathers weights from all the others."""
    return any(isinstance(module, FSDPModule) for module in model.modules())


def meta_skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters are on the meta device: its structure (wrappers,
    adapters, tied weights) without the memory of its weights. Buffers are copied."""
    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = nn.Parameter(param.detach().to("meta"), param.requires_grad)
    return copy.deepcopy(model, memo)


class ShardedModel:
    """A trained model sharded over the processes (``fully_shard``), and the skeleton to
    make it whole again. ``module`` is the model itself, sharded in place."""

    def __init__(self, model: nn.Module) -> None:
        self.skeleton = meta_skeleton(model)
        self.module = shard(model)

    def _units(self) -> list[FSDPModule]:
        return [m for m in self.module.modules() if isinstance(m, FSDPModule)]

    def whole(self, everywhere: bool = False) -> nn.Module | None:
        """A plain copy of the model with its full weights, on the CPU: on the main process
        only (None elsewhere), or with ``everywhere`` on every process. Every process must
        call it (the shards are gathered)."""
        for unit in self._units():
            unit.reshard()  # a forward without backward leaves the root gathered
        options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
        state = get_model_state_dict(self.module, options=options)
        if not everywhere and rank() != 0:
            return None
        plain = copy.deepcopy(self.skeleton)
        state = {name: tensor.detach().cpu() for name, tensor in state.items()}
        plain.load_state_dict(state, strict=False, assign=True)
        for module in plain.modules():
            if isinstance(module, PreTrainedModel):
                module.tie_weights()
        missing = [name for name, p in plain.named_parameters() if p.is_meta]
        if missing:
            raise RuntimeError(f"gathering the sharded model left {missing[:3]} without weights")
        return plain

    def load_whole(self, plain: nn.Module) -> None:
        """Put the weights of ``plain`` (a whole copy, on every process) into the shards."""
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.module, plain.state_dict(), options=options)


def local_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This process's part of ``optimizer.state_dict()``: its shard of each state tensor."""
    state = optimizer.state_dict()
    shards = {
        index: {key: _local(value) for key, value in values.items()}
        for index, values in state["state"].items()
    }
    return {**state, "state": shards}


def load_local_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping) -> None:
    """Load what ``local_optimizer_state`` saved on this process back into ``optimizer``, each
    shard made a sharded tensor again like its parameter."""
    optimizer.load_state_dict(dict(state))
    params = itertools.chain.from_iterable(group["params"] for group in optimizer.param_groups)
    for param in params:
        if isinstance(param, DTensor) and param in optimizer.state:
            values = optimizer.state[param]
            for key, value in values.items():
                if not isinstance(value, DTensor) and value.shape == param.to_local().shape:
                    values[key] = DTensor.from_local(
                        value, param.device_mesh, param.placements, run_check=False,
                        shape=param.shape, stride=param.stride(),
                    )  # fmt: skip


def _local(value: Any) -> Any:
    return value.to_local() if isinstance(value, DTensor) else value
