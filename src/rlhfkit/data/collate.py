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

from rlhfkit.data.encode import IGNORE_INDEX, PreferenceExample, PromptExample, SFTExample
from rlhfkit.data.records import Prompt


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
class PromptColumns:
    """What the data says of each row of a batch beside its ids: the prompt as written (text
    or chat messages) and the row's other columns, each a list aligned with the rows (None
    where a row lacks the column). Reward functions called TRL's way receive both."""

    prompts: list[Prompt]
    columns: dict[str, list[Any]]

    @classmethod
    def of(cls, examples: Sequence[PromptExample]) -> PromptColumns:
        names = dict.fromkeys(key for e in examples for key in e.record.columns)
        columns = {name: [e.record.columns.get(name) for e in examples] for name in names}
        return cls([e.record.prompt for e in examples], columns)

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, rows: Sequence[int]) -> PromptColumns:
        """These rows, in this order (a row may come more than once: a group's samples)."""
        columns = {name: [values[i] for i in rows] for name, values in self.columns.items()}
        return PromptColumns([self.prompts[i] for i in rows], columns)

    def repeat(self, k: int) -> PromptColumns:
        """Each row ``k`` times in a row, as ``repeat_interleave`` lays out a group's samples."""
        return self.select([i for i in range(len(self)) for _ in range(k)])

    @classmethod
    def concat(cls, parts: Sequence[PromptColumns]) -> PromptColumns:
        """The rows of ``parts`` one after another (None where a part lacks a column)."""
        names = dict.fromkeys(name for part in parts for name in part.columns)
        columns = {
            name: [v for part in parts for v in part.columns.get(name, [None] * len(part))]
            for name in names
        }
        return cls([prompt for part in parts for prompt in part.prompts], columns)


@dataclass(frozen=True)
class PromptCollator:
    """Prompt id lists -> left-padded `query` (B, Tq) and `query_mask` (B, Tq); from
    `PromptExample`s also `prompt_columns` (`PromptColumns`)."""

    pad_id: int

    def __call__(self, prompts: Sequence[Sequence[int] | PromptExample]) -> dict[str, Any]:
        examples = [p for p in prompts if isinstance(p, PromptExample)]
        ids = [p.ids if isinstance(p, PromptExample) else p for p in prompts]
        query, query_mask = pad(ids, self.pad_id, side="left")  # (B, Tq)
        batch: dict[str, Any] = {"query": query, "query_mask": query_mask}
        if examples:
            if len(examples) != len(prompts):
                raise ValueError("PromptCollator: a batch mixes PromptExamples and id lists")
            batch["prompt_columns"] = PromptColumns.of(examples)
        return batch


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
