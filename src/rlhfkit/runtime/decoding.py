"""The KV cache behind ``generation.generate``: a prefill pass, then one pass per new token.

Two kinds, with the same numbers up to float rounding:

- ``DynamicDecoder``: transformers' growing cache, fed the 2-D padding mask; any causal LM.
- ``StaticDecoder``: a cache allocated once for prompt + every new token (transformers'
  ``StaticCache``) and a 4-D mask we keep in a fixed buffer. Every decode step then has the
  same shapes and the same tensor addresses, so on a GPU one step is captured in a CUDA graph
  and replayed: one launch per token instead of a few hundred kernel launches, which is where
  a small model's decoding time goes (the "static cache + CUDA graphs" recipe of transformers'
  ``cache_implementation="static"`` with ``torch.compile(mode="reduce-overhead")``, done
  with ``torch.cuda.CUDAGraph`` directly so nothing is compiled and no shape recompiles;
  timings: docs/gpu.md, "Generation against a bare decode loop").

The static kind needs a transformers model that supports ``StaticCache`` (those marked
``_can_compile_fullgraph``); ``decoder_for`` falls back to the dynamic one otherwise.

transformers 5.24 renamed the cache argument of ``forward`` and the output field from
``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40); ``cache_name`` says
which one a model takes, so both old and new releases, and remote code, decode.
"""

from __future__ import annotations

import inspect
import logging

import torch
from torch import nn
from transformers import StaticCache

from rlhfkit.ops.masks import additive_mask
from rlhfkit.runtime.packing import own_kernel, transformer_models

logger = logging.getLogger(__name__)

CACHE_IMPLEMENTATIONS = ("auto", "dynamic", "static")


def static_cache_supported(model: nn.Module) -> bool:
    """Whether ``model`` can decode with a ``StaticCache`` and a 4-D mask."""
    inner = transformer_models(model)
    if not inner or not getattr(inner[0], "_can_compile_fullgraph", False):
        return False
    return own_kernel(inner[0].config) in ("eager", "sdpa")


def cache_name(model: nn.Module) -> str:
    """The name ``model``'s forward takes its KV cache by, and returns it under: ``cache``
    where its (transformers) forward has that parameter, else ``past_key_values``."""
    inner = transformer_models(model)
    forward = type(inner[0]).forward if inner else model.forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


class DynamicDecoder:
    """Transformers' own growing cache and 2-D padding mask."""

    def __init__(self, model: nn.Module, query_mask: torch.Tensor, max_new_tokens: int) -> None:
        batch, self.prompt_len = query_mask.shape
        self.model = model
        self.mask = torch.ones(  # (B, Tq + max_new_tokens); step t sees its first Tq + t columns
            batch, self.prompt_len + max_new_tokens, dtype=torch.long, device=query_mask.device
        )
        self.mask[:, : self.prompt_len] = query_mask
        self.cache, self.cache_name = None, cache_name(model)

    def prefill(self, query: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run the prompts; the next-token logits (B, V)."""
        out = self.model(
            input_ids=query,
            attention_mask=self.mask[:, : self.prompt_len],
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = getattr(out, self.cache_name)
        return out.logits[:, -1]

    def step(self, token: torch.Tensor, position: torch.Tensor, step: int) -> torch.Tensor:
        """Feed new-token ``step``'s ``token`` (B,) at ``position`` (B, 1); logits (B, V)."""
        out = self.model(
            input_ids=token[:, None],
            attention_mask=self.mask[:, : self.prompt_len + step + 1],
            position_ids=position,
            use_cache=True,
            **{self.cache_name: self.cache},
        )
        self.cache = getattr(out, self.cache_name)
        return out.logits[:, -1]


class StaticDecoder:
    """A ``StaticCache`` with the mask, token and position in fixed buffers; on a GPU each
    decode step is a replay of one captured CUDA graph (``graph=True``)."""

    def __init__(
        self, model: nn.Module, query_mask: torch.Tensor, max_new_tokens: int, graph: bool
    ) -> None:
        batch, self.prompt_len = query_mask.shape
        length = self.prompt_len + max_new_tokens
        self.model, self.graph, self.use_graph = model, None, graph
        config = transformer_models(model)[0].config
        self.cache = StaticCache(config=config, max_cache_len=length)
        self.cache_name = cache_name(model)
        for layer in self.cache.layers:
            _keep_value_dtype(layer)
        self.eager = own_kernel(config) == "eager"
        device = query_mask.device
        # Key column j is visible to a decode step once it is a real prompt token or a token
        # generated so far: the prompt's padding stays hidden, later columns are opened per step.
        self.visible = torch.zeros(batch, 1, 1, length, dtype=torch.bool, device=device)
        self.visible[:, 0, 0, : self.prompt_len] = query_mask.bool()
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1)

    def _mask(self, visible: torch.Tensor) -> torch.Tensor:
        """The 4-D mask as the attention kernel takes it: bool for SDPA, additive for eager."""
        return additive_mask(visible) if self.eager else visible

    def prefill(self, query: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run the prompts causally over the real prompt tokens; logits (B, V). A padding
        query also sees itself, so that no attention row is empty (an empty row is NaN, and a
        NaN value in the cache would spread through every later product)."""
        width = self.prompt_len
        causal = torch.ones(width, width, dtype=torch.bool, device=query.device).tril()
        visible = self.visible[:, :, :, :width] & causal  # (B, 1, Tq, Tq)
        visible = visible | torch.eye(width, dtype=torch.bool, device=query.device)
        columns = self.visible.shape[-1] - width
        visible = torch.nn.functional.pad(visible, (0, columns))  # (B, 1, Tq, Tq + new)
        out = self.model(
            input_ids=query,
            attention_mask=self._mask(visible),
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_name: self.cache},
        )
        return out.logits[:, -1]

    def _forward(self) -> torch.Tensor:
        out = self.model(
            input_ids=self.token,
            attention_mask=self._mask(self.visible),
            position_ids=self.position,
            use_cache=True,
            **{self.cache_name: self.cache},
        )
        return out.logits[:, -1]

    def step(self, token: torch.Tensor, position: torch.Tensor, step: int) -> torch.Tensor:
        """Feed new-token ``step``'s ``token`` (B,) at ``position`` (B, 1); logits (B, V),
        valid until the next call."""
        self.token.copy_(token[:, None])
        self.position.copy_(position)
        self.visible[:, 0, 0, self.prompt_len + step] = True
        if not self.use_graph:
            return self._forward()
        if self.graph is None:
            try:
                self._capture()
            except RuntimeError as error:  # an operation that cannot be captured: stay eager
                logger.warning("decoding without a CUDA graph: capture failed (%s)", error)
                self.use_graph = False
                return self._forward()
        self.graph.replay()
        return self.logits

    def _capture(self) -> None:
        """Capture one decode step. It is run once on a side stream first (as CUDA graphs
        need), which writes the cache at this step's column and advances each layer's
        position; both are put back, so the replay that follows does this step for real."""
        layers = self.cache.layers
        before = [layer.cumulative_length.clone() for layer in layers]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side), _capturable_autocast():
                self._forward()
        finally:  # also when it fails: the eager step that follows writes the same column
            torch.cuda.current_stream().wait_stream(side)
            for layer, length in zip(layers, before, strict=True):
                layer.cumulative_length.copy_(length)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), _capturable_autocast():
            self.logits = self._forward()


def _keep_value_dtype(layer) -> None:
    """Let a static cache layer hold values in their own dtype. transformers allocates both
    in the keys' dtype, but under bf16 autocast Llama-style rotary embeddings give float32
    keys and bfloat16 values (the growing cache just stores what it gets)."""
    allocate = layer.lazy_initialization

    def lazy_initialization(key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        allocate(key_states, value_states)
        layer.values = layer.values.to(value_states.dtype)

    layer.lazy_initialization = lazy_initialization


def _capturable_autocast() -> torch.autocast:
    """The caller's CUDA autocast, without its cache of cast weights: a cast made while
    capturing must be re-done by every replay, not freed when the autocast context ends."""
    enabled = torch.is_autocast_enabled("cuda")
    dtype = torch.get_autocast_dtype("cuda")
    return torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False)


def decoder_for(
    model: nn.Module, query_mask: torch.Tensor, max_new_tokens: int, cache_implementation: str
) -> DynamicDecoder | StaticDecoder:
    """The decoder ``cache_implementation`` asks for: "static" (a CUDA graph on a GPU),
    "dynamic", or "auto" (static on a GPU where the model supports it, else dynamic)."""
    on_gpu = query_mask.is_cuda
    static = cache_implementation == "static" or (
        cache_implementation == "auto" and on_gpu and static_cache_supported(model)
    )
    if static:
        return StaticDecoder(model, query_mask, max_new_tokens, graph=on_gpu)
    return DynamicDecoder(model, query_mask, max_new_tokens)
