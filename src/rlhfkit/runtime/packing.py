"""Padding-free passes: the real tokens of a padded (B, T) batch packed into one row.

A PPO minibatch of queries (left-padded) and responses (right-padded) is partly padding, a
sizeable share of its positions on ``benchmarks/bench_ppo.py``'s prompts (how much, and what
skipping it saves: docs/ppo.md, "Speed on a CPU"). Every layer
of a transformer but attention works position by position, so it can run on the N real
tokens alone, packed row after row into one sequence of N. Attention, the one layer that
mixes positions, lays the packed tokens out again as a (B, W) batch with each row starting at
column 0 (W: the longest row, rounded up) and attends causally there: a real token only ever sees the
real tokens before it in its own row, since a row's padding now comes after all of them.
Every real token gets the same position and attends to the same tokens as in the padded
batch, so its output is the same up to float rounding; no mask over padding is needed.

The same idea as TRL's ``padding_free`` and flash-attention's variable-length kernels, done
with the model's own eager or SDPA attention, so it runs on a CPU and needs no extra package.

How it reaches the model: ``enable_packing`` switches a model's attention implementation to
``rlhfkit_packed_eager`` or ``rlhfkit_packed_sdpa``, registered with transformers'
``AttentionInterface`` when the first model is packed (``register_kernels``). A call without ``packed_rows`` (generation, a padded batch) goes to
the model's own kernel unchanged; a call with it (``PackedRows.inputs``) is unpacked around
that kernel. Only model types whose attention is plain causal self-attention over
``position_ids`` are switched (``PACKABLE_MODEL_TYPES``); others stay padded. A model on SDPA
runs its eager kernel instead where gradients flow through short rows in bf16 on a CPU
(``training_kernel``: torch's CPU flash-attention backward is the slow part there).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rlhfkit.ops.masks import additive_mask

PREFIX = "rlhfkit_packed_"
WIDTH_STEP = 8  # the attention layout's width W is a multiple of this (see PackedRows)
KERNELS = ("eager", "sdpa")  # the attention implementations a packed one wraps
# Causal self-attention over position_ids, no sliding window, tested in tests/test_packing.py.
PACKABLE_MODEL_TYPES = frozenset({"gpt2", "llama", "qwen2"})
# Rows up to this wide take the model's eager kernel where gradients flow, in bf16/fp16 on a
# CPU (see `training_kernel`).
SHORT_ROWS = 192


@dataclasses.dataclass(frozen=True)
class PackedRows:
    """Where each real token of a padded (B, T) batch sits packed, and back.

    ``tokens`` (L,): the flat (B * T) index of each real token, row by row, then filler.
    ``index`` (B, T): the packed index of each real position (of a neighbour for padding).
    ``slots`` (B * W,): the packed token in each slot of the (B, W) layout attention uses,
    each row from column 0 (token 0 in padding slots: only padding queries see them); W is
    the longest row rounded up to a multiple of ``WIDTH_STEP``.
    ``filled`` (L,): the slot of each packed token in that layout.
    ``position_ids`` (1, L): each token's position in its row.
    ``last`` (B,): the packed index of each row's last real token (where a reward model
    reads its score).

    The packed row is L >= N tokens long: ``packed_length`` rounds N up, and the filler
    tokens at its end (the batch's first token at position 0, attending to slot 0) are read
    by nothing, so they take no part in any result or gradient. Both roundings are there
    because a matrix product of a shape it has not seen costs oneDNN a new kernel on a CPU,
    time the first time and memory kept for each. With every minibatch's own N, a PPO step
    would pay that for each of its ~50 products, and the benchmark lost time instead of gaining
    (timings: docs/ppo.md, "Speed on a CPU").
    """

    tokens: torch.Tensor
    index: torch.Tensor
    slots: torch.Tensor
    filled: torch.Tensor
    position_ids: torch.Tensor
    last: torch.Tensor
    width: int

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> PackedRows:
        """The packing of ``mask`` (B, T), 1 for real tokens (any padding on either side)."""
        real = mask.bool()  # (B, T)
        batch, _ = real.shape
        lengths = real.sum(1)  # (B,)
        if not bool(lengths.all()):
            raise ValueError("every row must have a real token to be packed")
        width = -(-int(lengths.max()) // WIDTH_STEP) * WIDTH_STEP
        flat = real.flatten()
        tokens = flat.nonzero().squeeze(1)  # (N,)
        filler = tokens.new_zeros(packed_length(len(tokens)) - len(tokens))  # (L - N,)
        index = (flat.cumsum(0) - 1).clamp(min=0).view(real.shape)  # (B, T)
        column = torch.arange(width, device=mask.device)
        in_row = column < lengths[:, None]  # (B, W)
        starts = lengths.cumsum(0) - lengths  # (B,) packed index of each row's first token
        slots = torch.where(in_row, starts[:, None] + column, 0).flatten()  # (B * W,)
        filled = torch.cat([in_row.flatten().nonzero().squeeze(1), filler])  # (L,)
        position_ids = torch.cat([column.expand(batch, width)[in_row], filler])[None]  # (1, L)
        last = lengths.cumsum(0) - 1  # (B,)
        tokens = torch.cat([tokens, filler])
        return cls(tokens, index, slots, filled, position_ids, last, width)

    @property
    def batch_size(self) -> int:
        return self.index.shape[0]

    def inputs(self, input_ids: torch.Tensor) -> dict:
        """Model keyword arguments for the padded ``input_ids`` (B, T), packed (1, L).

        ``attention_mask`` is a (1, 1, W, W) causal mask: transformers passes a 4-D mask
        through untouched, and the packed attention applies it in the (B, W) layout.
        """
        causal = torch.ones(self.width, self.width, dtype=torch.bool, device=self.tokens.device)
        return {
            "input_ids": input_ids.flatten()[self.tokens][None],  # (1, L)
            "attention_mask": causal.tril()[None, None],  # (1, 1, W, W)
            "position_ids": self.position_ids,
            "packed_rows": self,
        }

    def read(self, packed: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """The packed output (1, L, ...) at the padded ``columns`` (K,) of each row: (B, K, ...)."""
        where = self.index[:, columns]  # (B, K)
        return packed[0].index_select(0, where.flatten()).view(*where.shape, *packed.shape[2:])

    def keep(self, columns: torch.Tensor) -> torch.Tensor:
        """``logits_to_keep`` for the padded ``columns`` (K,) of each row: (B * K,) packed."""
        return self.index[:, columns].flatten()

    def unpack_heads(self, states: torch.Tensor) -> torch.Tensor:
        """Attention states (1, heads, L, d) -> (B, heads, W, d), each row from column 0."""
        flat = states[0].transpose(0, 1)  # (L, heads, d)
        laid = flat.index_select(0, self.slots).view(self.batch_size, self.width, *flat.shape[1:])
        return laid.transpose(1, 2)

    def pack_heads(self, output: torch.Tensor) -> torch.Tensor:
        """Attention output (B, W, heads, d) -> (1, L, heads, d)."""
        flat = output.reshape(-1, *output.shape[2:])  # (B * W, heads, d)
        return flat.index_select(0, self.filled)[None]


def packed_length(real_tokens: int) -> int:
    """The packed row's length for ``real_tokens``: rounded up to one of 16 steps per power of
    two (344 -> 352, 1300 -> 1344), so that at most ~6% are filler and a run meets few
    distinct shapes."""
    step = max(1, 2 ** (real_tokens.bit_length() - 1) // 16)
    return -(-real_tokens // step) * step


@functools.cache
def _kernel(module_type: type, kernel: str) -> Callable:
    """The attention function ``kernel`` names for a module class: transformers' SDPA, or the
    ``eager_attention_forward`` defined beside the class (every modern modelling file has one)."""
    if kernel == "sdpa":
        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    return sys.modules[module_type.__module__].eager_attention_forward


def training_kernel(kernel: str, query: torch.Tensor, width: int) -> str:
    """The kernel a packed call runs: the model's own ``kernel``, but its eager one in place of
    SDPA where gradients flow through rows of at most ``SHORT_ROWS`` in bf16 or fp16 on a CPU.

    torch's CPU flash attention, which SDPA runs there, is fast forward and slow backward at
    these widths: its backward alone takes longer than the eager kernel's forward and
    backward together (timings: docs/results/instructions.md, "A third fix"). The eager kernel keeps
    the (B, heads, W, W) probabilities for the backward, which is small at these widths. The
    no-grad passes and generation keep SDPA, as do float32 and wider rows, where flash
    attention is the faster."""
    if kernel != "sdpa" or not query.requires_grad or query.device.type != "cpu":
        return kernel
    autocast = torch.is_autocast_enabled("cpu")  # rotary embeddings leave the query float32
    dtype = torch.get_autocast_dtype("cpu") if autocast else query.dtype
    low_precision = dtype in (torch.bfloat16, torch.float16)
    return "eager" if low_precision and width <= SHORT_ROWS else kernel


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    packed_rows: PackedRows | None = None,
    **kwargs,
):
    """The registered attention: the model's own kernel, around the unpacking when the call
    carries ``packed_rows`` (query, key, value (1, heads, L, d))."""
    own = own_kernel(module.config)
    if packed_rows is None:
        return _kernel(type(module), own)(module, query, key, value, attention_mask, **kwargs)
    rows = packed_rows
    chosen = training_kernel(own, query, rows.width)
    kernel = _kernel(type(module), chosen)
    if chosen == "eager":  # eager kernels add a float mask
        attention_mask = additive_mask(attention_mask)
    query, key, value = (rows.unpack_heads(x) for x in (query, key, value))
    output, _ = kernel(module, query, key, value, attention_mask, **kwargs)  # (B, W, heads, d)
    return rows.pack_heads(output), None


@functools.cache
def register_kernels() -> None:
    """Register the packed kernels with transformers (its registry is process-wide), once, when
    the first model is packed: importing this module changes nothing."""
    for kernel in KERNELS:
        AttentionInterface.register(PREFIX + kernel, packed_attention)
        AttentionMaskInterface.register(PREFIX + kernel, ALL_MASK_ATTENTION_FUNCTIONS[kernel])


def transformer_models(model: nn.Module) -> list[PreTrainedModel]:
    """The transformers models inside ``model`` (itself, or under peft or scalar-head wrappers)."""
    return [m for m in model.modules() if isinstance(m, PreTrainedModel)]


def own_kernel(config) -> str:
    """The model's own attention implementation, also when a packed one wraps it."""
    return config._attn_implementation.removeprefix(PREFIX)


def _packable(model: PreTrainedModel) -> bool:
    config = model.config
    return (
        config.model_type in PACKABLE_MODEL_TYPES
        and own_kernel(config) in KERNELS
        and not getattr(config, "reorder_and_upcast_attn", False)  # GPT-2's own eager path
        and not getattr(config, "use_sliding_window", False)
    )


def enable_packing(model: nn.Module) -> bool:
    """Let ``model`` (a causal LM, a scalar-head model, a peft or ``ValueHeadLM`` wrapper)
    take packed inputs: True, or False (and nothing changed) if a transformer in it cannot."""
    inner = transformer_models(model)
    if not inner or not all(_packable(m) for m in inner):
        return False
    register_kernels()
    for m in inner:
        m.set_attn_implementation(PREFIX + own_kernel(m.config))
    return True


def packing_enabled(model: nn.Module) -> bool:
    """Whether every transformer in ``model`` runs a packed attention (``enable_packing``)."""
    inner = transformer_models(model)
    return bool(inner) and all(m.config._attn_implementation.startswith(PREFIX) for m in inner)
