"""Combining a reward-model ensemble's scores (rlhfkit.ops.ensembles)."""

import pytest
import torch

from rlhfkit.ops import ENSEMBLE_RULES, combine_scores


def test_rules_on_a_hand_example():
    # three members, two responses: response 0 (1, 2, 6), response 1 (0, 0, 3)
    # mean: 3 and 1; min: 1 and 0
    # population variance: ((-2)^2 + (-1)^2 + 3^2) / 3 = 14/3 and (1 + 1 + 4) / 3 = 2
    scores = torch.tensor([[1.0, 0.0], [2.0, 0.0], [6.0, 3.0]])
    torch.testing.assert_close(combine_scores(scores, "mean"), torch.tensor([3.0, 1.0]))
    torch.testing.assert_close(combine_scores(scores, "min"), torch.tensor([1.0, 0.0]))
    uwo = combine_scores(scores, "mean_minus_var", coef=0.5)
    torch.testing.assert_close(uwo, torch.tensor([3.0 - 7.0 / 3.0, 0.0]))


def test_rules_against_the_plain_loop():
    torch.manual_seed(0)
    scores = torch.randn(4, 7, dtype=torch.float64)
    for rule in ENSEMBLE_RULES:
        expected = []
        for column in scores.T.tolist():
            mean = sum(column) / len(column)
            variance = sum((x - mean) ** 2 for x in column) / len(column)
            expected.append(
                {"mean": mean, "min": min(column), "mean_minus_var": mean - 2.0 * variance}[rule]
            )
        got = combine_scores(scores, rule, coef=2.0)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_one_member_is_itself_and_agreeing_members_are_not_penalised():
    scores = torch.tensor([[0.5, -1.0, 2.0]])
    for rule in ENSEMBLE_RULES:
        torch.testing.assert_close(combine_scores(scores, rule), scores[0])
    torch.testing.assert_close(
        combine_scores(scores.repeat(3, 1), "mean_minus_var", coef=10.0), scores[0]
    )


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="allowed mean, min, mean_minus_var"):
        combine_scores(torch.zeros(2, 3), "median")
    with pytest.raises(ValueError, match=r"expected \(M >= 1, B\)"):
        combine_scores(torch.zeros(3), "mean")
