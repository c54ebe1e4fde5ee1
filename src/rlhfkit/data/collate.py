"""Batches: `pad` (the one place that pads) and the DataLoader collators built on it.

Prompts are left-padded into `query` (B, Tq); SFT and preference rows are right-padded, with
labels -100 on prompt and padding. `PairCollator` lays rankings out rank-major and
`ranked_scores` turns its row scores back into best-first (N, K).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.data.encode import IGNORE_INDEX, PreferenceExample, SFTExample


def pad(
    seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad integer sequences to (B, T) long ids and a (B, T) long mask (1 = real token).

    The one place that pads. It never truncates: that happens at tokenisation.
    """
    if side not in ("right", "left"):
        raise ValueError(f"side={side!r}: expected 'right' or 'left'")
    if not seqs:
        raise ValueError("pad needs at least one sequence")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros_like(ids)  # (B, T)
    for row, seq in enumerate(seqs):
        if len(seq) == 0:
            continue
        values = torch.as_tensor(seq)
        if values.dim() != 1 or values.is_floating_point() or values.dtype == torch.bool:
            raise ValueError(f"pad: sequence {row} must be 1-D integer ids, got {values.dtype}")
        cols = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[row, cols] = values
        mask[row, cols] = 1
    return ids, mask


@dataclass(frozen=True)
class PromptCollator:
    """Prompt id lists -> left-padded `query` (B, Tq) and `query_mask` (B, Tq)."""

    pad_id: int

    def __call__(self, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        query, query_mask = pad(prompts, self.pad_id, side="left")  # (B, Tq)
        return {"query": query, "query_mask": query_mask}


@dataclass(frozen=True)
class SFTCollator:
    """`SFTExample`s -> right-padded `input_ids`, `attention_mask`, `labels` (-100 on pad)."""

    pad_id: int

    def __call__(self, examples: Sequence[SFTExample]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = pad([e.input_ids for e in examples], self.pad_id)  # (B, T)
        labels, _ = pad([e.labels for e in examples], IGNORE_INDEX)  # (B, T)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@dataclass(frozen=True)
class PairCollator:
    """`PreferenceExample`s (N of them) -> one right-padded batch of R prompt+response rows.

    Rows are rank-major: the N best responses, then the N second-best, and so on (for pairs:
    rows [0, N) chosen, [N, 2N) rejected, R = 2N). `group` (R,) and `rank` (R,) say which
    example and place each row is; `ranked_scores` turns row scores into (N, K) for the
    K-way ranking loss. `labels` are -100 on prompt and padding (DPO's response log-probs).
    A batch with grouped comparisons (`PreferenceExample.pairs`) also holds `pairs` (P, 3):
    (example, better place, worse place) of every pair of its examples.
    """

    pad_id: int

    def __call__(self, examples: Sequence[PreferenceExample]) -> dict[str, Any]:
        rows, group, rank = [], [], []
        for k in range(max(len(e.response_ids) for e in examples)):
            for g, e in enumerate(examples):
                if k < len(e.response_ids):
                    rows.append((e.prompt_ids, e.response_ids[k]))
                    group.append(g)
                    rank.append(k)
        input_ids, attention_mask = pad([[*p, *r] for p, r in rows], self.pad_id)  # (R, T)
        labels, _ = pad([[IGNORE_INDEX] * len(p) + r for p, r in rows], IGNORE_INDEX)  # (R, T)
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "group": torch.tensor(group, dtype=torch.long),  # (R,)
            "rank": torch.tensor(rank, dtype=torch.long),  # (R,)
            "pair_count": len(examples),
        }
        if any(e.pairs is not None for e in examples):
            pairs = [(g, *pair) for g, e in enumerate(examples) for pair in e.preferences()]
            batch["pairs"] = torch.tensor(pairs, dtype=torch.long).view(-1, 3)  # (P, 3)
        return batch


def ranked_scores(
    scores: torch.Tensor, group: torch.Tensor, rank: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row scores (R,) of a `PairCollator` batch -> best-first (N, K) scores and valid mask."""
    shape = (int(group.max()) + 1, int(rank.max()) + 1)
    table = scores.new_zeros(shape)  # (N, K)
    valid = torch.zeros(shape, dtype=torch.bool, device=scores.device)  # (N, K)
    table[group, rank] = scores
    valid[group, rank] = True
    return table, valid
