"""Token log-probabilities and entropy from language-model logits, memory-light.

``log_softmax(logits).gather(labels)`` materialises a second (B, T, V) tensor, which for a
GPT-2 vocabulary (V = 50257) is often the largest allocation of an RLHF step. Here the
log-softmax is evaluated over blocks of (B, T) positions, so only a (block, V) float32 tensor
exists at a time, in the forward pass and in the backward pass (a small
``torch.autograd.Function`` writes the gradient, ``onehot(label) - softmax``, straight into
one (B, T, V) buffer). TRL's ``selective_log_softmax`` and OpenRLHF's ``logprobs_from_logits``
do the same per row; we loop per block of positions.

Block size: on a GPU 1024 positions. On a CPU a block holds ``CPU_BLOCK_ELEMENTS`` logits
(2 MB in float32), whatever the vocabulary: a block that stays in cache is several times
faster than one that does not. Each block runs torch's fused ``log_softmax`` / ``softmax``
kernels with a float32 result, which read bf16 logits without a separate cast (measurements:
docs/ppo.md, speed on a CPU).

Alignment: a causal LM's logits at position t are the distribution of token t + 1, so the
log-probability of ``input_ids[:, t + 1]`` is read from ``logits[:, t]``. ``shifted_logprobs``
does that shift; ``token_logprobs`` takes labels that are already aligned with the logits.
Getting this wrong (or passing float ids) is exactly the ``Target 24844 is out of bounds``
crash of a hand-written perplexity reward, so every entry point validates ids with
``check_token_ids``.

Log-probs and entropies are returned in float32 (float64 if the logits are float64): importance
ratios ``exp(logp - old_logp)`` are too coarse in bf16.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlhfkit.ops.masks import masked_mean

DEFAULT_CHUNK_SIZE = 1024  # (B, T) positions per block off CPU: 1024 x 50257 x 4 bytes = 206 MB
CPU_BLOCK_ELEMENTS = 2**19  # logits per block on a CPU (2 MB in float32; see the docstring)


def check_token_ids(
    ids: torch.Tensor,
    vocab_size: int,
    name: str = "labels",
    *,
    logits: torch.Tensor | None = None,
) -> None:
    """Raise a ``ValueError`` unless ``ids`` are integer token ids in ``[0, vocab_size)``.

    If ``logits`` (B, T, V) is given, ``ids`` must also have shape (B, T). Costs one min/max.
    """
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        kind = "bools" if ids.dtype == torch.bool else "floats"
        raise ValueError(
            f"{name} must be integer token ids, got dtype {str(ids.dtype).removeprefix('torch.')}"
            f" (the ids were {kind}; convert them with .long())"
        )
    if logits is not None and tuple(ids.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"{name} has shape {tuple(ids.shape)} but logits has shape {tuple(logits.shape)}: "
            f"expected {name} of shape {tuple(logits.shape[:-1])} (logits at position t predict "
            "token t + 1: pass unshifted input_ids to shifted_logprobs instead)"
        )
    if ids.numel() == 0:
        return
    low, high = torch.aminmax(ids)
    for bad in (int(low), int(high)):
        if not 0 <= bad < vocab_size:
            where = tuple(int(i) for i in (ids == bad).nonzero()[0])
            hint = (
                "; -100 marks ignored positions for cross-entropy: replace them and mask the result"
                if bad == -100
                else ""
            )
            raise ValueError(
                f"{name} contains token id {bad} at position {where}, outside the vocabulary of "
                f"size {vocab_size} (valid ids are 0..{vocab_size - 1}){hint}"
            )


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")


def _positions_per_block(logits: torch.Tensor, chunk_size: int | None) -> int:
    """``chunk_size`` if given, else the device's default (see the module docstring)."""
    if chunk_size is not None:
        return chunk_size
    if logits.device.type == "cpu":
        return max(1, CPU_BLOCK_ELEMENTS // max(1, logits.shape[-1]))
    return DEFAULT_CHUNK_SIZE


def _blocks(batch: int, length: int, chunk_size: int) -> Iterator[tuple[slice, slice]]:
    """Cover a (batch, length) grid with blocks of at most ``chunk_size`` positions.

    Blocks are (rows, time-span) slices, so ``logits[rows, span]`` is a view even when the
    logits are a non-contiguous slice: no (B, T, V) copy is ever made.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    span = max(1, min(length, chunk_size))
    rows = max(1, chunk_size // span)
    for b0 in range(0, batch, rows):
        for t0 in range(0, length, span):
            # Explicit ends: the logits may be longer than the labels (shifted_logprobs).
            yield slice(b0, min(b0 + rows, batch)), slice(t0, min(t0 + span, length))


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """log p(label) = log_softmax(logits)[label], block by block in forward and backward.

    ``labels`` (B, L) with L <= T score the first L positions of ``logits`` (B, T, V); the
    gradient of the remaining positions is zero. Backward uses d/dx = onehot(label) - softmax(x).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int) -> torch.Tensor:
        batch, length = labels.shape
        acc = _accumulation_dtype(logits.dtype)
        out = logits.new_empty((batch, length), dtype=acc)  # (B, L)
        for rows, span in _blocks(batch, length, chunk_size):
            logp = torch.log_softmax(logits[rows, span], dim=-1, dtype=acc)  # (b, t, V)
            out[rows, span] = logp.gather(-1, labels[rows, span].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(logits, labels)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels = ctx.saved_tensors
        batch, length = labels.shape
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)  # (B, T, V)
        grad[:, length:].zero_()  # positions no label scores
        for rows, span in _blocks(batch, length, ctx.chunk_size):
            grad[rows, span] = _block_grad(
                logits[rows, span], labels[rows, span], grad_out[rows, span]
            )
        return grad, None, None


def _block_grad(block: torch.Tensor, labels: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """d log p(label) / d logits = onehot(label) - softmax, times ``grad_out``: (b, t, V)."""
    g = grad_out.unsqueeze(-1)  # (b, t, 1)
    grad = torch.softmax(block, dim=-1, dtype=g.dtype).mul_(-g)
    return grad.scatter_add_(-1, labels.unsqueeze(-1), g)


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """log softmax(logits)[label] per position, for labels already aligned with the logits.

    Equal to ``logits.log_softmax(-1).gather(-1, labels[..., None])[..., 0]`` (gradients
    included) without allocating a second (B, T, V) tensor.

    Args:
        logits: (B, T, V) unnormalised scores.
        labels: (B, T) integer ids in [0, V).
        chunk_size: (B, T) positions per block; None for the device's default.

    Returns:
        (B, T) log-probabilities, float32 (float64 for float64 logits).
    """
    _check_logits(logits)
    check_token_ids(labels, logits.shape[-1], "labels", logits=logits)
    return _ChunkedTokenLogprobs.apply(logits, labels, _positions_per_block(logits, chunk_size))


def shifted_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """log p(input_ids[:, t + 1] | input_ids[:, :t + 1]), read from ``logits[:, t]``.

    Args:
        logits: (B, T, V) the model's output for ``input_ids``.
        input_ids: (B, T) the ids that were fed to the model.

    Returns:
        (B, T - 1) log-probabilities of tokens 1..T-1; token 0 has no prediction.
    """
    _check_logits(logits)
    check_token_ids(input_ids, logits.shape[-1], "input_ids", logits=logits)
    # Pass the full logits and let the labels cover positions 0..T-2: slicing logits[:, :-1]
    # here would make autograd allocate another (B, T, V) gradient to undo the slice.
    positions = _positions_per_block(logits, chunk_size)
    return _ChunkedTokenLogprobs.apply(logits, input_ids[:, 1:], positions)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy H = -sum_v p_v log p_v of softmax(logits) per position, chunked.

    Block by block from torch's fused ``log_softmax``, like the log-probs.
    Logits of -inf (tokens removed by top-k / top-p filtering) contribute 0, not NaN.

    Args:
        logits: (B, T, V).

    Returns:
        (B, T) entropies in nats, differentiable, float32 (float64 for float64 logits).
    """
    _check_logits(logits)
    batch, length, _ = logits.shape
    acc = _accumulation_dtype(logits.dtype)
    if batch == 0 or length == 0:
        return logits.new_zeros((batch, length), dtype=acc)
    parts: dict[int, list[torch.Tensor]] = {}  # row-block start -> its (b, t) entropies
    for rows, span in _blocks(batch, length, _positions_per_block(logits, chunk_size)):
        parts.setdefault(rows.start, []).append(_block_entropy(logits[rows, span], acc))
    # torch.cat keeps autograd simple: an entropy bonus needs gradients.
    return torch.cat([torch.cat(row_parts, dim=1) for row_parts in parts.values()], dim=0)


def _block_entropy(block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    logp = torch.log_softmax(block, dim=-1, dtype=dtype)  # (b, t, V)
    # A filtered token has p = 0 and log p = -inf, and 0 * -inf is NaN: clamp log p to the
    # most negative finite float first (0 * that = 0, and clamp's gradient there is 0). One
    # pass instead of isfinite + where: faster, same result (timings: docs/results/ppo.md,
    # "Table GELU and blocked log-softmax").
    return -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(dim=-1)


def log_perplexity(
    logits: torch.Tensor, input_ids: torch.Tensor, target_mask: torch.Tensor
) -> torch.Tensor:
    """Mean negative log-likelihood of the tokens of ``input_ids`` marked by ``target_mask``.

    Args:
        logits: (B, T, V) the model's output for ``input_ids`` (not shifted by the caller).
        input_ids: (B, T) integer ids that were fed to the model.
        target_mask: (B, T) nonzero for the tokens to score (the response tokens). Token 0
            has no prediction, so it may not be a target.

    Returns:
        (B,) log perplexity per row; ``exp`` of it is the perplexity.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")
    check_token_ids(input_ids, logits.shape[-1], "input_ids", logits=logits)
    if target_mask.shape != input_ids.shape:
        raise ValueError(
            f"target_mask has shape {tuple(target_mask.shape)}, input_ids {tuple(input_ids.shape)}"
            ": they must match"
        )
    if bool((target_mask[:, 0] != 0).any()):
        raise ValueError("target_mask marks token 0, which no logit predicts (it needs a context)")
    empty = ((target_mask != 0).sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"rows {empty} have no target token to score")
    logprobs = shifted_logprobs(logits, input_ids)  # (B, T - 1), logits[:, t] -> ids[:, t + 1]
    return -masked_mean(logprobs, target_mask[:, 1:], dim=1)  # (B,)
