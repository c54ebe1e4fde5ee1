"""Masked reductions, whitening and the padding helpers every trainer shares.

Masks follow one convention: a tensor of the same shape as the data, ``torch.long`` or
``bool``, nonzero = real token. Padded positions never influence a result, whatever they
hold (even NaN or inf), because reductions select with ``torch.where`` rather than multiply.

Sources: ``masked_mean`` / ``masked_var`` / ``masked_whiten`` follow lm-human-preferences
(``whiten``) and TRL (``trl.core`` / ``trl.trainer.utils``), as catalogued in Huang et al.
2022, "The N Implementation Details of RLHF with PPO". Departures: the variance uses Bessel's
correction like TRL (lm-human-preferences' ``tf.nn.moments`` is biased; the two differ by
n / (n - 1)), and whitened padded positions are set to 0 instead of holding garbage.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _check_same_shape(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if x.shape != mask.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match x shape {tuple(x.shape)}")
    return mask != 0


Reduce = Callable[[torch.Tensor], torch.Tensor]


def _local(total: torch.Tensor) -> torch.Tensor:
    """The reduction of a batch held by one process: nothing to add."""
    return total


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over real positions: a scalar for ``dim=None``, else reduced along ``dim``."""
    real = _check_same_shape(x, mask)
    kept = torch.where(real, x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over real positions (all of them for ``dim=None``, per slice otherwise).

    A reduction with no real position returns 0 rather than NaN, so an all-padding row
    contributes no gradient instead of poisoning the step.
    """
    real = _check_same_shape(x, mask)
    count = real.sum() if dim is None else real.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(
    x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True, reduce: Reduce | None = None
) -> torch.Tensor:
    """Variance of ``x`` over all real positions (a scalar).

    ``unbiased=True`` applies Bessel's correction n / (n - 1) as TRL's ``masked_var`` does.
    ``reduce``, when given, sums a tensor over the processes that hold the other rows of the
    batch (data parallel), so that the variance is the whole batch's.

    Raises:
        ValueError: fewer than 2 real positions (1 with ``unbiased=False``).
    """
    reduce = reduce or _local
    real = _check_same_shape(x, mask)
    total = reduce(real.sum())
    count = int(total)
    needed = 2 if unbiased else 1
    if count < needed:
        raise ValueError(
            f"masked_var needs at least {needed} real positions (unbiased={unbiased}), got {count}"
        )
    centred = x - reduce(masked_sum(x, mask)) / total.clamp(min=1)
    variance = reduce(masked_sum(centred**2, mask)) / total.clamp(min=1)
    return variance * count / (count - 1) if unbiased else variance


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce: Reduce | None = None,
) -> torch.Tensor:
    """Normalise real positions to unit variance (and zero mean if ``shift_mean``).

    ``shift_mean=False`` keeps the mean, as lm-human-preferences does when whitening rewards
    (shifting the rewards' mean would change the incentive to end episodes early or late).
    Padded positions of the result are 0. ``reduce``: as in ``masked_var``, for statistics
    over the whole batch of a data-parallel run.
    """
    reduce = reduce or _local
    real = _check_same_shape(x, mask)
    mean = reduce(masked_sum(x, mask)) / reduce(real.sum()).clamp(min=1)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask, reduce=reduce) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(real, whitened, torch.zeros_like(whitened))


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real position of each row of a (B, T) mask, as (B,) long.

    Works for right padding (``1 1 1 0 0`` -> 2) and left padding (``0 0 1 1 1`` -> 4).
    An all-zero row returns 0, so gathering with it stays in bounds; callers that may see
    empty rows must mask them out themselves.
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    return torch.where(mask != 0, positions, 0).amax(dim=-1)


def truncate_after_eos(
    tokens: torch.Tensor, eos_id: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut each row of (B, T) ``tokens`` after its first EOS.

    Returns ``(tokens, mask)``: tokens after the first EOS become ``pad_id``; ``mask`` (B, T)
    long is 1 up to and including that EOS. Rows without an EOS keep all their tokens; pad
    tokens already in a row are masked (0) in every case. ``pad_id`` must differ from ``eos_id``.
    """
    if eos_id == pad_id:
        raise ValueError(f"eos_id and pad_id must differ, both are {eos_id}")
    is_eos = (tokens == eos_id).long()
    # EOS count strictly before each position: > 0 means an earlier EOS ended the row.
    after_eos = (is_eos.cumsum(dim=-1) - is_eos) > 0
    truncated = torch.where(after_eos, torch.full_like(tokens, pad_id), tokens)
    mask = (~after_eos & (tokens != pad_id)).long()
    return truncated, mask


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, T) counting real tokens only: ``(mask.cumsum(-1) - 1).clamp(min=0)``.

    With left padding the first real token gets position 0, as it would without padding;
    padded positions get 0 (they are masked out of attention anyway).
    """
    return ((mask != 0).long().cumsum(dim=-1) - 1).clamp(min=0)


def additive_mask(visible: torch.Tensor) -> torch.Tensor:
    """A boolean attention mask (True = may attend) as the float mask eager attention kernels
    add to their scores: 0 where visible, the most negative float32 elsewhere."""
    return torch.zeros(visible.shape, device=visible.device).masked_fill(
        ~visible, torch.finfo(torch.float32).min
    )
