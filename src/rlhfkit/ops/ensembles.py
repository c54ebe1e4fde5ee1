"""One score per response from the scores of a reward-model ensemble.

Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization": the members'
mean; worst-case optimisation (WCO), the lowest member's score; and uncertainty-weighted
optimisation (UWO), the mean less ``coef`` times the members' variance (their squared
deviations from the mean, divided by M). Eisenstein et al. 2023, "Helping or Herding?",
combine by mean and median as well. A policy that exploits one member's error gains little
from the mean, and loses under WCO and UWO, where the members disagree.
"""

from __future__ import annotations

import torch

ENSEMBLE_RULES = ("mean", "min", "mean_minus_var")


def combine_scores(scores: torch.Tensor, rule: str = "mean", coef: float = 1.0) -> torch.Tensor:
    """(B,) from the (M, B) scores of M reward models of one batch.

    ``rule``: "mean"; "min" (WCO); "mean_minus_var" (UWO: mean - ``coef`` * variance).
    """
    if scores.dim() != 2 or scores.shape[0] == 0:
        raise ValueError(f"scores of shape {tuple(scores.shape)}: expected (M >= 1, B)")
    if rule == "mean":
        return scores.mean(dim=0)
    if rule == "min":
        return scores.min(dim=0).values
    if rule == "mean_minus_var":
        return scores.mean(dim=0) - coef * scores.var(dim=0, unbiased=False)
    raise ValueError(f"rule={rule!r}: allowed {', '.join(ENSEMBLE_RULES)}")
