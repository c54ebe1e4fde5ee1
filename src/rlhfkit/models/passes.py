"""The passes of a policy, its critic and its reference over query + response side by side:
the model inputs, the log-probs and logits of the response tokens, the critic's values; and
the log-probs of the labelled tokens of whole sequences (SFT, PPO-ptx, DPO).

``response_logprobs`` and ``labelled_logprobs`` are the only places where a model's log-probs
are read, so every stage reads the same positions the same way.

Values: the critic's value V(s_t) for response token t is read at the position that predicts
it (the last query token for t = 0), as in TRL: ``values[:, Tq - 1 : -1]``.

Packed (``sequence_inputs(..., packed=True)``, ``packing.py``): the models see only the real
tokens of query + response, and the logits and values are read back at the same positions
of the padded layout, so every caller gets the same (B, Tr) tensors either way. Labelled
sequences of a packed model are packed too (``labelled_logprobs``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlhfkit.data import IGNORE_INDEX
from rlhfkit.ops.logprobs import shifted_logprobs, token_logprobs
from rlhfkit.ops.masks import position_ids_from_mask
from rlhfkit.runtime.packing import PackedRows, packing_enabled


class ValueHeadLM(nn.Module):
    """A causal LM with a scalar value head on its last hidden state (shared trunk).

    The alternative to a separate critic: lm-human-preferences' and TRL's
    ``AutoModelForCausalLMWithValueHead``. One forward gives the logits and the values.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.value_head = nn.Linear(lm.config.hidden_size, 1)
        # Zero init: values start at 0, so the first updates do not throw the shared trunk off.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.lm.config

    def get_input_embeddings(self) -> nn.Module:
        return self.lm.get_input_embeddings()

    def forward(self, input_ids, attention_mask, position_ids, logits_to_keep=0, **kwargs):
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        hidden = out.hidden_states[-1]  # (B, T, H), after the final layer norm
        values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)  # (B, T)
        return out.logits, values


def unwrapped(model: nn.Module) -> nn.Module:
    """The module inside a data-parallel wrapper (DDP), which forwards calls to it but hides
    its type and attributes; ``model`` itself otherwise."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def causal_lm(policy: nn.Module) -> nn.Module:
    """The language model inside ``policy`` (itself unless it is a ``ValueHeadLM``)."""
    return policy.lm if isinstance(policy, ValueHeadLM) else policy


def sequence_inputs(
    query: torch.Tensor,
    query_mask: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
    packed: bool = False,
) -> dict:
    """Model inputs for query + response side by side, positions from the mask; with
    ``packed`` their real tokens only (``packing.PackedRows.inputs``: the models must have
    ``packing.enable_packing``)."""
    input_ids = torch.cat([query, response], dim=1)  # (B, Tq + Tr)
    attention_mask = torch.cat([query_mask, response_mask], dim=1).long()  # (B, Tq + Tr)
    if packed:
        return PackedRows.from_mask(attention_mask).inputs(input_ids)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
    }


def _predicting(inputs: dict, response_len: int) -> torch.Tensor:
    """The columns (Tr,) of query + response whose outputs predict the response tokens: from
    the last query token on, the last response token excluded."""
    rows = inputs.get("packed_rows")
    length = inputs["input_ids"].shape[1] if rows is None else rows.index.shape[1]
    device = inputs["input_ids"].device
    return torch.arange(length - response_len - 1, length - 1, device=device)


def _read(outputs: torch.Tensor, inputs: dict, columns: torch.Tensor) -> torch.Tensor:
    """Per-position ``outputs`` (B, T, ...), or (1, N, ...) packed, at ``columns``: (B, K, ...)."""
    rows = inputs.get("packed_rows")
    return outputs[:, columns] if rows is None else rows.read(outputs, columns)


def response_logits(
    model: nn.Module, inputs: dict, response_len: int, temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits over the response tokens (B, Tr, V), divided by ``temperature``, and the values
    (B, Tr) when ``model`` is a ``ValueHeadLM`` (else None).

    Only the ``Tr`` positions that predict response tokens go through the LM head:
    ``logits_to_keep`` as positions, not a slice of the logits, whose backward would fill a
    (B, Tr + 1, V) buffer.
    """
    columns = _predicting(inputs, response_len)
    rows = inputs.get("packed_rows")
    keep = columns if rows is None else rows.keep(columns)
    if isinstance(unwrapped(model), ValueHeadLM):
        logits, values = model(**inputs, logits_to_keep=keep)
        values = _read(values, inputs, columns)  # (B, Tr)
    else:
        logits = model(**inputs, use_cache=False, logits_to_keep=keep).logits
        values = None
    if rows is not None:
        logits = logits.view(rows.batch_size, response_len, -1)  # (B, Tr, V)
    if temperature != 1.0:
        logits = logits / temperature
    return logits, values


def critic_values(critic: nn.Module, inputs: dict, response_len: int) -> torch.Tensor:
    """Values (B, Tr) of a separate critic (``models.ValueModel``) for each response token."""
    if "packed_rows" in inputs:
        values = critic(**inputs)  # (1, L)
    else:
        values = critic(inputs["input_ids"], inputs["attention_mask"])  # (B, Tq + Tr)
    return _read(values, inputs, _predicting(inputs, response_len)).float()


class ResponsePass(NamedTuple):
    """A model's pass over query + response, read at the response tokens."""

    logprobs: torch.Tensor  # (B, Tr) log pi(response token | everything before it)
    logits: torch.Tensor  # (B, Tr, V) the logits they come from, divided by the temperature
    values: torch.Tensor | None  # (B, Tr) the values of a ``ValueHeadLM``, else None


def response_logprobs(
    model: nn.Module, inputs: dict, response: torch.Tensor, temperature: float = 1.0
) -> ResponsePass:
    """Log-probs of the ``response`` tokens (B, Tr) under ``model``, given the query before
    them: the one function every stage uses for them on query + response (``sequence_inputs``
    builds ``inputs``). PPO's rollout and update, GRPO, evaluation's KL and perplexity call it;
    labelled sequences (SFT, PPO-ptx, DPO) go through ``labelled_logprobs``, which reads the
    same log-softmax at the positions their labels mark."""
    logits, values = response_logits(model, inputs, response.shape[1], temperature)
    return ResponsePass(token_logprobs(logits, response), logits, values)


def labelled_tokens(batch: dict) -> torch.Tensor:
    """How many tokens ``labelled_logprobs`` scores in ``batch`` (a 0-d tensor): the labelled
    ones after the first position, which nothing predicts."""
    return (batch["labels"][:, 1:] != IGNORE_INDEX).sum()


def labelled_logprobs(
    model: nn.Module, batch: dict, trim: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the labelled tokens of whole sequences (prompt and response in one row,
    ``labels`` -100 where nothing is scored): ``logprobs`` (B, K) of token t + 1 given tokens
    up to t, and ``mask`` (B, K), true where that token is labelled.

    With ``trim`` only the positions from the batch's first labelled token on go through the
    LM head (``logits_to_keep``): the prompt tokens before it predict nothing that is scored.
    SFT reads every position (``trim=False``, K = T - 1): trimming would change the order of
    its loss's sum, hence its last bits, and the published demo figures with them.

    A packed model (``packing.enable_packing``: the stages' ``padding_free``) runs on the real
    tokens alone and its LM head only at the positions that predict a labelled token; the
    log-probs come back as (B, T - 1), 0 where nothing is scored, whatever ``trim`` says.
    """
    if packing_enabled(model):
        return _packed_labelled_logprobs(model, batch)
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]  # (B, T)
    scored = batch["labels"] != IGNORE_INDEX  # (B, T)
    width = input_ids.shape[1]
    first = int(scored.any(0).nonzero()[0]) if trim and scored.any() else 0
    keep = width - max(first - 1, 0)  # logits at t predict token t + 1
    logits = causal_lm(model)(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=keep,
    ).logits  # (B, keep, V)
    logprobs = shifted_logprobs(logits, input_ids[:, width - keep :])  # (B, keep - 1)
    return logprobs, scored[:, width - keep + 1 :]


def _packed_labelled_logprobs(model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``labelled_logprobs`` of a packed model: (B, T - 1) log-probs and mask."""
    input_ids = batch["input_ids"]  # (B, T)
    scored = batch["labels"][:, 1:] != IGNORE_INDEX  # (B, T - 1): token t + 1 is labelled
    rows = PackedRows.from_mask(batch["attention_mask"])
    predicting = rows.index[:, :-1][scored]  # (M,) packed positions, row by row
    logits = causal_lm(model)(
        **rows.inputs(input_ids), use_cache=False, logits_to_keep=predicting
    ).logits  # (1, M, V)
    picked = token_logprobs(logits, input_ids[:, 1:][scored][None])[0]  # (M,)
    logprobs = picked.new_zeros(scored.shape).masked_scatter(scored, picked)  # (B, T - 1)
    return logprobs, scored
