"""A scripted labeller: the gold judge through a noisy Bradley-Terry choice.

It stands for the human of the demo (the bundled comparisons, ``scripts/make_demo_data.py``)
and for the labeller of iterated RLHF rounds (``rlhfkit pipeline`` with ``labeller:
simulated``). Between two responses a and b it prefers a with

    P(a over b) = sigmoid((gold(a) - gold(b)) / tau)          (Bradley & Terry 1952)

and ranks K responses by the Plackett-Luce model with the same tau (Plackett 1975, Luce 1959):
the best is drawn with probabilities softmax(gold / tau) over the responses left, then the next
among the rest, and so on. For K = 2 the two models agree. tau sets the noise: 0 would be the
gold order itself; ``calibrate_tau`` picks the tau at which a given share of pair labels agrees
with the gold order in expectation (InstructGPT reports 72-77% agreement between labellers).

Every draw comes from one ``random.Random`` the caller seeds, so a labelling is reproducible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlhfkit.data import Prompt

GoldFunction = Callable[[Sequence[str], Sequence[str]], list[float]]
_MAX_EXPONENT = 700.0  # exp() of more overflows a float


def _sigmoid(x: float) -> float:
    x = max(-_MAX_EXPONENT, min(_MAX_EXPONENT, x))
    return 1 / (1 + math.exp(-x))


def prefers(gold_a: float, gold_b: float, tau: float, rng: random.Random) -> bool:
    """One Bradley-Terry choice: True (a preferred) with probability
    sigmoid((gold_a - gold_b) / tau). Draws one ``rng.random()``."""
    return rng.random() < _sigmoid((gold_a - gold_b) / tau)


def plackett_luce(golds: Sequence[float], tau: float, rng: random.Random) -> list[int]:
    """A ranking (indices, best first) drawn from the Plackett-Luce model of ``golds``: the
    next best among those left with probabilities softmax(gold / tau)."""
    left, order = list(range(len(golds))), []
    top = max(golds)
    while left:
        weights = [math.exp((golds[i] - top) / tau) for i in left]
        if sum(weights) == 0:  # all left far below the overall best: rescale to their own best
            best = max(golds[i] for i in left)
            weights = [math.exp((golds[i] - best) / tau) for i in left]
        order.append(left.pop(rng.choices(range(len(left)), weights)[0]))
    return order


def calibrate_tau(diffs: Sequence[float], agreement: float) -> float:
    """tau with mean(sigmoid(|diff| / tau)) == ``agreement`` over the non-tied gold
    differences ``diffs`` of labelled pairs (bisection on a log scale)."""
    if not 0.5 < agreement < 1:
        raise ValueError(f"agreement={agreement!r}: expected a share in (0.5, 1)")
    diffs = [abs(d) for d in diffs if d != 0]
    if not diffs:
        raise ValueError("calibrate_tau: every pair is tied, no tau gives any agreement")
    lo, hi = 1e-4, 100.0
    for _ in range(100):
        tau = math.sqrt(lo * hi)
        expected = sum(1 / (1 + math.exp(-d / tau)) for d in diffs) / len(diffs)
        lo, hi = (tau, hi) if expected > agreement else (lo, tau)
    return tau


def _prompt_text(prompt: Prompt) -> str:
    """A chat prompt as the gold judge sees it: its messages' contents, one per line."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


@dataclass
class SimulatedLabeller:
    """Ranks K >= 2 responses to a prompt as a noisy person following ``gold`` would."""

    gold: GoldFunction
    """The judge it follows: ``gold(prompts, responses) -> scores`` (``rlhfkit.tasks``)."""
    tau: float
    """Noise of the choice (> 0); larger is noisier."""
    seed: int
    """Seed of its random draws."""

    def __post_init__(self) -> None:
        if not self.tau > 0:
            raise ValueError(f"SimulatedLabeller.tau={self.tau!r}: expected a number > 0")

    def label(
        self, tasks: Sequence[tuple[Prompt, list[str]]]
    ) -> list[tuple[list[int], list[float]]]:
        """(ranking best first, gold scores) of each (prompt, responses) task, in order."""
        rng = random.Random(self.seed)
        out = []
        for prompt, responses in tasks:
            golds = self.gold([_prompt_text(prompt)] * len(responses), responses)
            out.append((plackett_luce(golds, self.tau, rng), list(golds)))
        return out


def gold_agreement(rankings: Sequence[Sequence[int]], golds: Sequence[Sequence[float]]) -> float:
    """Share of the rankings' (better, worse) pairs that the gold order agrees with (pairs
    the judge ties left out); nan when every pair is tied."""
    agree = total = 0
    for order, gold in zip(rankings, golds, strict=True):
        for i, hi in enumerate(order):
            for lo in order[i + 1 :]:
                if gold[hi] != gold[lo]:
                    agree += gold[hi] > gold[lo]
                    total += 1
    return agree / total if total else math.nan
