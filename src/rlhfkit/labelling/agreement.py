"""Agreement between labellers: raw agreement and Cohen's kappa on the pairs of responses.

Every vote is read as judgments on pairs of responses, the same pairs the reward model is
trained on (InstructGPT's K-choose-2 comparisons): for responses i < j of a task, the label
is "i" (i is better), "j" (j is better) or "tie". A pair vote (K = 2) is one judgment; a
ranking of K > 2 responses gives all K(K-1)/2 of them, as induced by its order; a tie vote
(all equally good) and a "bad" vote (all equally bad) give "tie" on every pair (neither
prefers a response); a skip gives nothing. InstructGPT reports agreement between its
labellers as such a share (Ouyang et al. 2022: 72.6% between training labellers).

For two labellers, over the pairs they both judged:

- raw agreement: the share of pairs given the same label;
- Cohen's kappa (Cohen 1960): (p_o - p_e) / (1 - p_e), with p_o the raw agreement and p_e the
  agreement expected by chance from each labeller's own label frequencies,
  p_e = sum over labels c of p_a(c) * p_b(c). It is undefined (None) when p_e = 1, i.e. both
  labellers gave one and the same label to every pair.

Overall: the raw agreement over every pair of votes on the same response pair, and the mean
of the labeller pairs' kappas weighted by the number of response pairs each compared (pairs
of labellers whose kappa is undefined are left out of that mean). Cohen's kappa is defined
for two raters, so the overall figure is a weighted mean of two-rater kappas rather than a
many-rater statistic such as Fleiss' kappa.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from rlhfkit.labelling.store import Vote

Item = tuple[int, int, int]  # (task id, response i, response j) with i < j


def pair_labels(vote: Vote) -> dict[tuple[int, int], str]:
    """The judgments a vote makes on each response pair (i, j), i < j: "i", "j" or "tie"."""
    if vote.choice == "skip":
        return {}
    if vote.choice in ("tie", "bad"):  # all equally good, or all equally bad: no preference
        return {pair: "tie" for pair in combinations(range(vote.k), 2)}
    position = {response: rank for rank, response in enumerate(vote.ranking or [])}
    return {
        (i, j): "i" if position[i] < position[j] else "j" for i, j in combinations(range(vote.k), 2)
    }


def raw_agreement(a: Sequence[str], b: Sequence[str]) -> float:
    """Share of items that two labellers gave the same label (the items in the same order)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need two equally long, non-empty label lists, got {len(a)}, {len(b)}")
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Cohen's kappa of two labellers' labels on the same items; None where p_e = 1."""
    observed = raw_agreement(a, b)
    count_a, count_b = Counter(a), Counter(b)
    expected = sum(count_a[c] * count_b[c] for c in count_a) / len(a) ** 2
    if expected == 1:
        return None
    return (observed - expected) / (1 - expected)


@dataclass(frozen=True)
class PairAgreement:
    """Agreement of two labellers on the response pairs they both judged."""

    labellers: tuple[str, str]
    items: int
    agreement: float
    kappa: float | None


@dataclass(frozen=True)
class Agreement:
    """Agreement over the tasks that two or more labellers judged (see the module docstring)."""

    tasks: int = 0
    """Tasks judged (not skipped) by two or more labellers."""
    items: int = 0
    """Pairs of judgments compared: one per response pair and pair of labellers."""
    agreement: float | None = None
    kappa: float | None = None
    pairs: list[PairAgreement] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "tasks": self.tasks,
            "items": self.items,
            "agreement": self.agreement,
            "kappa": self.kappa,
            "pairs": [
                {
                    "labellers": list(p.labellers),
                    "items": p.items,
                    "agreement": p.agreement,
                    "kappa": p.kappa,
                }
                for p in self.pairs
            ],
        }


def agreement(votes: Iterable[Vote]) -> Agreement:
    """Raw agreement and Cohen's kappa of all labellers, and of each pair of labellers."""
    labels: dict[str, dict[Item, str]] = defaultdict(dict)
    judged_by: dict[int, set[str]] = defaultdict(set)
    for vote in votes:
        for (i, j), label in pair_labels(vote).items():
            labels[vote.labeller][(vote.task_id, i, j)] = label
            judged_by[vote.task_id].add(vote.labeller)
    pairs = []
    for a, b in combinations(sorted(labels), 2):
        shared = sorted(labels[a].keys() & labels[b].keys())
        if shared:
            la, lb = [labels[a][x] for x in shared], [labels[b][x] for x in shared]
            pairs.append(
                PairAgreement((a, b), len(shared), raw_agreement(la, lb), cohen_kappa(la, lb))
            )
    if not pairs:
        return Agreement()
    items = sum(p.items for p in pairs)
    with_kappa = [p for p in pairs if p.kappa is not None]
    kappa_items = sum(p.items for p in with_kappa)
    return Agreement(
        tasks=sum(len(names) >= 2 for names in judged_by.values()),
        items=items,
        agreement=sum(p.agreement * p.items for p in pairs) / items,
        kappa=sum(p.kappa * p.items for p in with_kappa) / kappa_items if with_kappa else None,
        pairs=pairs,
    )
