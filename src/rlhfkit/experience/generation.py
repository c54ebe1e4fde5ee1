"""Batched sampling from a causal LM with a KV cache, stopping at EOS.

The loop is the standard incremental decoding of GPT-2 (Radford et al. 2019) as implemented by
Hugging Face ``generate``: one forward over the left-padded prompts fills the cache, then one
forward per new token. We write the loop ourselves instead of calling ``generate`` because:

- sampling is seeded by a ``torch.Generator`` we own, so a rollout is reproducible without
  touching the global RNG (``generate`` only draws from the global one);
- position ids come from the attention mask (``ops.masks.position_ids_from_mask``), so a
  left-padded prompt gets exactly the continuation it would get unpadded;
- the loop stops as soon as every row has emitted EOS and returns ``response_mask`` in the
  library's one convention (real tokens up to and including the first EOS);
- on a GPU the decode step runs from a static cache as one CUDA graph (``decoding.py``).

Filtering follows the usual order (temperature, then top-k, then top-p / nucleus sampling of
Holtzman et al. 2020), as in ``transformers``' logits warpers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhfkit.ops.masks import position_ids_from_mask, truncate_after_eos
from rlhfkit.runtime.decoding import CACHE_IMPLEMENTATIONS, decoder_for
from rlhfkit.runtime.distributed import all_over_ranks
from rlhfkit.runtime.machine import frozen_weights_cast_once
from rlhfkit.runtime.sharding import is_sharded


@dataclass
class SamplingConfig:
    """How to sample responses (the sampling part of Hugging Face's ``GenerationConfig``).

    Attributes:
        max_new_tokens: the most response tokens per prompt (the response width ``Tr``).
        temperature: logits are divided by it before sampling; must be > 0. PPO computes its
            log-probs at the same temperature (see ``rollout.py``).
        top_k: keep only the ``top_k`` most likely tokens; 0 keeps all.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p``; 1.0 keeps all.
        greedy: take the arg-max token (temperature, top-k and top-p are then ignored).
        cache_implementation: the KV cache (``decoding.py``): "static" (captured in a CUDA
            graph on a GPU), "dynamic", or "auto" (static on a GPU where the model allows it).
    """

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    cache_implementation: str = "auto"

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature}: must be > 0 (use greedy=True)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: must be >= 0 (0 = no top-k filtering)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1]")
        if self.cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(
                f"cache_implementation={self.cache_implementation!r}: must be one of "
                + ", ".join(map(repr, CACHE_IMPLEMENTATIONS))
            )


@dataclass
class GenerationOutput:
    """Sampled responses, named and shaped as everywhere in the library (``Rollout``)."""

    response: torch.Tensor  # (B, Tr) long, pad after the first EOS
    response_mask: torch.Tensor  # (B, Tr) long, 1 up to and including the first EOS
    eos_emitted: torch.Tensor  # (B,) bool, False where the response ran out of tokens


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set the logits of tokens outside the top-k / nucleus (top-p) set to -inf.

    ``logits`` (B, V) are already divided by the temperature. The most likely token is always
    kept, so every row keeps at least one finite logit.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p (so the token that
        # crosses the threshold stays, and the first token always stays).
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next_token(
    logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Pick one token per row from next-token ``logits`` (B, V) -> (B,) long.

    Sampling inverts the cumulative distribution with one uniform draw per row, instead of
    ``torch.multinomial``'s one exponential draw per vocabulary entry (B x V random numbers,
    a visible share of a CPU rollout). The CDF is float64 so that a draw can only land on a
    token of zero probability (filtered, or the suppressed pad) with probability ~1e-16.
    """
    if config.greedy:
        return logits.argmax(-1)
    logits = filter_logits(logits.float() / config.temperature, config.top_k, config.top_p)
    cdf = logits.softmax(-1).double().cumsum(-1)  # (B, V)
    draw = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device, dtype=cdf.dtype)
    # right=True: the first token whose CDF exceeds the draw, skipping zero-width tokens.
    token = torch.searchsorted(cdf, draw * cdf[:, -1:], right=True)  # (B, 1)
    return token.squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    config: SamplingConfig,
    *,
    eos_token_id: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """Sample one response per left-padded prompt with a KV cache.

    Args:
        model: a Hugging Face causal LM (anything that takes ``input_ids``, ``attention_mask``,
            ``position_ids``, ``cache`` or ``past_key_values`` (``decoding.cache_name``),
            ``use_cache`` and ``logits_to_keep``).
        query: (B, Tq) prompt ids, left-padded.
        query_mask: (B, Tq) 1 for real prompt tokens.
        config: sampling settings.
        eos_token_id, pad_token_id: distinct ids; rows that have emitted EOS emit pad, and pad
            is never sampled.
        generator: the random source for sampling (on the model's device); ``None`` uses the
            global RNG.

    Returns:
        ``GenerationOutput`` with ``response`` (B, Tr) and ``response_mask`` (B, Tr), where
        ``Tr <= config.max_new_tokens`` (shorter when every row stopped early).
    """
    if eos_token_id == pad_token_id:
        raise ValueError(f"eos_token_id and pad_token_id are both {eos_token_id}: must differ")
    with frozen_weights_cast_once(model):
        return _sample(model, query, query_mask, config, eos_token_id, pad_token_id, generator)


def _sample(model, query, query_mask, config, eos_token_id, pad_token_id, generator):
    """``generate``'s loop, its arguments checked."""
    decoder = decoder_for(model, query_mask, config.max_new_tokens, config.cache_implementation)
    positions = position_ids_from_mask(query_mask)  # (B, Tq)
    logits = decoder.prefill(query, positions)  # (B, V)
    next_position = positions[:, -1:] + 1  # (B, 1)
    finished = torch.zeros(len(query), dtype=torch.bool, device=query.device)
    stopped = all_over_ranks if is_sharded(model) else bool
    pad_index = torch.tensor([pad_token_id], device=query.device)
    tokens = []
    for step in range(config.max_new_tokens):
        # The pad token is never a valid output: sampling it would punch a hole in the mask.
        logits = logits.index_fill(-1, pad_index, float("-inf"))
        token = sample_next_token(logits, config, generator)  # (B,)
        token = token.masked_fill(finished, pad_token_id)
        tokens.append(token)
        finished |= token == eos_token_id
        # The last step needs no forward; neither does a batch in which every row has stopped,
        # on every process when the model is sharded (each forward gathers from all of them).
        if step == config.max_new_tokens - 1 or stopped(finished.all()):
            break
        logits = decoder.step(token, next_position, step)
        next_position = next_position + 1
    response, response_mask = truncate_after_eos(
        torch.stack(tokens, dim=1), eos_token_id, pad_token_id
    )  # (B, Tr) each
    return GenerationOutput(response, response_mask.long(), eos_emitted=finished)
