"""Perplexity of a response under a causal LM, and the reward built from it.

For a prompt x and a response y = y_1 .. y_N (its EOS included when one was emitted)::

    log perplexity(y | x) = -(1/N) * sum_t log p(y_t | x, y_<t)
    reward               = -log perplexity = mean log-prob of the response tokens (<= 0)

Only response tokens are scored (the prompt is context, not output), and each token's
log-prob is read from the logits one position earlier: the logits at position t predict the
token at t + 1 (``ops.logprobs.shifted_logprobs``; from logits alone: ``ops.logprobs.log_perplexity``). The reward is on the log scale because
perplexity itself is unbounded (exp of a mean NLL) and a few rare tokens would dominate a batch.

This is where the user's environment crashed with ``IndexError: Target 24844 is out of
bounds``: ids were floats, the labels were not shifted against the logits, and the lengths did
not match. Here every entry point checks, before any model or loss sees them, that ids are
integers inside the vocabulary and that shapes agree, and raises a ``ValueError`` that names the
tensor, the position and what was expected (``ops.logprobs.check_token_ids``).

Padding: queries and responses may arrive padded on either side. Rows are re-laid out in the
library's convention (query left-padded, response right-padded, ``data.pad``) so that the last
real query token is always the one that predicts the first response token, and positions come
from the attention mask; the value of a row therefore does not depend on its padding.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit.data import pad
from rlhfkit.experience.scorers import ScoreInput, Scorer
from rlhfkit.models.passes import response_logprobs, sequence_inputs
from rlhfkit.ops.logprobs import check_token_ids
from rlhfkit.ops.masks import masked_mean


def _check_pair(ids: torch.Tensor, mask: torch.Tensor, name: str, vocab_size: int) -> None:
    if ids.dim() != 2 or ids.shape != mask.shape:
        raise ValueError(
            f"{name} must be (B, T) with a {name}_mask of the same shape, got {tuple(ids.shape)}"
            f" and {tuple(mask.shape)}"
        )
    # Only real tokens must be valid ids: padded positions may hold anything (-100, say).
    zeros = torch.zeros((), dtype=ids.dtype, device=ids.device)
    check_token_ids(torch.where(mask != 0, ids, zeros), vocab_size, name)


def _relayout(ids: torch.Tensor, mask: torch.Tensor, side: str) -> tuple[torch.Tensor, ...]:
    """Keep each row's real tokens and pad them on ``side`` (any id would do as pad: masked)."""
    rows = [row[m != 0].tolist() for row, m in zip(ids, mask, strict=True)]
    new_ids, new_mask = pad(rows, pad_id=0, side=side)  # (B, T')
    return new_ids.to(ids.device), new_mask.to(ids.device)


def response_log_perplexity(
    model: nn.Module,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """log perplexity of each response given its query, under a causal LM.

    Args:
        model: a Hugging Face causal LM (takes ``logits_to_keep``). Its train/eval mode is
            left alone; dropout in train mode makes the value noisy.
        query: (B, Tq) prompt ids; query_mask (B, Tq) nonzero for real tokens.
        response: (B, Tr) response ids; response_mask (B, Tr) nonzero for real tokens.

    Returns:
        (B,) log perplexity, differentiable if the model is.
    """
    vocab_size = model.get_input_embeddings().num_embeddings
    _check_pair(query, query_mask, "query", vocab_size)
    _check_pair(response, response_mask, "response", vocab_size)
    if query.shape[0] != response.shape[0]:
        raise ValueError(f"query has {query.shape[0]} rows but response has {response.shape[0]}")
    no_context = ((query_mask != 0).sum(dim=1) == 0).nonzero().flatten().tolist()
    if no_context:
        raise ValueError(
            f"rows {no_context} have an empty query: the first response token needs one"
        )
    empty = ((response_mask != 0).sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"rows {empty} have no target token to score (an empty response)")
    query, query_mask = _relayout(query, query_mask, "left")  # (B, Tq')
    response, response_mask = _relayout(response, response_mask, "right")  # (B, Tr')
    inputs = sequence_inputs(query, query_mask, response, response_mask)
    logprobs = response_logprobs(model, inputs, response).logprobs  # (B, Tr')
    return -masked_mean(logprobs, response_mask, dim=1)  # (B,)


class PerplexityScorer(Scorer):
    """Score = -log perplexity of the response given the prompt, under ``model``.

    Use a frozen model (the SFT reference, say): the reward is then "how natural does the
    reference find this text". Higher is better; 0 is the maximum (every token certain).
    """

    name = "neg_log_perplexity"

    def __init__(self, model: nn.Module, name: str | None = None):
        self.model = model
        self.name = name or self.name

    def models(self) -> list[nn.Module]:
        return [self.model]

    def id_readers(self) -> list[tuple[str, nn.Module]]:
        return [(self.name, self.model)]

    @torch.no_grad()
    def score(self, batch: ScoreInput) -> torch.Tensor:
        return -response_log_perplexity(
            self.model, batch.query, batch.query_mask, batch.response, batch.response_mask
        ).float()  # (B,)
